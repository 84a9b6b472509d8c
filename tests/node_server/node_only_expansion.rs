//! The external-resizer's node-only path, as a cluster-wide resizer with its "trivial
//! resizer" leaves it: no ControllerExpandVolume, only the kubelet's NodeExpandVolume on the
//! volume's node with the size the PV now records. node-server grows the volume to that size
//! itself — the record, a block volume's file and devices (an image volume's filesystem too:
//! `booted::quota_vm`, where the kernel lets it grow) — and refuses what expansion refuses,
//! with the spec's codes.

use crate::common::csi_block::*;
use crate::common::csi_node::*;
use crate::common::scratch_fs::Kind;
use csi_nodekit::linux::loopdev;
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
    csi.node
        .node_stage_volume(stage_request(&id, &staging))
        .await
        .expect("stage");
    csi.node
        .node_publish_volume(publish_request(&id, &staging, &target, false))
        .await
        .expect("publish");

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

    csi.node
        .node_unpublish_volume(unpublish_request(&id, &target))
        .await
        .expect("unpublish");
    csi.node
        .node_unstage_volume(unstage_request(&id, &staging))
        .await
        .expect("unstage");
    csi.controller
        .delete_volume(delete_request(&id))
        .await
        .expect("delete");
    server.stop().await;
}

#[ignore = "needs root: real loop devices and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_expand_volume_alone_grows_a_published_block_volume_online() {
    let (node, server, mut csi) = start_block_node(Kind::Ext4).await;
    let (state, sandbox) = (node.state.clone(), &node.sandbox);
    let id = csi
        .create_block("pvc-node-only-dev", 8 * MIB)
        .await
        .volume_id;
    let (staging, target) = (sandbox.dir("staging"), sandbox.dir("pods").join("dev"));
    csi.attach_block(&id, &staging, &target, false).await;
    let data = pattern(7, 4096);
    write_at(&target, 0, &data).unwrap();
    // A pod holding the device open all along.
    let held = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&target)
        .unwrap();
    let reply = csi
        .node
        .node_expand_volume(node_expand(&id, &target, 16 * MIB, 0))
        .await
        .expect("node-only expansion")
        .into_inner();
    assert_eq!(reply.capacity_bytes, (16 * MIB) as i64);
    assert_eq!(
        std::fs::metadata(image(&state, &id)).unwrap().len(),
        16 * MIB
    );
    let (rw, _) = devices(&state, &id);
    assert_eq!(loopdev::size(rw[0]).unwrap(), 16 * MIB, "the device told");
    assert_eq!(recorded(&mut csi, &id).await, (16 * MIB) as i64);
    use std::os::unix::fs::FileExt;
    held.write_all_at(&data, 12 * MIB)
        .expect("write past the old end");
    held.sync_all().unwrap();
    assert!(read_at(&target, 0, data.len()) == data, "the data kept");
    assert!(
        read_at(&target, 12 * MIB, data.len()) == data,
        "the data written"
    );
    drop(held);
    csi.detach_block(&id, &staging, &target).await;
    server.stop().await;
}
