//! Each Node call keeps to its own paths, through real gRPC with real mounts: NodeUnpublishVolume
//! at a staging path and NodeUnstageVolume at a target path are refused and touch nothing;
//! unpublish removes only a mount point publish made for that volume; a target inside another
//! volume's mount is refused; a symlink a neighbour could have planted is not followed.

use crate::common;

use std::os::unix::fs::PermissionsExt;

use common::csi_block::*;
use common::csi_node::*;
use tonic::Code;

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpublish_at_a_staging_path_is_refused_and_touches_nothing() {
    let (sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-own-s", 1).await;
    let other = create(&mut csi, "pvc-own-s-other", 1).await;
    let staging = sandbox.dir("plugins/globalmount");
    let target = sandbox.dir("pods/uid").join("mount");
    csi.stage_and_publish(&id, &staging, &target, false).await;
    std::fs::write(target.join("data"), b"kept").unwrap();
    for volume in [&id, &other] {
        let answer = csi
            .node
            .node_unpublish_volume(unpublish_request(volume, &staging))
            .await;
        assert_eq!(code(answer), Code::InvalidArgument, "as volume {volume}");
    }
    assert!(is_mounted(&staging), "the staging mount stays");
    assert_eq!(std::fs::read(staging.join("data")).unwrap(), b"kept");
    csi.unpublish_and_unstage(&id, &target, &staging).await;
    assert!(!target.exists(), "the target publish made is gone");
    assert!(staging.is_dir(), "the staging directory is the CO's");
    server.stop().await;
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unstage_at_a_target_path_is_refused_and_leaves_the_pods_mount() {
    let (sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-own-t", 1).await;
    let other = create(&mut csi, "pvc-own-t-other", 1).await;
    let staging = sandbox.dir("plugins/globalmount");
    let target = sandbox.dir("pods/uid").join("mount");
    csi.stage_and_publish(&id, &staging, &target, false).await;
    std::fs::write(target.join("data"), b"kept").unwrap();
    for volume in [&id, &other] {
        let answer = csi
            .node
            .node_unstage_volume(unstage_request(volume, &target))
            .await;
        assert_eq!(code(answer), Code::InvalidArgument, "as volume {volume}");
    }
    // Nor may a target be staged onto, or a staging path published onto.
    let other_staging = sandbox.dir("plugins/other");
    let answer = csi
        .node
        .node_stage_volume(stage_request(&other, &target))
        .await;
    assert_eq!(code(answer), Code::InvalidArgument, "stage onto a target");
    csi.node
        .node_stage_volume(stage_request(&other, &other_staging))
        .await
        .unwrap();
    let answer = csi
        .node
        .node_publish_volume(publish_request(&other, &other_staging, &staging, false))
        .await;
    assert_eq!(
        code(answer),
        Code::InvalidArgument,
        "publish onto a staging path"
    );
    assert!(is_mounted(&target), "the pod's mount stays");
    assert_eq!(std::fs::read(target.join("data")).unwrap(), b"kept");
    assert_eq!(
        sandbox.mounts().len(),
        3,
        "staging, target, other staging: {:?}",
        sandbox.mounts()
    );
    csi.unpublish_and_unstage(&id, &target, &staging).await;
    csi.node
        .node_unstage_volume(unstage_request(&other, &other_staging))
        .await
        .unwrap();
    server.stop().await;
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpublish_removes_only_a_mount_point_this_driver_made_for_that_volume() {
    let (sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-own-r", 1).await;
    let bystander = create(&mut csi, "pvc-own-r-by", 1).await;
    let empty_dir = sandbox.dir("someone/dir");
    let empty_file = sandbox.path().join("someone/file");
    std::fs::write(&empty_file, b"").unwrap();
    // Unknown but valid-looking, and known but never published there: nothing is removed.
    for volume in ["vol-never-heard-of", bystander.as_str()] {
        for path in [&empty_dir, &empty_file] {
            csi.node
                .node_unpublish_volume(unpublish_request(volume, path))
                .await
                .expect("nothing to do is done");
            assert!(path.exists(), "{} kept for {volume}", path.display());
        }
    }
    // A target the CO made is unmounted and left to the CO.
    let staging = sandbox.dir("plugins/globalmount");
    let made_by_co = sandbox.dir("pods/a/mount");
    csi.stage_and_publish(&id, &staging, &made_by_co, false)
        .await;
    // Another volume's unpublish of it is refused and removes nothing.
    let answer = csi
        .node
        .node_unpublish_volume(unpublish_request(&bystander, &made_by_co))
        .await;
    assert_eq!(code(answer), Code::FailedPrecondition, "not its mount");
    assert!(is_mounted(&made_by_co));
    csi.node
        .node_unpublish_volume(unpublish_request(&id, &made_by_co))
        .await
        .unwrap();
    assert!(
        !is_mounted(&made_by_co) && made_by_co.is_dir(),
        "kept: the CO made it"
    );
    // A target publish made is removed with the mount.
    let made_here = sandbox.dir("pods/b").join("mount");
    csi.node
        .node_publish_volume(publish_request(&id, &staging, &made_here, false))
        .await
        .unwrap();
    csi.unpublish_and_unstage(&id, &made_here, &staging).await;
    assert!(!made_here.exists(), "publish made it, unpublish removed it");
    server.stop().await;
}

#[ignore = "needs root: real loop devices and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_target_inside_another_volumes_mount_is_refused_and_nothing_is_written_there() {
    let (sandbox, server, mut csi) = setup().await;
    let _devices = DetachOnDrop(sandbox.path().join("state"));
    let dir_volume = create(&mut csi, "pvc-own-host", 1).await;
    let staging = sandbox.dir("plugins/globalmount");
    let target = sandbox.dir("pods/a").join("mount");
    csi.stage_and_publish(&dir_volume, &staging, &target, false)
        .await;
    let block = csi.create_block("pvc-own-block", MIB).await.volume_id;
    let block_staging = sandbox.dir("plugins/block-staging");
    csi.node
        .node_stage_volume(block_stage(&block, &block_staging))
        .await
        .unwrap();
    for inside in [staging.join("dev"), target.join("dev")] {
        let publish = block_publish(&block, &block_staging, &inside, false);
        let answer = csi.node.node_publish_volume(publish).await;
        assert_eq!(code(answer), Code::InvalidArgument, "{}", inside.display());
        assert!(!inside.exists(), "nothing made in the other volume");
    }
    // And a block volume's staging path is no target for unpublish either: kept.
    let answer = csi
        .node
        .node_unpublish_volume(unpublish_request(&block, &block_staging))
        .await;
    assert_eq!(code(answer), Code::InvalidArgument);
    assert!(block_staging.is_dir());
    csi.node
        .node_unstage_volume(unstage_request(&block, &block_staging))
        .await
        .unwrap();
    csi.unpublish_and_unstage(&dir_volume, &target, &staging)
        .await;
    server.stop().await;
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_a_neighbour_could_plant_in_a_target_path_is_not_followed() {
    let (sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-own-link", 1).await;
    let staging = sandbox.dir("plugins/globalmount");
    csi.node
        .node_stage_volume(stage_request(&id, &staging))
        .await
        .unwrap();
    let victim = sandbox.dir("victim");
    // A world-writable directory (as /tmp is): anyone could have put the link there.
    let open = sandbox.dir("open");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::os::unix::fs::symlink(&victim, open.join("pods")).unwrap();
    let through = open.join("pods/mount");
    let answer = csi
        .node
        .node_publish_volume(publish_request(&id, &staging, &through, false))
        .await;
    assert_eq!(code(answer), Code::FailedPrecondition);
    assert!(
        !victim.join("mount").exists(),
        "nothing made where it points"
    );
    let answer = csi
        .node
        .node_unpublish_volume(unpublish_request(&id, &through))
        .await;
    assert_eq!(code(answer), Code::FailedPrecondition);
    // Root's own link in a directory only root writes (a symlinked /var/lib/kubelet) works.
    let kubelet = sandbox.dir("real-kubelet");
    let link = sandbox.path().join("kubelet");
    std::os::unix::fs::symlink(&kubelet, &link).unwrap();
    let target = link.join("mount");
    csi.node
        .node_publish_volume(publish_request(&id, &staging, &target, false))
        .await
        .unwrap();
    assert!(
        is_mounted(&kubelet.join("mount")),
        "resolved through root's link"
    );
    csi.unpublish_and_unstage(&id, &target, &staging).await;
    assert!(!kubelet.join("mount").exists());
    server.stop().await;
}
