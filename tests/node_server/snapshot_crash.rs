//! The real binary killed with SIGKILL in the middle of a snapshot and in the middle of a
//! restore, and started again on the same state directory (ext4 on a loop device): no snapshot
//! or volume claims the interrupted copy, what it left loses its name before anything is
//! served and is removed in the background, and the same call succeeds.

use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::common::csi_node::*;
use crate::common::csi_snapshots::*;
use crate::common::scratch_fs::{Kind, ScratchFs};
use crate::common::tree_fixture;
use crate::common::{self, KillOnDrop};

/// The names in `dir` that are not leftovers set aside for removal.
fn named(dir: &Path) -> Vec<String> {
    let mut names = names(dir);
    names.retain(|n| !n.starts_with(".orphan-"));
    names
}

/// Waits for the leftovers set aside in `dir` to be removed.
async fn orphans_gone(dir: &Path, child: &KillOnDrop) {
    let gone = common::wait_until(Duration::from_secs(30), || named(dir) == names(dir)).await;
    assert!(
        gone,
        "orphans left in {}: {}",
        dir.display(),
        child.stderr()
    );
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

async fn start_binary(socket: &Path, state: &Path) -> (KillOnDrop, Csi) {
    let _ = std::fs::remove_file(socket);
    let child = common::spawn_node_server(socket, state, &["--node-id=crash-node"]);
    let up = common::wait_until(Duration::from_secs(20), || common::is_socket(socket)).await;
    assert!(up, "socket never appeared: {}", child.stderr());
    (child, connect(socket).await)
}

/// Kills the server once `started` holds, and checks that the call it was making failed.
async fn kill_when<T: std::fmt::Debug>(
    child: &mut KillOnDrop,
    call: tokio::task::JoinHandle<Result<T, tonic::Status>>,
    started: impl Fn() -> bool,
) {
    let seen = common::wait_until(Duration::from_secs(30), &started).await;
    assert!(seen, "the copy never started: {}", child.stderr());
    common::send_signal(&child.0, Signal::SIGKILL);
    common::wait_exit(&mut child.0, Duration::from_secs(10));
    let result = call.await.expect("join");
    assert!(
        result.is_err(),
        "the call finished before the kill ({result:?}): the tree is too small to catch it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: an ext4 scratch filesystem on a loop device, and the real binary"]
async fn a_server_killed_mid_snapshot_or_mid_restore_restarts_clean_and_the_call_then_succeeds() {
    let sandbox = MountSandbox::new();
    let fs = ScratchFs::sized(Kind::Ext4, "noatime", 1 << 30);
    let state = fs.path().join("state");
    let socket = sandbox.path().join("csi.sock");
    let (mut child, mut csi) = start_binary(&socket, &state).await;
    let id = create(&mut csi, "source", 64 << 20).await;
    let source_dir = state.join("volumes").join(&id);
    tree_fixture::many_files(&source_dir);
    let sums = checksums(&source_dir);

    let mut client = csi.clone();
    let source = id.clone();
    let call = tokio::spawn(async move {
        let request = snapshot_request("snap", &source);
        client.controller.create_snapshot(request).await
    });
    let snapshots = state.join("snapshots");
    let partial = || names(&snapshots).iter().any(|n| n.starts_with(".partial-"));
    kill_when(&mut child, call, partial).await;
    assert!(partial(), "the kill left a partial copy to clean up");

    let (mut child, mut csi) = start_binary(&socket, &state).await;
    assert_eq!(
        csi.snapshots().await,
        vec![],
        "no snapshot claims the interrupted copy"
    );
    assert_eq!(
        named(&snapshots),
        Vec::<String>::new(),
        "the partial copy lost its name before anything was served"
    );
    orphans_gone(&snapshots, &child).await;
    assert_eq!(names(&state.join("snapshot-meta")), Vec::<String>::new());
    let snapshot = csi.snapshot("snap", &id).await;
    assert!(snapshot.ready_to_use);
    assert_eq!(checksums(&snapshots.join(&snapshot.snapshot_id)), sums);

    // A restore killed halfway leaves a volume directory without a record.
    let mut client = csi.clone();
    let snapshot_id = snapshot.snapshot_id.clone();
    let call = tokio::spawn(async move {
        let request = from_snapshot("restored", 0, &snapshot_id);
        client.controller.create_volume(request).await
    });
    let volumes = state.join("volumes");
    let filling = || {
        (names(&volumes).iter())
            .filter(|n| **n != id)
            .any(|n| std::fs::read_dir(volumes.join(n)).is_ok_and(|mut d| d.next().is_some()))
    };
    kill_when(&mut child, call, filling).await;
    drop(child);

    let (child, mut csi) = start_binary(&socket, &state).await;
    let listed: Vec<String> = csi.list().await.into_iter().map(|v| v.volume_id).collect();
    assert_eq!(
        listed,
        vec![id.clone()],
        "no volume claims the interrupted restore"
    );
    assert_eq!(
        named(&volumes),
        vec![id.clone()],
        "its directory lost its name before anything was served"
    );
    orphans_gone(&volumes, &child).await;
    let restored = csi
        .create_from(from_snapshot("restored", 0, &snapshot.snapshot_id))
        .await;
    assert_eq!(checksums(&volumes.join(&restored.volume_id)), sums);
    common::send_signal(&child.0, Signal::SIGTERM);
}
