//! Block volumes' content and their refusals: a snapshot of a staged block volume carries
//! what was written through its device (even writes still in the device's cache), restores
//! and clones carry the file (larger restores grown, sharing extents on XFS), and every
//! mismatch of access types gets its code.

use std::collections::HashMap;

use crate::common::csi_block::*;
use crate::common::csi_node::*;
use crate::common::csi_snapshots::*;
use crate::common::scratch_fs::Kind;
use csi_nodekit::proto::csi::*;
use tonic::Code;

fn checksum(path: &std::path::Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    std::fs::read(path).expect("read").hash(&mut hasher);
    hasher.finish()
}

#[ignore = "needs root: real loop devices, XFS and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_restores_and_clones_of_a_staged_block_volume_carry_what_its_device_wrote() {
    let (node, server, mut csi) = start_block_node(Kind::Xfs).await;
    let (state, sandbox) = (node.state.clone(), &node.sandbox);
    let id = csi.create_block("pvc-src", 16 * MIB).await.volume_id;
    let (staging, target) = (sandbox.dir("staging"), sandbox.dir("pods").join("dev"));
    csi.attach_block(&id, &staging, &target, false).await;
    let data = pattern(0x5a, 2 << 20);
    // Written, not synced, and held open as a pod would (the last close would write it back):
    // the device's page cache holds it until the snapshot flushes it.
    let dev = std::fs::OpenOptions::new()
        .write(true)
        .open(&target)
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&dev, &data, 3 * MIB).unwrap();
    let snapshot = csi.snapshot("snap", &id).await;
    drop(dev);
    assert_eq!(snapshot.size_bytes, (16 * MIB) as i64);
    let snap_file = state
        .join("snapshots")
        .join(&snapshot.snapshot_id)
        .join("volume.img");
    assert!(
        read_at(&snap_file, 3 * MIB, data.len()) == data,
        "flushed before the copy"
    );

    let free = node.fs.free_bytes();
    let restored = csi
        .create_from(CreateVolumeRequest {
            volume_capabilities: vec![block_cap()],
            ..from_snapshot("restored", (32 * MIB) as i64, &snapshot.snapshot_id)
        })
        .await;
    assert!(restored.content_source.is_some(), "the source is echoed");
    assert_eq!(restored.capacity_bytes, (32 * MIB) as i64);
    let restored_file = image(&state, &restored.volume_id);
    assert_eq!(
        std::fs::metadata(&restored_file).unwrap().len(),
        32 * MIB,
        "grown"
    );
    let cost = free.saturating_sub(node.fs.free_bytes());
    assert!(
        cost < MIB,
        "a reflinked restore of 2 MiB of data cost {cost} bytes"
    );
    let cloned = csi
        .create_from(CreateVolumeRequest {
            volume_capabilities: vec![block_cap()],
            ..from_volume("cloned", 0, &id)
        })
        .await;
    assert_eq!(
        cloned.capacity_bytes,
        (16 * MIB) as i64,
        "the source's size"
    );
    assert_eq!(
        checksum(&image(&state, &cloned.volume_id)),
        checksum(&image(&state, &id))
    );

    let target2 = sandbox.path().join("pods/restored");
    let staging2 = sandbox.dir("staging2");
    csi.attach_block(&restored.volume_id, &staging2, &target2, false)
        .await;
    assert!(
        read_at(&target2, 3 * MIB, data.len()) == data,
        "through the restored device"
    );

    for request in [
        from_snapshot("as-mount", 0, &snapshot.snapshot_id),
        from_volume("as-mount-clone", 0, &id),
    ] {
        let reply = csi.controller.create_volume(request).await;
        assert_eq!(
            code(reply),
            Code::InvalidArgument,
            "a block source for a mount volume"
        );
    }
    let mount = create(&mut csi, "mount-vol", MIB as i64).await;
    let mount_snapshot = csi.snapshot("mount-snap", &mount).await;
    let request = CreateVolumeRequest {
        volume_capabilities: vec![block_cap()],
        ..from_snapshot("block-from-mount", 0, &mount_snapshot.snapshot_id)
    };
    let reply = csi.controller.create_volume(request).await;
    assert_eq!(
        code(reply),
        Code::InvalidArgument,
        "a mount source for a block volume"
    );

    csi.detach_block(&restored.volume_id, &staging2, &target2)
        .await;
    csi.detach_block(&id, &staging, &target).await;
    server.stop().await;
}

