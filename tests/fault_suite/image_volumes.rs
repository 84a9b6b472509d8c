//! Image volumes (`layout: image`) in the fault suite, through the real binary on real loop
//! devices: node-server SIGKILLed at random points of CreateVolume keeps every image it
//! acknowledged whole (its size, its files, `e2fsck -fn` clean) and leaves no half-made one
//! behind; an image staged, published or attached by a neighbour is never deleted; storms of stage, publish, unpublish, unstage and delete lose no file and stack no
//! mount (the storm itself is `volumes.rs`'s, run on both layouts).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use super::processes::{self, BACK_WITHIN, Node};
use super::tally::{Outcome, Tally};
use crate::common::csi_block::image;
use crate::common::csi_node::{self, Csi, create_request, stage_request, unstage_request};
use crate::common::eventually;
use csi_nodekit::proto::csi::{CreateVolumeRequest, ListVolumesRequest};

const CYCLES: usize = 20;
/// The smallest image volume (the only size this machine's root can stage: a larger one grows
/// its filesystem, which needs CAP_SYS_RESOURCE).
pub const IMAGE_SIZE: u64 = 16 << 20;

/// CreateVolume of an image volume of [`IMAGE_SIZE`].
pub fn image_request(name: &str) -> CreateVolumeRequest {
    CreateVolumeRequest {
        parameters: [("layout".into(), "image".into())].into(),
        ..create_request(name, IMAGE_SIZE as i64)
    }
}

/// A file of an image volume's filesystem, read from outside (`debugfs`, read-only); the
/// volume must not be staged. None without the image or the file.
pub fn read_in_image(state: &Path, id: &str, file: &str) -> Option<Vec<u8>> {
    let out = std::process::Command::new("debugfs")
        .args(["-R", &format!("cat /{file}")])
        .arg(image(state, id))
        .output()
        .expect("run debugfs (e2fsprogs)");
    // debugfs exits 0 whatever fails; its errors follow its banner on stderr.
    let errors = String::from_utf8_lossy(&out.stderr);
    let failed = errors.lines().any(|l| !l.starts_with("debugfs "));
    (out.status.success() && !failed).then_some(out.stdout)
}

/// Stages the volume, writes `data` into its filesystem's `file` (synced), and unstages it.
pub async fn write_in_image(csi: &mut Csi, staging: &Path, id: &str, file: &str, data: &[u8]) {
    std::fs::create_dir_all(staging).unwrap();
    let staged = csi.node.node_stage_volume(stage_request(id, staging)).await;
    staged.unwrap_or_else(|e| panic!("stage {id}: {e}"));
    let written = std::fs::File::create(staging.join(file))
        .and_then(|mut f| std::io::Write::write_all(&mut f, data).and_then(|_| f.sync_all()));
    written.unwrap_or_else(|e| panic!("write into {id}: {e}"));
    let unstaged = csi
        .node
        .node_unstage_volume(unstage_request(id, staging))
        .await;
    unstaged.unwrap_or_else(|e| panic!("unstage {id}: {e}"));
}

async fn listed(csi: &mut Csi) -> Option<BTreeSet<String>> {
    let reply = csi.controller.list_volumes(ListVolumesRequest::default());
    let entries = reply.await.ok()?.into_inner().entries;
    Some(
        entries
            .into_iter()
            .filter_map(|e| Some(e.volume?.volume_id))
            .collect(),
    )
}

