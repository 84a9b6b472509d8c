//! Snapshots, restores and clones of image volumes through the real binary: each of one
//! instant (the volume's filesystem frozen while its file is copied), clean without a journal
//! replay, and a restore or clone a filesystem with a UUID of its own; a group of them
//! write-order consistent; a filesystem a crash left frozen thawed at the next start.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::image::{e2fsck, image_create, spawn};
use crate::common::csi_block::*;
use crate::common::csi_node::*;
use crate::common::csi_snapshots::*;
use crate::common::scratch_fs::Kind;
use csi_nodekit::linux::ext4_image;
use csi_nodekit::proto::csi::*;
use tonic::Code;

/// A snapshot's copy of the image file.
fn snapshot_image(state: &Path, snapshot_id: &str) -> PathBuf {
    state.join("snapshots").join(snapshot_id).join("volume.img")
}

/// Creates an image volume and stages and publishes it; its ID and its pod's path. 16 MiB,
/// the template's size: growing a filesystem takes CAP_SYS_RESOURCE, which this machine's
/// root may lack (the quota VM grows them).
pub(super) async fn attached(
    csi: &mut Csi,
    sandbox: &MountSandbox,
    name: &str,
) -> (String, PathBuf) {
    let volume = (csi
        .controller
        .create_volume(image_create(name, 16 * MIB, &[]))
        .await)
        .expect("create")
        .into_inner()
        .volume
        .unwrap();
    let id = volume.volume_id;
    let (staging, target) = (
        sandbox.dir(&format!("{name}-staging")),
        sandbox.dir("pods").join(name),
    );
    csi.stage_and_publish(&id, &staging, &target, false).await;
    (id, target)
}

/// What an image file's filesystem holds in `files`, read through a read-only mount that
/// replays no journal (a snapshot of one instant needs none).
fn read_from_image(image: &Path, mount: &Path, files: &[&str]) -> Vec<Vec<u8>> {
    std::fs::create_dir_all(mount).unwrap();
    let status = std::process::Command::new("mount")
        .args(["-o", "ro,loop,noload"])
        .arg(image)
        .arg(mount)
        .status()
        .expect("mount");
    assert!(
        status.success(),
        "mount -o ro,loop,noload {}",
        image.display()
    );
    let read = files
        .iter()
        .map(|f| std::fs::read(mount.join(f)).unwrap_or_default())
        .collect();
    unmount_when_free(mount);
    read
}

/// Unmounts `mount`, waiting out EBUSY for up to 5 s: a process another test forks in the
/// meantime holds copies of this one's open files until it execs (the read above).
fn unmount_when_free(mount: &Path) {
    for _ in 0..250 {
        match nix::mount::umount(mount) {
            Err(nix::errno::Errno::EBUSY) => std::thread::sleep(Duration::from_millis(20)),
            done => return done.expect("umount"),
        }
    }
    panic!("{} stayed busy for 5 s", mount.display());
}

