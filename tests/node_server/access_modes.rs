//! Access modes and inline volumes enforced, through real gRPC with real mounts: reader-only
//! modes publish read-only whatever `readonly` says, SINGLE_NODE_SINGLE_WRITER takes one
//! staging path, and an inline ephemeral volume refuses the calls that do not apply to it and
//! leaks nothing.

use std::collections::HashMap;
use std::path::Path;

use crate::common::csi_node::*;
use csi_nodekit::proto::csi::volume_capability::access_mode::Mode;
use csi_nodekit::proto::csi::*;
use tonic::Code;

fn with_mode(mode: Mode, mut request: NodePublishVolumeRequest) -> NodePublishVolumeRequest {
    request.volume_capability = Some(capability(mode, &[]));
    request
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_only_modes_publish_read_only_even_when_readonly_is_false() {
    let (sandbox, server, mut csi) = setup().await;
    for (n, mode) in [Mode::SingleNodeReaderOnly, Mode::MultiNodeReaderOnly]
        .into_iter()
        .enumerate()
    {
        let id = create(&mut csi, &format!("pvc-reader-{n}"), 1).await;
        let staging = sandbox.dir(&format!("s{n}"));
        let target = sandbox.dir("pods").join(format!("t{n}"));
        let mut stage = stage_request(&id, &staging);
        stage.volume_capability = Some(capability(mode, &[]));
        csi.node.node_stage_volume(stage).await.unwrap();
        let publish = with_mode(mode, publish_request(&id, &staging, &target, false));
        csi.node.node_publish_volume(publish).await.unwrap();
        assert!(is_readonly(&target), "{mode:?}");
        let write = std::fs::write(target.join("f"), b"x").unwrap_err();
        assert_eq!(write.raw_os_error(), Some(nix::libc::EROFS), "{mode:?}");
        // Asked again, the same: already there, read-only.
        let again = with_mode(mode, publish_request(&id, &staging, &target, false));
        csi.node.node_publish_volume(again).await.unwrap();
        csi.unpublish_and_unstage(&id, &target, &staging).await;
    }
    server.stop().await;
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_single_writer_refuses_a_second_staging_path_until_the_first_is_unstaged() {
    let (sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-snsw", 1).await;
    let (first, second) = (sandbox.dir("first"), sandbox.dir("second"));
    let stage = |path: &Path| NodeStageVolumeRequest {
        volume_capability: Some(capability(Mode::SingleNodeSingleWriter, &[])),
        ..stage_request(&id, path)
    };
    csi.node.node_stage_volume(stage(&first)).await.unwrap();
    csi.node
        .node_stage_volume(stage(&first))
        .await
        .expect("the same path again");
    assert_eq!(
        code(csi.node.node_stage_volume(stage(&second)).await),
        Code::FailedPrecondition
    );
    assert!(!is_mounted(&second), "nothing mounted at the second path");
    csi.node
        .node_unstage_volume(unstage_request(&id, &first))
        .await
        .unwrap();
    csi.node
        .node_stage_volume(stage(&second))
        .await
        .expect("once the first is unstaged");
    csi.node
        .node_unstage_volume(unstage_request(&id, &second))
        .await
        .unwrap();
    server.stop().await;
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_volume_refuses_stage_snapshots_expansion_and_modification_and_leaks_nothing() {
    let (sandbox, server, mut csi) = setup().await;
    let id = "csi-inline-refusals";
    let target = sandbox.dir("pods").join("inline");
    let publish = NodePublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.display().to_string(),
        volume_capability: Some(rwo()),
        volume_context: HashMap::from([
            ("csi.storage.k8s.io/ephemeral".into(), "true".into()),
            ("size".into(), "1Mi".into()),
        ]),
        ..Default::default()
    };
    csi.node.node_publish_volume(publish).await.unwrap();
    std::fs::write(target.join("data"), b"kept").unwrap();
    let staging = sandbox.dir("plugins/globalmount");
    let staged = csi
        .node
        .node_stage_volume(stage_request(id, &staging))
        .await;
    assert_eq!(code(staged), Code::FailedPrecondition, "NodeStageVolume");
    let snapshot = CreateSnapshotRequest {
        name: "snap-inline".into(),
        source_volume_id: id.into(),
        ..Default::default()
    };
    let answer = csi.controller.create_snapshot(snapshot).await;
    assert_eq!(code(answer), Code::FailedPrecondition, "CreateSnapshot");
    let group = CreateVolumeGroupSnapshotRequest {
        name: "group-inline".into(),
        source_volume_ids: vec![id.into()],
        ..Default::default()
    };
    let answer = csi.group.create_volume_group_snapshot(group).await;
    assert_eq!(
        code(answer),
        Code::FailedPrecondition,
        "CreateVolumeGroupSnapshot"
    );
    let expand = ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 64 << 20,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    let answer = csi.controller.controller_expand_volume(expand).await;
    assert_eq!(
        code(answer),
        Code::FailedPrecondition,
        "ControllerExpandVolume"
    );
    let modify = ControllerModifyVolumeRequest {
        volume_id: id.into(),
        mutable_parameters: HashMap::from([("rootMode".into(), "0700".into())]),
        ..Default::default()
    };
    let answer = csi.controller.controller_modify_volume(modify).await;
    assert_eq!(
        code(answer),
        Code::FailedPrecondition,
        "ControllerModifyVolume"
    );
    assert!(!is_mounted(&staging), "not staged");
    assert_eq!(std::fs::read(target.join("data")).unwrap(), b"kept");
    csi.node
        .node_unpublish_volume(unpublish_request(id, &target))
        .await
        .unwrap();
    assert!(
        !sandbox.path().join("state/volumes").join(id).exists(),
        "its data went with its pod"
    );
    assert!(csi.list().await.is_empty(), "not listed");
    let snapshots = csi
        .controller
        .list_snapshots(ListSnapshotsRequest::default())
        .await;
    assert!(
        snapshots.unwrap().into_inner().entries.is_empty(),
        "no snapshot"
    );
    assert!(
        sandbox.mounts().is_empty(),
        "no mount left: {:?}",
        sandbox.mounts()
    );
    server.stop().await;
}
