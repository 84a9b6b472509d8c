//! A start-up that finds large leftovers of interrupted copies (a restore's directory without a
//! record, a snapshot's temporary copy) serves first and removes them in the background, and
//! nothing a later call makes picks up their data.

use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::common::csi_node::*;
use crate::common::csi_snapshots::*;
use crate::common::scratch_fs::{Kind, ScratchFs};
use crate::common::{self, KillOnDrop};
use csi_nodekit::proto::csi::GetPluginInfoRequest;

/// Files in each leftover: enough that removing them takes a while even on tmpfs.
const FILES: usize = 20_000;

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// A tree of `FILES` small files under `root`, 100 to a directory, each holding `marker`.
fn leftover(root: &Path, marker: &str) {
    for i in 0..FILES {
        let dir = root.join(format!("d{}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir_all(&dir).unwrap();
        }
        std::fs::write(dir.join(format!("f{i}")), marker).unwrap();
    }
}

/// Whether any file under `root` holds `marker`.
fn holds(root: &Path, marker: &str) -> bool {
    checksums(root).keys().any(|file| {
        std::fs::read_to_string(root.join(file)).is_ok_and(|text| text.contains(marker))
    })
}

async fn start_binary(socket: &Path, state: &Path) -> KillOnDrop {
    let _ = std::fs::remove_file(socket);
    let child = common::spawn_node_server(socket, state, &["--node-id=orphans-node"]);
    let up = common::wait_until(Duration::from_secs(20), || common::is_socket(socket)).await;
    assert!(up, "socket never appeared: {}", child.stderr());
    child
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: a tmpfs scratch filesystem and the real binary"]
async fn large_leftovers_are_removed_after_the_socket_serves_and_nothing_new_picks_them_up() {
    let sandbox = MountSandbox::new();
    let fs = ScratchFs::new(Kind::Tmpfs);
    let state = fs.path().join("state");
    let socket = sandbox.path().join("csi.sock");
    let mut child = start_binary(&socket, &state).await;
    let mut csi = connect(&socket).await;
    let source = create(&mut csi, "source", 64 << 20).await;
    common::send_signal(&child.0, Signal::SIGTERM);
    common::wait_exit(&mut child.0, Duration::from_secs(10));

    // What a restore and a snapshot killed midway leave: a volume directory without a record,
    // and a temporary copy of a process that is gone.
    let volumes = state.join("volumes");
    let snapshots = state.join("snapshots");
    leftover(&volumes.join("vol-interrupted"), "restore-leftover");
    leftover(
        &snapshots.join(".partial-999999-0-snap-interrupted"),
        "snapshot-leftover",
    );

    let started = Instant::now();
    let child = start_binary(&socket, &state).await;
    let mut csi = connect(&socket).await;
    let info = csi.identity.get_plugin_info(GetPluginInfoRequest {}).await;
    let first_answer = started.elapsed();
    info.expect("GetPluginInfo answered");
    assert_eq!(
        names(&volumes)
            .iter()
            .filter(|n| !n.starts_with(".orphan-"))
            .collect::<Vec<_>>(),
        vec![&source],
        "the restore's leftover lost its name before the socket served"
    );
    assert!(
        names(&snapshots).iter().all(|n| n.starts_with(".orphan-")),
        "the snapshot's leftover lost its name before the socket served: {:?}",
        names(&snapshots)
    );

    // New calls with the names the interrupted ones had find nothing of theirs.
    let listed: Vec<String> = csi.list().await.into_iter().map(|v| v.volume_id).collect();
    assert_eq!(
        listed,
        vec![source.clone()],
        "no volume claims the leftover"
    );
    let fresh = create(&mut csi, "restored", 64 << 20).await;
    assert!(
        !holds(&volumes.join(&fresh), "restore-leftover"),
        "a new volume picked up the leftover"
    );
    let snapshot = csi.snapshot("snap", &source).await;
    let cut = snapshots.join(&snapshot.snapshot_id);
    assert!(
        !holds(&cut, "snapshot-leftover"),
        "a new snapshot picked it up"
    );

    let removed = |child: &KillOnDrop| child.stderr().matches("removed orphan").count() == 2;
    let gone = common::wait_until(Duration::from_secs(120), || removed(&child)).await;
    assert!(gone, "the leftovers were never removed: {}", child.stderr());
    let log = child.stderr();
    let serving = log.find("serving CSI driver").expect("the serving line");
    let first_removed = log.find("removed orphan").expect("a removal line");
    assert!(
        serving < first_removed,
        "the socket served before the removal finished: {log}"
    );
    for dir in [&volumes, &snapshots] {
        let left: Vec<_> = (names(dir).into_iter())
            .filter(|n| n.starts_with(".orphan-"))
            .collect();
        assert_eq!(left, Vec::<String>::new(), "in {}", dir.display());
    }
    assert_eq!(
        names(&snapshots),
        vec![snapshot.snapshot_id.clone()],
        "only the new snapshot"
    );
    eprintln!(
        "first GetPluginInfo answered {} ms after start; {}",
        first_answer.as_millis(),
        (log.lines())
            .filter(|l| l.contains("removed orphan"))
            .collect::<Vec<_>>()
            .join("; ")
    );
    common::send_signal(&child.0, Signal::SIGTERM);
}
