//! Access modes and inline volumes through the real binary: reader-only volumes published
//! with `readonly=false`, a SINGLE_NODE_SINGLE_WRITER volume staged at a second path, and an
//! inline ephemeral volume sent NodeStage, CreateSnapshot, ControllerExpand and
//! ControllerModify. Each refused with the spec's code (or published read-only), nothing
//! written, and nothing left behind once the inline volume is unpublished.

use std::collections::HashMap;

use super::tally::Tally;
use crate::common::csi_node::*;
use crate::common::spawn_node_server;
use csi_nodekit::proto::csi::volume_capability::access_mode::Mode;
use csi_nodekit::proto::csi::*;
use tonic::Code;

const ROUNDS: usize = 4;

fn answer<T>(result: Result<tonic::Response<T>, tonic::Status>) -> Code {
    result.map_or_else(|s| s.code(), |_| Code::Ok)
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_modes_and_inline_volumes_are_enforced_by_the_real_binary() {
    let sandbox = MountSandbox::new();
    let socket = sandbox.path().join("csi.sock");
    let _process = spawn_node_server(&socket, &sandbox.path().join("state"), &[]);
    assert!(super::processes::probe_ready(&socket).await, "node-server");
    let mut csi = connect(&socket).await;
    let mut tally = Tally::new(
        "reader-only publishes with readonly=false, a second staging path for SINGLE_NODE_SINGLE_WRITER, \
         NodeStage/CreateSnapshot/ControllerExpand/ControllerModify of an inline volume",
    );
    for round in 0..ROUNDS {
        let reader = create(&mut csi, &format!("pvc-ro-{round}"), 1 << 20).await;
        let staging = sandbox.dir(&format!("r{round}/s"));
        let target = sandbox.dir(&format!("r{round}/pods")).join("ro");
        let cap = capability(Mode::SingleNodeReaderOnly, &[]);
        let stage = NodeStageVolumeRequest {
            volume_capability: Some(cap.clone()),
            ..stage_request(&reader, &staging)
        };
        csi.node.node_stage_volume(stage).await.unwrap();
        let publish = NodePublishVolumeRequest {
            volume_capability: Some(cap),
            ..publish_request(&reader, &staging, &target, false)
        };
        let published = answer(csi.node.node_publish_volume(publish).await);
        let refused_write = std::fs::write(target.join("f"), b"x").is_err();
        tally.check(
            published == Code::Ok && is_readonly(&target) && refused_write,
            format_args!(
                "round {round}: reader-only published {published:?}, read-only: {}",
                is_readonly(&target)
            ),
        );
        csi.unpublish_and_unstage(&reader, &target, &staging).await;

        let single = create(&mut csi, &format!("pvc-snsw-{round}"), 1 << 20).await;
        let (first, second) = (
            sandbox.dir(&format!("r{round}/a")),
            sandbox.dir(&format!("r{round}/b")),
        );
        let stage = |path| NodeStageVolumeRequest {
            volume_capability: Some(capability(Mode::SingleNodeSingleWriter, &[])),
            ..stage_request(&single, path)
        };
        csi.node.node_stage_volume(stage(&first)).await.unwrap();
        let got = answer(csi.node.node_stage_volume(stage(&second)).await);
        tally.check(
            got == Code::FailedPrecondition && !is_mounted(&second),
            format_args!("round {round}: second staging path {got:?}"),
        );
        csi.node
            .node_unstage_volume(unstage_request(&single, &first))
            .await
            .unwrap();

        let inline = format!("csi-inline-{round}");
        let pod = sandbox.dir(&format!("r{round}/pods")).join("inline");
        let publish = NodePublishVolumeRequest {
            volume_id: inline.clone(),
            target_path: pod.display().to_string(),
            volume_capability: Some(rwo()),
            volume_context: HashMap::from([
                ("csi.storage.k8s.io/ephemeral".into(), "true".into()),
                ("size".into(), "1Mi".into()),
            ]),
            ..Default::default()
        };
        csi.node.node_publish_volume(publish).await.unwrap();
        let inline_staging = sandbox.dir(&format!("r{round}/inline-s"));
        let calls = [
            (
                "NodeStageVolume",
                answer(
                    csi.node
                        .node_stage_volume(stage_request(&inline, &inline_staging))
                        .await,
                ),
            ),
            (
                "CreateSnapshot",
                answer(
                    csi.controller
                        .create_snapshot(CreateSnapshotRequest {
                            name: format!("snap-{round}"),
                            source_volume_id: inline.clone(),
                            ..Default::default()
                        })
                        .await,
                ),
            ),
            (
                "ControllerExpandVolume",
                answer(
                    csi.controller
                        .controller_expand_volume(ControllerExpandVolumeRequest {
                            volume_id: inline.clone(),
                            capacity_range: Some(CapacityRange {
                                required_bytes: 2 << 20,
                                limit_bytes: 0,
                            }),
                            ..Default::default()
                        })
                        .await,
                ),
            ),
            (
                "ControllerModifyVolume",
                answer(
                    csi.controller
                        .controller_modify_volume(ControllerModifyVolumeRequest {
                            volume_id: inline.clone(),
                            mutable_parameters: HashMap::from([("rootMode".into(), "0700".into())]),
                            ..Default::default()
                        })
                        .await,
                ),
            ),
        ];
        for (call, got) in calls {
            tally.check(
                got == Code::FailedPrecondition,
                format_args!("round {round}: inline {call}: {got:?}"),
            );
        }
        csi.node
            .node_unpublish_volume(unpublish_request(&inline, &pod))
            .await
            .unwrap();
        let leaked = sandbox.path().join("state/volumes").join(&inline).exists()
            || csi.list().await.iter().any(|v| v.volume_id == inline)
            || is_mounted(&inline_staging);
        tally.check(
            !leaked,
            format_args!("round {round}: the inline volume left something behind"),
        );
    }
    tally.finish();
}
