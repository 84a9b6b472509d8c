//! The whole life of a volume through real gRPC on a real socket, with real bind mounts in
//! the test's private mount namespace: create → stage → publish (rw and ro) → stats →
//! expand → unpublish → unstage → delete; every call repeated; a restart in the middle;
//! ephemeral inline volumes; and the real binary.

use crate::common;

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use common::csi_node::*;
use csi_nodekit::proto::csi::*;

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_goes_through_its_whole_life_with_real_mounts() {
    let (sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-life", 1 << 20).await;
    let data = sandbox.path().join("state/volumes").join(&id);
    assert!(
        data.is_dir(),
        "the volume is a directory under the state dir"
    );

    let staging = sandbox.dir("staging");
    let pods = sandbox.dir("pods");
    let (rw, ro) = (pods.join("rw"), pods.join("ro"));
    csi.node
        .node_stage_volume(stage_request(&id, &staging))
        .await
        .unwrap();
    assert!(is_mounted(&staging));
    csi.node
        .node_publish_volume(publish_request(&id, &staging, &rw, false))
        .await
        .unwrap();
    csi.node
        .node_publish_volume(publish_request(&id, &staging, &ro, true))
        .await
        .unwrap();

    std::fs::write(rw.join("hello"), b"written through the rw target").unwrap();
    assert_eq!(
        std::fs::read(data.join("hello")).unwrap(),
        b"written through the rw target"
    );
    assert_eq!(
        std::fs::read(ro.join("hello")).unwrap(),
        b"written through the rw target"
    );
    assert!(is_readonly(&ro) && !is_readonly(&rw));
    let refused = std::fs::write(ro.join("nope"), b"x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(nix::libc::EROFS));

    let stats = csi
        .node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: rw.display().to_string(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .unwrap()
        .into_inner();
    let units: Vec<i32> = stats.usage.iter().map(|u| u.unit).collect();
    assert_eq!(
        units,
        [
            volume_usage::Unit::Bytes as i32,
            volume_usage::Unit::Inodes as i32
        ]
    );
    assert!(
        stats
            .usage
            .iter()
            .all(|u| u.total > 0 && u.used >= 0 && u.available >= 0)
    );
    assert!(!stats.volume_condition.unwrap().abnormal);
    let link = sandbox.path().join("pods-link");
    std::os::unix::fs::symlink(&pods, &link).unwrap();
    let through_link = csi
        .node
        .node_get_volume_stats(stats_request(&id, &link.join("ro").display().to_string()))
        .await
        .unwrap()
        .into_inner();
    assert!(
        !through_link.volume_condition.unwrap().abnormal,
        "a path through a symlink still finds the mount"
    );

    let expanded = csi
        .controller
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: id.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: 2 << 20,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(expanded.capacity_bytes, 2 << 20);
    let node_expanded = csi
        .node
        .node_expand_volume(NodeExpandVolumeRequest {
            volume_id: id.clone(),
            volume_path: rw.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(node_expanded.capacity_bytes, 2 << 20);

    for target in [&rw, &ro] {
        csi.node
            .node_unpublish_volume(unpublish_request(&id, target))
            .await
            .unwrap();
        assert!(!target.exists(), "unpublish removes the target directory");
    }
    csi.node
        .node_unstage_volume(unstage_request(&id, &staging))
        .await
        .unwrap();
    assert!(!is_mounted(&staging) && staging.is_dir());
    csi.controller
        .delete_volume(delete_request(&id))
        .await
        .unwrap();
    assert!(!data.exists());
    let listed = csi.list().await;
    assert!(listed.is_empty());
    assert!(sandbox.mounts().is_empty(), "no mount left behind");
    server.stop().await;
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_repeated_with_the_same_arguments_succeeds_without_stacking_mounts() {
    let (sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-twice", 4096).await;
    assert_eq!(create(&mut csi, "pvc-twice", 4096).await, id);
    let staging = sandbox.dir("staging");
    let target = sandbox.dir("pods").join("t");
    for _ in 0..2 {
        csi.node
            .node_stage_volume(stage_request(&id, &staging))
            .await
            .unwrap();
    }
    for _ in 0..2 {
        csi.node
            .node_publish_volume(publish_request(&id, &staging, &target, true))
            .await
            .unwrap();
    }
    assert_eq!(
        sandbox.mounts().len(),
        2,
        "one staging and one target mount"
    );
    for _ in 0..2 {
        csi.unpublish_and_unstage(&id, &target, &staging).await;
    }
    for _ in 0..2 {
        csi.controller
            .delete_volume(delete_request(&id))
            .await
            .unwrap();
    }
    assert!(sandbox.mounts().is_empty());
    server.stop().await;
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_in_the_middle_of_the_lifecycle_loses_nothing() {
    let sandbox = MountSandbox::new();
    let staging = sandbox.dir("staging");
    let target = sandbox.dir("pods").join("t");
    let first = start(&sandbox, config(&sandbox)).await;
    let mut csi = first.client().await;
    let id = create(&mut csi, "pvc-restart", 8192).await;
    csi.stage_and_publish(&id, &staging, &target, false).await;
    std::fs::write(target.join("kept"), b"across restarts").unwrap();
    first.stop().await;

    let second = start(&sandbox, config(&sandbox)).await;
    let mut csi = second.client().await;
    assert_eq!(
        create(&mut csi, "pvc-restart", 8192).await,
        id,
        "the name still maps to the same volume"
    );
    csi.stage_and_publish(&id, &staging, &target, false).await;
    assert_eq!(
        sandbox.mounts().len(),
        2,
        "the repeat after restart stacked nothing"
    );
    let ro_again = publish_request(&id, &staging, &target, true);
    assert_eq!(
        code(csi.node.node_publish_volume(ro_again).await),
        tonic::Code::AlreadyExists,
        "the mount table still tells an incompatible re-publish apart"
    );
    let delete = DeleteVolumeRequest {
        volume_id: id.clone(),
        ..Default::default()
    };
    assert_eq!(
        code(csi.controller.delete_volume(delete.clone()).await),
        tonic::Code::FailedPrecondition,
        "still mounted after the restart, so not deleted"
    );
    assert_eq!(
        std::fs::read(target.join("kept")).unwrap(),
        b"across restarts"
    );
    csi.unpublish_and_unstage(&id, &target, &staging).await;
    csi.controller.delete_volume(delete).await.unwrap();
    second.stop().await;
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ephemeral_inline_volume_lives_from_publish_to_unpublish() {
    let (sandbox, server, mut csi) = setup().await;
    let target = sandbox.dir("pods").join("inline");
    let id = "csi-0123456789abcdef";
    let publish = NodePublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.display().to_string(),
        volume_capability: Some(rwo()),
        volume_context: HashMap::from([
            ("csi.storage.k8s.io/ephemeral".into(), "true".into()),
            ("csi.storage.k8s.io/pod.name".into(), "p".into()),
            ("size".into(), "16Mi".into()),
        ]),
        ..Default::default()
    };
    for _ in 0..2 {
        csi.node.node_publish_volume(publish.clone()).await.unwrap();
    }
    assert!(is_mounted(&target));
    let data = sandbox.path().join("state/volumes").join(id);
    std::fs::write(target.join("scratch"), b"x").unwrap();
    assert!(data.join("scratch").exists());
    let listed = csi.list().await;
    assert_eq!(listed[0].capacity_bytes, 16 << 20);
    for _ in 0..2 {
        csi.node
            .node_unpublish_volume(unpublish_request(id, &target))
            .await
            .unwrap();
    }
    assert!(
        !data.exists() && !target.exists(),
        "unpublish removes the volume"
    );
    assert!(sandbox.mounts().is_empty());
    server.stop().await;
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_mount_group_owns_the_volume_and_mount_flags_reach_the_mount() {
    let (sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-group", 4096).await;
    let staging = sandbox.dir("staging");
    let target = sandbox.dir("pods").join("t");
    let mut cap = capability(
        volume_capability::access_mode::Mode::SingleNodeMultiWriter,
        &["nosuid", "nodev", "noexec"],
    );
    if let Some(volume_capability::AccessType::Mount(mount)) = &mut cap.access_type {
        mount.volume_mount_group = "2345".into();
    }
    let stage = NodeStageVolumeRequest {
        volume_capability: Some(cap.clone()),
        ..stage_request(&id, &staging)
    };
    csi.node.node_stage_volume(stage).await.unwrap();
    let publish = NodePublishVolumeRequest {
        volume_capability: Some(cap),
        ..publish_request(&id, &staging, &target, false)
    };
    csi.node.node_publish_volume(publish).await.unwrap();
    let meta = std::fs::metadata(&target).unwrap();
    assert_eq!(meta.gid(), 2345);
    assert_eq!(meta.mode() & 0o2070, 0o2070, "group-writable and setgid");
    let table = csi_nodekit::linux::mountinfo::MountTable::read().unwrap();
    let entry = table.mounted_at(&target).unwrap();
    for flag in ["nosuid", "nodev", "noexec"] {
        assert!(
            entry.has_option(flag),
            "{flag} missing: {:?}",
            entry.options
        );
    }
    csi.unpublish_and_unstage(&id, &target, &staging).await;
    server.stop().await;
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_binary_serves_the_lifecycle_and_stops_cleanly_on_sigterm() {
    let sandbox = MountSandbox::new();
    let socket = sandbox.path().join("bin.sock");
    let state = sandbox.path().join("state");
    let mut child = common::spawn_node_server(
        &socket,
        &state,
        &[
            "--node-id=bin-node",
            "--capacity=1Gi",
            "--driver-name=bin.example.io",
        ],
    );
    assert!(
        common::wait_until(Duration::from_secs(10), || common::is_socket(&socket)).await,
        "socket never appeared"
    );
    let channel = csi_nodekit::socket::connect(&socket).await.unwrap();
    let mut node = node_client::NodeClient::new(channel.clone());
    let mut controller = controller_client::ControllerClient::new(channel);
    let info = node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, "bin-node");
    assert_eq!(
        info.accessible_topology.unwrap().segments["topology.bin.example.io/node"],
        "bin-node"
    );
    let capacity = controller
        .get_capacity(GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(capacity.available_capacity, 1 << 30);
    let id = controller
        .create_volume(create_request("pvc-bin", 1 << 20))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let staging = sandbox.dir("staging");
    let target = sandbox.dir("pods").join("t");
    node.node_stage_volume(stage_request(&id, &staging))
        .await
        .unwrap();
    node.node_publish_volume(publish_request(&id, &staging, &target, false))
        .await
        .unwrap();
    assert!(
        is_mounted(&target),
        "the child's mounts are in our namespace"
    );
    node.node_unpublish_volume(unpublish_request(&id, &target))
        .await
        .unwrap();
    node.node_unstage_volume(unstage_request(&id, &staging))
        .await
        .unwrap();
    common::send_signal(&child.0, nix::sys::signal::Signal::SIGTERM);
    let status = common::wait_exit(&mut child.0, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
    assert!(!socket.exists());
    assert!(state.join("meta").join(format!("{id}.json")).exists());
}
