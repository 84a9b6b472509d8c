//! A pod's 100,000-deep tree (what XFS allows; ext4 stops at 65,533) through the real binary:
//! CreateSnapshot, a restore, a clone, every DeleteVolume and the DeleteSnapshot all answer OK,
//! the copies hold the deepest file and a hard link between two depths, and nothing is left.
//! (Walks that held a descriptor per level stopped at 512 levels: the snapshot and the clone
//! answered INTERNAL and the volume could never be deleted.)

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::time::Instant;

use nix::fcntl::AtFlags;
use nix::sys::stat::fstatat;
use nix::unistd::linkat;

use super::processes::{self, DRIVER};
use super::tally::Tally;
use crate::common::csi_node::{self, delete_request};
use crate::common::csi_snapshots::{
    delete_snapshot_request, from_snapshot, from_volume, snapshot_request,
};
use crate::common::scratch_fs::{Kind, ScratchFs};
use crate::common::spawn_node_server;
use crate::common::tree_fixture::{nest, nest_at, reach, read_at};

const DEPTH: usize = 100_000;
const MIDDLE: usize = DEPTH / 2;

/// Whether `root` holds the whole tree: the deepest file, and the middle file linked (one
/// inode) from the deepest directory.
fn whole(root: &Path) -> bool {
    let (Some(middle), Some(bottom)) = (reach(root, MIDDLE), reach(root, DEPTH)) else {
        return false;
    };
    let inode = |dir: BorrowedFd<'_>, name: &str| {
        fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .ok()
            .map(|s| (s.st_dev, s.st_ino))
    };
    read_at(bottom.as_fd(), "bottom").as_deref() == Some(b"deep".as_slice())
        && read_at(middle.as_fd(), "middle").as_deref() == Some(b"middle".as_slice())
        && inode(middle.as_fd(), "middle").is_some()
        && inode(middle.as_fd(), "middle") == inode(bottom.as_fd(), "middle-link")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: a tmpfs scratch filesystem for the state directory"]
async fn a_hundred_thousand_deep_tree_is_snapshotted_restored_cloned_and_deleted() {
    let fs = ScratchFs::with_options(Kind::Tmpfs, "size=2g");
    let node = processes::Node::new();
    let (socket, state) = (node.csi(), fs.path().join("state"));
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    let driver = format!("--driver-name={DRIVER}");
    let server = spawn_node_server(&socket, &state, &[&driver, "--node-id=node-a"]);
    assert!(processes::probe_ready(&socket).await, "{}", server.stderr());
    let mut csi = csi_node::connect(&socket).await;
    let source = csi_node::create(&mut csi, "pvc-deep", 64 << 20).await;
    let volumes = state.join("volumes");
    // What the pod does: nests its directories, a file at the bottom, one in the middle
    // hard-linked from the bottom.
    let middle = nest(&volumes.join(&source), MIDDLE);
    std::fs::write(
        format!(
            "/proc/self/fd/{}/middle",
            std::os::fd::AsRawFd::as_raw_fd(&middle)
        ),
        "middle",
    )
    .unwrap();
    let bottom = nest_at(middle.as_fd(), DEPTH - MIDDLE);
    let bottom_file = format!(
        "/proc/self/fd/{}/bottom",
        std::os::fd::AsRawFd::as_raw_fd(&bottom)
    );
    std::fs::write(bottom_file, "deep").unwrap();
    linkat(
        middle.as_fd(),
        "middle",
        bottom.as_fd(),
        "middle-link",
        AtFlags::empty(),
    )
    .unwrap();
    drop((middle, bottom));
    assert!(whole(&volumes.join(&source)), "the fixture");

    let mut tally = Tally::new("a 100,000-deep tree snapshotted, restored, cloned and deleted");
    let started = Instant::now();
    let mut took = Vec::new();
    let mut lap = |what: &str| took.push(format!("{what} {} ms", started.elapsed().as_millis()));
    let snapshot = (csi.controller)
        .create_snapshot(snapshot_request("snap-deep", &source))
        .await
        .map(|r| r.into_inner().snapshot.unwrap_or_default().snapshot_id);
    let snapshot_whole = snapshot
        .as_ref()
        .is_ok_and(|id| whole(&state.join("snapshots").join(id)));
    lap("snapshot");
    tally.check(snapshot_whole, format_args!("CreateSnapshot: {snapshot:?}"));
    let mut copies = Vec::new();
    let restore = match &snapshot {
        Ok(id) => (csi.controller)
            .create_volume(from_snapshot("pvc-deep-restore", 64 << 20, id))
            .await
            .map(|r| r.into_inner().volume.unwrap_or_default().volume_id),
        Err(status) => Err(status.clone()),
    };
    let clone = (csi.controller)
        .create_volume(from_volume("pvc-deep-clone", 64 << 20, &source))
        .await
        .map(|r| r.into_inner().volume.unwrap_or_default().volume_id);
    lap("restore and clone");
    for (what, answer) in [("restore", restore), ("clone", clone)] {
        let holds = answer.as_ref().is_ok_and(|id| whole(&volumes.join(id)));
        tally.check(holds, format_args!("{what}: {answer:?}"));
        copies.extend(answer.ok());
    }
    for id in copies.iter().chain([&source]) {
        let answer = csi.controller.delete_volume(delete_request(id)).await;
        let gone = !volumes.join(id).exists();
        tally.check(
            answer.is_ok() && gone,
            format_args!("DeleteVolume {id}: {answer:?}, directory gone {gone}"),
        );
    }
    lap("deletes");
    if let Ok(id) = &snapshot {
        let answer = (csi.controller)
            .delete_snapshot(delete_snapshot_request(id))
            .await;
        let gone = !state.join("snapshots").join(id).exists();
        tally.check(
            answer.is_ok() && gone,
            format_args!("DeleteSnapshot: {answer:?}, gone {gone}"),
        );
    }
    lap("snapshot deleted");
    tally.note(format_args!("at {}", took.join(", ")));
    tally.finish();
}