fn parameters(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    (pairs.iter())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn access_types_are_kept_apart_with_the_codes_the_spec_names() {
    let (sandbox, server, mut csi) = setup().await;
    let block = csi.create_block("pvc-b", MIB).await.volume_id;
    let mount = create(&mut csi, "pvc-m", MIB as i64).await;
    let c = &mut csi.controller;
    assert_eq!(
        code(c.create_volume(create_request("pvc-b", MIB as i64)).await),
        Code::AlreadyExists
    );
    assert_eq!(
        code(c.create_volume(block_create("pvc-m", MIB)).await),
        Code::AlreadyExists
    );
    let mixed = CreateVolumeRequest {
        volume_capabilities: vec![block_cap(), rwo()],
        ..create_request("pvc-mixed", MIB as i64)
    };
    assert_eq!(code(c.create_volume(mixed).await), Code::InvalidArgument);
    // Whole sectors: rounded up within the range, OUT_OF_RANGE beyond it.
    let odd = c
        .create_volume(block_create("pvc-odd", 1000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(odd.volume.unwrap().capacity_bytes, 1024);
    let tight = CreateVolumeRequest {
        capacity_range: Some(CapacityRange {
            required_bytes: 1000,
            limit_bytes: 1000,
        }),
        ..block_create("pvc-tight", 0)
    };
    assert_eq!(code(c.create_volume(tight).await), Code::OutOfRange);
    let with_class = CreateVolumeRequest {
        mutable_parameters: parameters(&[("rootMode", "0700")]),
        ..block_create("pvc-class", MIB)
    };
    assert_eq!(
        code(c.create_volume(with_class).await),
        Code::InvalidArgument
    );
    let modify = ControllerModifyVolumeRequest {
        volume_id: block.clone(),
        mutable_parameters: parameters(&[("rootMode", "0700")]),
        ..Default::default()
    };
    assert_eq!(
        code(c.controller_modify_volume(modify).await),
        Code::InvalidArgument
    );
    for (id, caps, confirmed) in [
        (&block, vec![block_cap()], true),
        (&block, vec![rwo()], false),
        (&mount, vec![rwo()], true),
        (&mount, vec![block_cap()], false),
    ] {
        let request = ValidateVolumeCapabilitiesRequest {
            volume_id: id.clone(),
            volume_capabilities: caps,
            ..Default::default()
        };
        let reply = c
            .validate_volume_capabilities(request)
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            reply.confirmed.is_some(),
            confirmed,
            "{id}: {}",
            reply.message
        );
    }
    // Node calls: the spec's "exceeds capabilities", before anything is attached or mounted.
    let staging = sandbox.dir("staging");
    let target = sandbox.dir("pods").join("t");
    let n = &mut csi.node;
    assert_eq!(
        code(n.node_stage_volume(stage_request(&block, &staging)).await),
        Code::FailedPrecondition
    );
    assert_eq!(
        code(n.node_stage_volume(block_stage(&mount, &staging)).await),
        Code::FailedPrecondition
    );
    let publish = block_publish(&mount, &staging, &target, false);
    assert_eq!(
        code(n.node_publish_volume(publish).await),
        Code::FailedPrecondition
    );
    let publish = block_publish(&block, &staging, &target, false);
    assert_eq!(
        code(n.node_publish_volume(publish).await),
        Code::FailedPrecondition,
        "not staged"
    );
    assert!(!target.exists(), "a refused publish creates nothing");
    server.stop().await;
}