#[ignore = "needs root: real loop devices, ext4, XFS and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_volume_snapshotted_while_written_restores_and_clones_to_clean_filesystems_of_their_own()
 {
    for kind in [Kind::Xfs, Kind::Ext4] {
        let node = BlockNode::new(kind);
        let (state, sandbox) = (node.state.clone(), &node.sandbox);
        let (child, mut csi) = spawn(sandbox.path(), &state).await;
        let (id, target) = attached(&mut csi, sandbox, "pvc-src").await;
        std::fs::write(target.join("before"), pattern(1, MIB as usize)).unwrap();
        // A writer that keeps writing, unsynced, through the snapshot.
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (stop, file) = (stop.clone(), target.join("during"));
            std::thread::spawn(move || {
                let mut out = std::fs::File::create(file).unwrap();
                let mut written = 0u64;
                while !stop.load(Ordering::Relaxed) && written < 4 * MIB {
                    out.write_all(&[9u8; 4096]).unwrap();
                    written += 4096;
                }
                written
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        let started = Instant::now();
        let snapshot = csi.snapshot("snap", &id).await;
        let took = started.elapsed();
        stop.store(true, Ordering::Relaxed);
        let written = writer.join().unwrap();
        assert!(snapshot.ready_to_use);
        let copy = snapshot_image(&state, &snapshot.snapshot_id);
        let summary = e2fsck(&copy);
        let journal = ext4_image::superblock(&std::fs::File::open(&copy).unwrap()).unwrap();
        assert_eq!(
            journal.uuid,
            ext4_image::volume_uuid(&id),
            "the source's, as cut"
        );

        // A restore and a clone: their own filesystems, UUIDs of their own, the content.
        let restore = from_snapshot("pvc-restore", (16 * MIB) as i64, &snapshot.snapshot_id);
        let image_params = image_create("x", 0, &[]).parameters;
        let restored = csi
            .create_from(CreateVolumeRequest {
                parameters: image_params.clone(),
                ..restore.clone()
            })
            .await;
        let clone = from_volume("pvc-clone", (16 * MIB) as i64, &id);
        let cloned = csi
            .create_from(CreateVolumeRequest {
                parameters: image_params,
                ..clone
            })
            .await;
        for (volume, name) in [(&restored, "restored"), (&cloned, "cloned")] {
            let vid = &volume.volume_id;
            let (staging, pod) = (sandbox.dir(&format!("{name}-st")), sandbox.dir(name));
            csi.stage_and_publish(vid, &staging, &pod, false).await;
            assert_eq!(
                std::fs::read(pod.join("before")).unwrap(),
                pattern(1, MIB as usize),
                "{name}"
            );
            let during = std::fs::metadata(pod.join("during")).map(|m| m.len());
            assert!(
                during
                    .as_ref()
                    .is_ok_and(|n| n % 4096 == 0 && *n <= written),
                "{name}: {during:?}"
            );
            std::fs::write(pod.join("own"), name).unwrap();
            csi.unpublish_and_unstage(vid, &pod, &staging).await;
            let file = image(&state, vid);
            e2fsck(&file);
            let superblock = ext4_image::superblock(&std::fs::File::open(&file).unwrap()).unwrap();
            assert_eq!(
                superblock.uuid,
                ext4_image::volume_uuid(vid),
                "{name}: its own UUID"
            );
        }

        // A directory volume is no restore of an image's snapshot.
        let elsewhere = CreateVolumeRequest {
            name: "pvc-directory".into(),
            ..restore
        };
        let err = csi.controller.create_volume(elsewhere).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains("layout image"), "{}", err.message());
        eprintln!(
            "image snapshot on {kind:?} while a writer wrote {written} bytes: {took:?}; the copy: \
             e2fsck {summary}"
        );
        drop(child);
    }
}

#[ignore = "needs root: real loop devices, ext4, XFS and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_image_volumes_cut_while_a_writer_appends_to_both_in_turn_always_holds_one_prefix()
 {
    for (kind, rounds) in [(Kind::Xfs, 100), (Kind::Ext4, 20)] {
        let node = BlockNode::new(kind);
        let (state, sandbox) = (node.state.clone(), &node.sandbox);
        let (child, mut csi) = spawn(sandbox.path(), &state).await;
        let (a, target_a) = attached(&mut csi, sandbox, "pvc-a").await;
        let (b, target_b) = attached(&mut csi, sandbox, "pvc-b").await;
        // Record n goes to A, then to B, each in one write: B never holds n before A does.
        // `done`: records written to both (returned from write, never synced).
        let (stop, done) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let writer = {
            let (stop, done) = (stop.clone(), done.clone());
            let open = |dir: &Path| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .custom_flags(nix::libc::O_CLOEXEC)
                    .open(dir.join("log"))
                    .unwrap()
            };
            let (mut log_a, mut log_b) = (open(&target_a), open(&target_b));
            // Paced at about 10,000 records a second, so that the 16 MiB volumes never fill.
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let record = format!("{n:09}\n");
                    log_a.write_all(record.as_bytes()).expect("append to A");
                    log_b.write_all(record.as_bytes()).expect("append to B");
                    n += 1;
                    done.store(n, Ordering::SeqCst);
                    if n.is_multiple_of(10) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                n
            })
        };
        let mount = sandbox.dir("read");
        let (mut cut, mut longest, mut ahead) = (Duration::ZERO, Duration::ZERO, 0u32);
        for round in 0..rounds {
            let before = done.load(Ordering::SeqCst);
            let started = Instant::now();
            let request = CreateVolumeGroupSnapshotRequest {
                name: format!("group-{round}"),
                source_volume_ids: vec![a.clone(), b.clone()],
                ..Default::default()
            };
            let group = (csi.group.create_volume_group_snapshot(request).await)
                .expect("group snapshot")
                .into_inner()
                .group_snapshot
                .unwrap();
            let took = started.elapsed();
            (cut, longest) = (cut + took, longest.max(took));
            let image_of = |source: &str| {
                let member = group
                    .snapshots
                    .iter()
                    .find(|s| s.source_volume_id == source);
                snapshot_image(&state, &member.unwrap().snapshot_id)
            };
            let logs: Vec<Vec<u8>> = [&a, &b]
                .iter()
                .map(|v| read_from_image(&image_of(v), &mount, &["log"]).remove(0))
                .collect();
            let records = |log: &[u8]| -> u64 {
                let tail = String::from_utf8_lossy(&log[log.len().saturating_sub(25)..]);
                assert_eq!(
                    log.len() % 10,
                    0,
                    "round {round} on {kind:?}: a torn record, ending {tail:?}\n{}",
                    child.stderr()
                );
                for (n, record) in log.chunks(10).enumerate() {
                    assert_eq!(record, format!("{n:09}\n").as_bytes(), "round {round}");
                }
                (log.len() / 10) as u64
            };
            let (in_a, in_b) = (records(&logs[0]), records(&logs[1]));
            assert!(
                in_b == in_a || in_b + 1 == in_a,
                "round {round}: A holds {in_a} records, B {in_b}: not one prefix"
            );
            // Of one instant after the call: what was written before it is there, synced
            // or not.
            assert!(
                in_b >= before,
                "round {round} on {kind:?}: {before} records written before the cut, {in_b} in it"
            );
            ahead += u32::from(in_b + 1 == in_a);
            let delete = DeleteVolumeGroupSnapshotRequest {
                group_snapshot_id: group.group_snapshot_id.clone(),
                snapshot_ids: group
                    .snapshots
                    .iter()
                    .map(|s| s.snapshot_id.clone())
                    .collect(),
                ..Default::default()
            };
            (csi.group.delete_volume_group_snapshot(delete).await).expect("delete group");
        }
        stop.store(true, Ordering::Relaxed);
        let records = writer.join().unwrap();
        assert!(records > 0, "the writer wrote");
        eprintln!(
            "image group snapshots on {kind:?}: {rounds} groups of 2 cut while {records} records \
             were written, each pair one prefix (A one record ahead in {ahead}); a cut took \
             {:?} on average, {longest:?} at most",
            cut / rounds
        );
        drop(child);
    }
}

