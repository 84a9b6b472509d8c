//! The external-resizer's node-only path, as a cluster-wide resizer with its "trivial
//! resizer" leaves it: no ControllerExpandVolume, only the kubelet's NodeExpandVolume on the
//! volume's node with the size the PV now records. node-server grows the volume to that size
//! itself — the record here, a directory's limit; a raw block volume's file and devices in
//! `block.rs`; an image volume's filesystem in `booted::quota_vm`, where the kernel lets it
//! grow — and refuses what expansion refuses, with the spec's codes.

use crate::common::csi_node::*;
use csi_nodekit::proto::csi::*;
use tonic::Code;

fn node_expand(
    id: &str,
    path: &std::path::Path,
    required: u64,
    limit: u64,
) -> NodeExpandVolumeRequest {
    NodeExpandVolumeRequest {
        volume_id: id.into(),
        volume_path: path.display().to_string(),
        capacity_range: Some(CapacityRange {
            required_bytes: required as i64,
            limit_bytes: limit as i64,
        }),
        ..Default::default()
    }
}

async fn recorded(csi: &mut Csi, id: &str) -> i64 {
    let listed = csi.list().await;
    listed
        .iter()
        .find(|v| v.volume_id == id)
        .expect("listed")
        .capacity_bytes
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_expand_volume_alone_grows_a_directory_volume_to_the_size_it_asks() {
    let (sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-node-only", 1 << 20).await;
    let (staging, target) = (sandbox.dir("staging"), sandbox.dir("pods").join("rw"));
    csi.stage_and_publish(&id, &staging, &target, false).await;

    for round in ["first", "repeated"] {
        let reply = csi
            .node
            .node_expand_volume(node_expand(&id, &target, 3 << 20, 0));
        let reply = reply.await.expect(round).into_inner();
        assert_eq!(reply.capacity_bytes, 3 << 20, "{round}");
        assert_eq!(recorded(&mut csi, &id).await, 3 << 20, "{round}: recorded");
    }
    // Without a range the size recorded holds; a smaller size asked never shrinks it.
    let plain = NodeExpandVolumeRequest {
        capacity_range: None,
        ..node_expand(&id, &target, 0, 0)
    };
    let reply = csi.node.node_expand_volume(plain).await.expect("no range");
    assert_eq!(reply.into_inner().capacity_bytes, 3 << 20);
    let reply = csi
        .node
        .node_expand_volume(node_expand(&id, &target, 2 << 20, 0));
    assert_eq!(
        reply.await.expect("smaller").into_inner().capacity_bytes,
        3 << 20
    );
    // A limit under the size it has: the spec's OUT_OF_RANGE, nothing changed.
    let reply = csi
        .node
        .node_expand_volume(node_expand(&id, &target, 1 << 20, 2 << 20));
    assert_eq!(code(reply.await), Code::OutOfRange);
    // More than the node has room for (its --capacity is 64 MiB): refused, nothing changed.
    let reply = csi
        .node
        .node_expand_volume(node_expand(&id, &target, 1 << 30, 0));
    let status = reply.await.expect_err("beyond the node's capacity");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert_eq!(recorded(&mut csi, &id).await, 3 << 20);

    csi.unpublish_and_unstage(&id, &target, &staging).await;
    csi.controller
        .delete_volume(delete_request(&id))
        .await
        .expect("delete");
    server.stop().await;
}
