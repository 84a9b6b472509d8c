//! No overcommit by default, through the real binary on a small tmpfs: sizes are reserved in
//! the filesystem's free space when volumes are created, GetCapacity reports what is left, a
//! volume that no longer fits (in bytes, or in inodes beside the other volumes' inode limits)
//! is RESOURCE_EXHAUSTED, and `--overcommit` gives the old behaviour back. (Reserving needs
//! only statvfs, not quotas.)

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::csi_node::*;
use common::scratch_fs::{Kind, ScratchFs};
use csi_nodekit::proto::csi::*;
use tonic::Code;

const MIB: i64 = 1 << 20;

/// The binary on `state` (on `fs`), listening on `socket`, with `extra` flags, until it is up.
async fn start(fs: &ScratchFs, socket: &str, extra: &[&str]) -> (common::KillOnDrop, Csi) {
    let socket = fs.path().join(socket);
    let state = fs.path().join("state");
    let mut flags = vec!["--node-id=n", "--quota=off"];
    flags.extend_from_slice(extra);
    let child = common::spawn_node_server(&socket, &state, &flags);
    assert!(
        common::wait_until(Duration::from_secs(10), || common::is_socket(&socket)).await,
        "node-server {extra:?} did not start:\n{}",
        child.stderr()
    );
    (child, connect(&socket).await)
}

/// Free bytes of the filesystem holding `path`, as GetCapacity counts them.
fn free(path: &Path) -> i64 {
    let stat = nix::sys::statvfs::statvfs(path).unwrap();
    (stat.blocks_available() * stat.fragment_size()) as i64
}

async fn capacity(csi: &mut Csi) -> i64 {
    let reply = csi.controller.get_capacity(GetCapacityRequest::default());
    reply.await.unwrap().into_inner().available_capacity
}

#[ignore = "needs root: a tmpfs mounted in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sizes_are_reserved_so_a_volume_that_no_longer_fits_is_resource_exhausted_unless_overcommitted()
 {
    let fs = ScratchFs::with_options(Kind::Tmpfs, "size=64m");
    let (child, mut csi) = start(&fs, "a.sock", &[]).await;
    assert_eq!(
        capacity(&mut csi).await,
        free(fs.path()),
        "nothing promised yet"
    );
    create(&mut csi, "pvc-a", 40 * MIB).await;
    let left = capacity(&mut csi).await;
    assert_eq!(
        left,
        free(fs.path()) - 40 * MIB,
        "the first volume's size is promised"
    );
    let second = csi
        .controller
        .create_volume(create_request("pvc-b", 40 * MIB));
    let refused = second.await.expect_err("a second 40 MiB in 64 MiB");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("available"), "{refused:?}");
    drop(child);

    let (_child, mut csi) = start(&fs, "b.sock", &["--overcommit"]).await;
    assert_eq!(
        capacity(&mut csi).await,
        free(fs.path()),
        "nothing held back"
    );
    create(&mut csi, "pvc-b", 40 * MIB).await;
    assert_eq!(capacity(&mut csi).await, free(fs.path()));
}

#[ignore = "needs root: a tmpfs mounted in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filesystem_with_fewer_free_inodes_than_a_volumes_default_limit_is_resource_exhausted() {
    let fs = ScratchFs::with_options(Kind::Tmpfs, "size=64m,nr_inodes=200");
    let (child, mut csi) = start(&fs, "a.sock", &[]).await;
    let request = create_request("pvc-a", MIB);
    let refused = (csi.controller.create_volume(request.clone()).await)
        .expect_err("a volume whose default inode limit (1024) the filesystem cannot hold");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("1024 inodes"), "{refused:?}");
    drop(child);

    // Overcommitted, one free inode is enough.
    let (_child, mut csi) = start(&fs, "b.sock", &["--overcommit"]).await;
    csi.controller.create_volume(request).await.unwrap();
}

#[ignore = "needs root: a tmpfs mounted in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inode_limits_are_reserved_across_volumes_so_one_that_no_longer_fits_is_resource_exhausted()
{
    // 3000 inodes: two volumes' default limits (1024 each) fit, a third's does not.
    let fs = ScratchFs::with_options(Kind::Tmpfs, "size=64m,nr_inodes=3000");
    let (child, mut csi) = start(&fs, "a.sock", &[]).await;
    create(&mut csi, "pvc-a", MIB).await;
    create(&mut csi, "pvc-b", MIB).await;
    let refused = (csi
        .controller
        .create_volume(create_request("pvc-c", MIB))
        .await)
        .expect_err("2048 inodes promised, fewer than 1024 left beside them");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("1024 inodes needed"),
        "{refused:?}"
    );
    drop(child);

    let (_child, mut csi) = start(&fs, "b.sock", &["--overcommit"]).await;
    create(&mut csi, "pvc-c", MIB).await;
}