#[ignore = "needs root: real loop devices, ext4 and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filesystem_frozen_by_another_refuses_a_snapshot_and_only_one_node_server_left_frozen_is_thawed_at_start()
 {
    let node = BlockNode::new(Kind::Ext4);
    let (state, sandbox) = (node.state.clone(), &node.sandbox);
    let (child, mut csi) = spawn(sandbox.path(), &state).await;
    let (id, target) = attached(&mut csi, sandbox, "pvc-frozen").await;
    // Frozen by someone else (`fsfreeze`): a snapshot would not be of one instant of ours.
    let root = std::fs::File::open(&target).unwrap();
    ext4_image::freeze(&root).expect("freeze");
    let err = csi
        .controller
        .create_snapshot(snapshot_request("s", &id))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("freeze"), "{}", err.message());
    // Restarted: an administrator's freeze is not node-server's to undo.
    drop(child);
    let (child, _csi) = spawn(sandbox.path(), &state).await;
    let frozen = nix::sys::statvfs::statvfs(&target).map(|_| ());
    assert!(frozen.is_ok());
    let write = |name: &'static str| {
        let file = target.join(name);
        tokio::task::spawn_blocking(move || std::fs::write(file, b"written"))
    };
    let held = tokio::time::timeout(Duration::from_secs(2), write("while-frozen")).await;
    assert!(held.is_err(), "the administrator's freeze holds: {held:?}");
    assert!(
        !child.stderr().contains("left frozen"),
        "{}",
        child.stderr()
    );
    // As a node-server killed between its freeze and its thaw leaves it (the freeze and its
    // mark): the next start thaws it, the held write goes through, and the mark goes.
    let mark = state.join("meta").join(format!("{id}.frozen"));
    std::fs::write(&mark, b"").unwrap();
    drop(child);
    let (child, mut csi) = spawn(sandbox.path(), &state).await;
    let wrote = tokio::time::timeout(Duration::from_secs(20), write("after")).await;
    assert!(
        matches!(wrote, Ok(Ok(Ok(())))),
        "the write still waits: {wrote:?}\n{}",
        child.stderr()
    );
    assert!(
        target.join("while-frozen").exists(),
        "the held write went through"
    );
    assert!(
        child.stderr().contains("left frozen by a crash"),
        "{}",
        child.stderr()
    );
    assert!(!mark.exists(), "the mark goes with the thaw");
    let snapshot = csi.snapshot("s", &id).await;
    assert!(snapshot.ready_to_use);
    drop(child);
}