/// The volume directories under the state directory.
fn on_disk(state: &Path) -> BTreeSet<String> {
    let dirs = std::fs::read_dir(state.join("volumes"))
        .into_iter()
        .flatten();
    dirs.flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// What is wrong with an acknowledged image: its size, its file (when one was written), its
/// filesystem.
fn damage(state: &Path, id: &str, data: Option<&[u8]>) -> Option<String> {
    let file = std::fs::metadata(image(state, id)).ok();
    if file.as_ref().map(|f| f.len()) != Some(IMAGE_SIZE) {
        return Some(format!("{id}: image {file:?}"));
    }
    if let Some(data) = data
        && read_in_image(state, id, "data").as_deref() != Some(data)
    {
        return Some(format!("{id}: its file differs"));
    }
    let (code, text) = crate::common::scratch_fs::fsck(&image(state, id));
    (code != 0).then(|| format!("{id}: e2fsck -fn exit {code}: {text}"))
}

#[ignore = "needs root: real loop devices and ext4 mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_server_killed_twenty_times_mid_image_create_keeps_every_acknowledged_image_whole() {
    let node = Node::new();
    let state = node.state();
    let mut tally = Tally::new("node-server SIGKILL and restart, mid-CreateVolume of an image");
    // Acknowledged volumes: ID → what its filesystem holds (none for one created in flight).
    let mut acknowledged: BTreeMap<String, Option<Vec<u8>>> = BTreeMap::new();
    let (mut landed, mut half_made) = (0, 0);
    for cycle in 0..=CYCLES {
        let Some(process) = node.node_server().await else {
            tally.record(
                Outcome::Failed,
                format_args!("cycle {cycle}: did not come back"),
            );
            continue;
        };
        let mut csi = csi_node::connect(&node.csi()).await;
        let after_restart = listed(&mut csi).await.unwrap_or_default();
        half_made += usize::from(on_disk(&state) != after_restart);
        let missing: Vec<_> = (acknowledged.keys())
            .filter(|id| !after_restart.contains(*id))
            .collect();
        let damaged: Vec<_> = (acknowledged.iter())
            .filter_map(|(id, data)| damage(&state, id, data.as_deref()))
            .collect();
        // A half-made image is never listed, and start-up removes what it left.
        let tidy = eventually(BACK_WITHIN, || {
            (on_disk(&state) == after_restart).then_some(())
        });
        let left: Vec<_> = match tidy.await {
            Some(()) => Vec::new(),
            None => on_disk(&state)
                .difference(&after_restart)
                .cloned()
                .collect(),
        };
        match (missing.is_empty() && damaged.is_empty(), left.is_empty()) {
            (true, true) => tally.record(Outcome::Survived, ""),
            (false, _) => tally.record(
                Outcome::Lost,
                format_args!("cycle {cycle}: missing {missing:?}, damaged {damaged:?}"),
            ),
            (true, false) => tally.record(
                Outcome::Failed,
                format_args!("cycle {cycle}: half-made images left {left:?}"),
            ),
        }
        if cycle == CYCLES {
            break;
        }
        let id = csi_node::create_with(&mut csi, image_request(&format!("pvc-{cycle}"))).await;
        let data = format!("cycle {cycle}\n").repeat(1000).into_bytes();
        let staging = state.parent().unwrap().join(format!("staging-{cycle}"));
        write_in_image(&mut csi, &staging, &id, "data", &data).await;
        acknowledged.insert(id, Some(data));
        // A create in flight when the process dies: a thick 16 MiB image takes about a
        // few milliseconds to make here, so the kill comes at a point spread over 0–5 ms.
        let mut inflight = csi.clone();
        let request = image_request(&format!("pvc-{cycle}-in-flight"));
        let call = tokio::spawn(async move { inflight.controller.create_volume(request).await });
        tokio::time::sleep(Duration::from_micros(250 * cycle as u64)).await;
        processes::kill(process);
        if let Ok(Ok(reply)) = call.await {
            landed += 1;
            let id = reply.into_inner().volume.expect("volume").volume_id;
            acknowledged.insert(id, None);
        }
    }
    tally.note(format_args!(
        "{} images acknowledged ({landed} of {CYCLES} in-flight creates answered before the \
         kill); {half_made} restarts found a half-made one on disk",
        acknowledged.len()
    ));
    tally.finish();
}

#[ignore = "needs root: real loop devices, ext4 and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_volume_in_use_is_never_deleted_and_keeps_its_files() {
    let sandbox = csi_node::MountSandbox::new();
    let state = sandbox.path().join("state");
    let socket = sandbox.path().join("csi.sock");
    let _process = crate::common::spawn_node_server(&socket, &state, &[]);
    assert!(processes::probe_ready(&socket).await, "node-server");
    let mut csi = csi_node::connect(&socket).await;
    let _devices = crate::common::csi_block::DetachOnDrop(state.clone());
    let mut tally =
        Tally::new("DeleteVolume of a staged, a published and a neighbour-attached image volume");
    for attempt in 0..3 {
        for how in ["staged", "published", "attached by a neighbour"] {
            let name = format!("pvc-keep-{attempt}-{how}").replace(' ', "-");
            let id = csi_node::create_with(&mut csi, image_request(&name)).await;
            let data = format!("{id}\n").repeat(100).into_bytes();
            let staging = sandbox.dir(&format!("{name}-s"));
            write_in_image(&mut csi, &staging, &id, "data", &data).await;
            let target = sandbox.path().join(format!("{name}-t"));
            let mut neighbour = None;
            match how {
                "staged" => drop(
                    csi.node
                        .node_stage_volume(stage_request(&id, &staging))
                        .await,
                ),
                "published" => csi.stage_and_publish(&id, &staging, &target, false).await,
                _ => neighbour = Some(losetup(&image(&state, &id))),
            }
            let answer = csi
                .controller
                .delete_volume(csi_node::delete_request(&id))
                .await;
            // Undo the use, then read the file from outside.
            let _ = csi
                .node
                .node_unpublish_volume(csi_node::unpublish_request(&id, &target))
                .await;
            let _ = csi
                .node
                .node_unstage_volume(unstage_request(&id, &staging))
                .await;
            if let Some(device) = neighbour {
                let detached = std::process::Command::new("losetup")
                    .args(["-d", &device])
                    .status();
                assert!(detached.unwrap().success(), "losetup -d {device}");
            }
            let kept = read_in_image(&state, &id, "data").as_deref() == Some(&data[..]);
            let outcome = match (&answer, kept) {
                (_, false) => Outcome::Lost,
                (Err(s), true) if s.code() == tonic::Code::FailedPrecondition => Outcome::Survived,
                _ => Outcome::Failed,
            };
            tally.record(outcome, format_args!("{how}, try {attempt}: {answer:?}"));
            let deleted = csi
                .controller
                .delete_volume(csi_node::delete_request(&id))
                .await;
            tally.check(
                deleted.is_ok(),
                format_args!("{how}: once unused: {deleted:?}"),
            );
        }
    }
    tally.finish();
}

/// A neighbour's loop device on `file` (`losetup`); its path.
fn losetup(file: &Path) -> String {
    let out = std::process::Command::new("losetup")
        .args(["--find", "--show"])
        .arg(file)
        .output()
        .expect("run losetup");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}