/// Fills `dir`'s filesystem from outside, as anything else on the node may: a file written
/// until ENOSPC; the bytes written.
fn fill_from_outside(file: &Path) -> u64 {
    let mut out = std::fs::File::create(file).unwrap();
    let chunk = vec![3u8; 1 << 20];
    let mut written = 0;
    while let Ok(n) = out.write(&chunk) {
        if n == 0 {
            break;
        }
        written += n as u64;
    }
    let _ = out.sync_all();
    written
}

#[ignore = "needs root: real loop devices, XFS and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_snapshot_a_full_host_filesystem_never_fails_the_volumes_own_writes() {
    let node = BlockNode::new(Kind::Xfs);
    let (state, sandbox) = (node.state.clone(), &node.sandbox);
    let (child, mut csi) = spawn(sandbox.path(), &state).await;
    let (id, target) = attached(&mut csi, sandbox, "pvc-shared").await;
    let data = target.join("data");
    // Rewritten in place, not truncated: the same blocks, shared with the snapshot.
    let write_all = |seed: u8| -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&data)?;
        file.write_all(&pattern(seed, 8 << 20))?;
        file.sync_all()
    };
    write_all(1).expect("the first content");
    let snapshot = csi.snapshot("before", &id).await;
    let unshared = crate::common::wait_until(Duration::from_secs(30), || {
        child
            .stderr()
            .contains(&format!("unshared snapshot {}", snapshot.snapshot_id))
    })
    .await;
    let filled = fill_from_outside(&node.fs.path().join("filler"));
    // The pod overwrites all it had: every block it shared with the snapshot is written.
    let rewritten = write_all(2);
    let read_back = std::fs::read(&data).map(|d| d == pattern(2, 8 << 20));
    csi.unpublish_and_unstage(&id, &target, &sandbox.dir("pvc-shared-staging"))
        .await;
    let _ = std::fs::remove_file(node.fs.path().join("filler"));
    let volume_fsck = common_fsck(&image(&state, &id));
    let snapshot_fsck = common_fsck(&snapshot_image(&state, &snapshot.snapshot_id));
    eprintln!(
        "snapshot unshared {unshared}; {filled} bytes filled the host from outside; the pod's \
         rewrite of 8 MiB: {rewritten:?}, read back {read_back:?}; e2fsck of the volume \
         {volume_fsck:?}, of the snapshot {snapshot_fsck:?}"
    );
    assert!(unshared, "{}", child.stderr());
    assert!(
        rewritten.is_ok() && read_back.is_ok_and(|same| same),
        "{rewritten:?}"
    );
    assert_eq!(
        (volume_fsck.0, snapshot_fsck.0),
        (0, 0),
        "{volume_fsck:?} {snapshot_fsck:?}"
    );
    drop(child);
}

/// `e2fsck -fn`: its exit code and its summary line.
fn common_fsck(image: &Path) -> (i32, String) {
    let (code, text) = crate::common::scratch_fs::fsck(image);
    let summary = text
        .lines()
        .find(|l| l.contains(" files ("))
        .unwrap_or(&text);
    (code, summary.to_owned())
}
