//! csi-sanity's Node Service specs (`node.go`), with its full-workflow test (`runControllerTest`).

use std::collections::HashMap;

use csi_nodekit::proto::csi::*;
use tonic::Code;

use super::*;

pub async fn node_get_capabilities_returns_only_capabilities_csi_sanity_knows(s: &mut Sanity) {
    use node_service_capability::{Type as Kind, rpc::Type};
    const KNOWN: [Type; 7] = [
        Type::Unknown,
        Type::StageUnstageVolume,
        Type::GetVolumeStats,
        Type::ExpandVolume,
        Type::VolumeCondition,
        Type::SingleNodeMultiWriter,
        Type::VolumeMountGroup,
    ];
    let reply = s
        .csi
        .node
        .node_get_capabilities(NodeGetCapabilitiesRequest {});
    let caps = reply
        .await
        .expect("NodeGetCapabilities")
        .into_inner()
        .capabilities;
    let kinds: Vec<Type> = (caps.iter())
        .map(|cap| match &cap.r#type {
            Some(Kind::Rpc(rpc)) => Type::try_from(rpc.r#type).expect("a known RPC type"),
            None => panic!("csi-sanity fails on a capability without an RPC"),
        })
        .collect();
    for kind in &kinds {
        assert!(KNOWN.contains(kind), "csi-sanity fails on {kind:?}");
    }
    // What decides which node specs run: staging, stats, expansion, single-writer checks.
    for needed in [
        Type::StageUnstageVolume,
        Type::GetVolumeStats,
        Type::ExpandVolume,
        Type::SingleNodeMultiWriter,
    ] {
        assert!(kinds.contains(&needed), "{needed:?} advertised");
    }
}

pub async fn node_get_info_returns_a_node_id_a_volume_limit_and_a_topology(s: &mut Sanity) {
    let info = s.node_info().await;
    assert!(info.max_volumes_per_node >= 0);
    // VOLUME_ACCESSIBILITY_CONSTRAINTS is advertised, so a topology is due.
    assert!(info.accessible_topology.is_some());
}

pub async fn node_publish_volume_fails_without_a_volume_id(s: &mut Sanity) {
    let reply = s
        .csi
        .node
        .node_publish_volume(NodePublishVolumeRequest::default());
    assert_eq!(code(reply.await), Code::InvalidArgument);
}

pub async fn node_publish_volume_fails_without_a_target_path(s: &mut Sanity) {
    let request = NodePublishVolumeRequest {
        volume_id: unknown_volume_id(),
        ..Default::default()
    };
    assert_eq!(
        code(s.csi.node.node_publish_volume(request).await),
        Code::InvalidArgument
    );
}

pub async fn node_publish_volume_fails_without_a_volume_capability(s: &mut Sanity) {
    let request = NodePublishVolumeRequest {
        volume_id: unknown_volume_id(),
        target_path: s.target().display().to_string(),
        ..Default::default()
    };
    assert_eq!(
        code(s.csi.node.node_publish_volume(request).await),
        Code::InvalidArgument
    );
}

pub async fn node_publish_volume_of_a_single_writer_volume_at_a_second_target_fails_the_precondition(
    s: &mut Sanity,
) {
    let cap = s.cap(Mode::SingleNodeSingleWriter);
    let single = || cap.clone();
    let name = s.unique("sanity-node-publish-single-node-single-writer");
    let request = CreateVolumeRequest {
        volume_capabilities: vec![single()],
        ..s.create_request(&name)
    };
    let id = s.must_create(request).await.volume_id;
    s.stage(&id, single()).await;
    s.publish(&id, single()).await;
    let other = s.mount_dir.join("other_target");
    let second = s.publish_request(&id, &other, single());
    let reply = s.csi.node.node_publish_volume(second).await;
    assert_eq!(code(reply), Code::FailedPrecondition);
    assert!(!other.exists(), "a refused publish creates nothing");
}

pub async fn node_unpublish_volume_fails_without_a_volume_id(s: &mut Sanity) {
    let reply = s
        .csi
        .node
        .node_unpublish_volume(NodeUnpublishVolumeRequest::default());
    assert_eq!(code(reply.await), Code::InvalidArgument);
}

pub async fn node_unpublish_volume_fails_without_a_target_path(s: &mut Sanity) {
    let reply = s
        .csi
        .node
        .node_unpublish_volume(unpublish_request(&unknown_volume_id(), Path::new("")));
    assert_eq!(code(reply.await), Code::InvalidArgument);
}

pub async fn node_unpublish_volume_removes_the_target_path(s: &mut Sanity) {
    let id = s.published_volume("sanity-node-unpublish-volume").await;
    let target = s.target();
    // csi-sanity's CheckPath: a directory for a mount volume, a device node for a block one.
    let meta = std::fs::metadata(&target).expect("the plugin created the target path");
    use std::os::unix::fs::FileTypeExt;
    assert!(
        meta.is_dir() || meta.file_type().is_block_device(),
        "{meta:?}"
    );
    let reply = s
        .csi
        .node
        .node_unpublish_volume(unpublish_request(&id, &target))
        .await;
    reply.expect("NodeUnpublishVolume");
    assert!(!target.exists(), "the plugin removed the target path");
}

/// A stage request as csi-sanity sends its incomplete ones: with a publish context naming a
/// device, which a plugin without ControllerPublish must ignore.
fn stage_with_device(
    id: &str,
    staging: &Path,
    cap: Option<VolumeCapability>,
) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: cap,
        publish_context: HashMap::from([("device".into(), "/dev/mock".into())]),
        ..Default::default()
    }
}

pub async fn node_stage_volume_fails_without_a_volume_id(s: &mut Sanity) {
    let request = stage_with_device("", &s.staging, Some(s.rwo()));
    assert_eq!(
        code(s.csi.node.node_stage_volume(request).await),
        Code::InvalidArgument
    );
}

pub async fn node_stage_volume_fails_without_a_staging_target_path(s: &mut Sanity) {
    let request = stage_with_device(&unknown_volume_id(), Path::new(""), Some(s.rwo()));
    assert_eq!(
        code(s.csi.node.node_stage_volume(request).await),
        Code::InvalidArgument
    );
}

pub async fn node_stage_volume_fails_without_a_volume_capability(s: &mut Sanity) {
    let name = s.unique("sanity-node-stage-nocaps");
    // A mount capability even in block mode, as csi-sanity hard-codes it here.
    let mount = CreateVolumeRequest {
        volume_capabilities: vec![rwo()],
        ..s.create_request(&name)
    };
    let id = s.must_create(mount).await.volume_id;
    let request = stage_with_device(&id, &s.staging, None);
    assert_eq!(
        code(s.csi.node.node_stage_volume(request).await),
        Code::InvalidArgument
    );
}

pub async fn node_unstage_volume_fails_without_a_volume_id(s: &mut Sanity) {
    let reply = s
        .csi
        .node
        .node_unstage_volume(unstage_request("", &s.staging));
    assert_eq!(code(reply.await), Code::InvalidArgument);
}

pub async fn node_unstage_volume_fails_without_a_staging_target_path(s: &mut Sanity) {
    let request = unstage_request(&unknown_volume_id(), Path::new(""));
    assert_eq!(
        code(s.csi.node.node_unstage_volume(request).await),
        Code::InvalidArgument
    );
}

pub async fn node_get_volume_stats_fails_without_a_volume_id(s: &mut Sanity) {
    let reply = s
        .csi
        .node
        .node_get_volume_stats(stats_request("", "some/path"));
    assert_eq!(code(reply.await), Code::InvalidArgument);
}

pub async fn node_get_volume_stats_fails_without_a_volume_path(s: &mut Sanity) {
    let reply = s
        .csi
        .node
        .node_get_volume_stats(stats_request(&unknown_volume_id(), ""));
    assert_eq!(code(reply.await), Code::InvalidArgument);
}

pub async fn node_get_volume_stats_fails_with_not_found_for_an_unknown_volume(s: &mut Sanity) {
    let reply = s
        .csi
        .node
        .node_get_volume_stats(stats_request(&unknown_volume_id(), "some/path"));
    assert_eq!(code(reply.await), Code::NotFound);
}

pub async fn node_get_volume_stats_fails_with_not_found_when_the_volume_is_not_at_the_path(
    s: &mut Sanity,
) {
    let id = s.published_volume("sanity-node-get-volume-stats").await;
    let reply = s
        .csi
        .node
        .node_get_volume_stats(stats_request(&id, "some/path"));
    assert_eq!(code(reply.await), Code::NotFound);
}

fn node_expand_request(
    s: &Sanity,
    id: &str,
    path: &str,
    size: Option<i64>,
) -> NodeExpandVolumeRequest {
    NodeExpandVolumeRequest {
        volume_id: id.into(),
        volume_path: path.into(),
        capacity_range: size.map(|required_bytes| CapacityRange {
            required_bytes,
            limit_bytes: 0,
        }),
        volume_capability: Some(s.rwo()),
        ..Default::default()
    }
}

pub async fn node_expand_volume_fails_without_a_volume_id(s: &mut Sanity) {
    let request = node_expand_request(s, "", &s.mount_dir.display().to_string(), None);
    assert_eq!(
        code(s.csi.node.node_expand_volume(request).await),
        Code::InvalidArgument
    );
}

pub async fn node_expand_volume_fails_without_a_volume_path(s: &mut Sanity) {
    let name = s.unique("sanity-node-expand-volume-valid-id");
    let id = s.must_create(s.create_request(&name)).await.volume_id;
    let request = node_expand_request(s, &id, "", None);
    assert_eq!(
        code(s.csi.node.node_expand_volume(request).await),
        Code::InvalidArgument
    );
}

pub async fn node_expand_volume_fails_with_not_found_for_an_unknown_volume(s: &mut Sanity) {
    let request = NodeExpandVolumeRequest {
        volume_capability: None,
        ..node_expand_request(s, &unknown_volume_id(), "some/path", None)
    };
    assert_eq!(
        code(s.csi.node.node_expand_volume(request).await),
        Code::NotFound
    );
}

pub async fn node_expand_volume_works_after_node_publish(s: &mut Sanity) {
    let name = s.unique("sanity-node-expand-volume");
    let id = s.must_create(s.create_request(&name)).await.volume_id;
    let grown = s
        .csi
        .controller
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: id.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: s.expand_size(),
                limit_bytes: 0,
            }),
            ..Default::default()
        });
    let grown = grown.await.expect("ControllerExpandVolume").into_inner();
    assert_eq!(grown.capacity_bytes, s.expand_size());
    if s.image() && !csi_nodekit::linux::privilege::holds_quota_override() {
        return an_image_grows_only_with_cap_sys_resource(s, &id).await;
    }
    s.stage(&id, s.rwo()).await;
    s.publish(&id, s.rwo()).await;
    let target = s.target().display().to_string();
    let request = node_expand_request(s, &id, &target, Some(s.expand_size()));
    s.csi
        .node
        .node_expand_volume(request)
        .await
        .expect("while expanding volume on node");
}

/// An image volume expanded before its first stage grows its filesystem at that stage, which
/// the kernel allows only with CAP_SYS_RESOURCE (`EXT4_IOC_RESIZE_FS`). Without it (the build
/// machines' root) the stage must say so, and leave nothing staged; the quota VM's growth case
/// (`booted::quota_vm::grown`) expands image volumes, published and unstaged, where root has it.
async fn an_image_grows_only_with_cap_sys_resource(s: &mut Sanity, id: &str) {
    let request = NodeStageVolumeRequest {
        volume_capability: Some(s.rwo()),
        ..stage_request(id, &s.staging)
    };
    let refused = s.csi.node.node_stage_volume(request).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("CAP_SYS_RESOURCE"),
        "{refused:?}"
    );
    let table = csi_nodekit::linux::mountinfo::MountTable::read().unwrap();
    let left = table.mounts_under(&s.staging).count();
    assert_eq!(left, 0, "nothing is left staged");
    eprintln!(
        "NOTE: this process lacks CAP_SYS_RESOURCE, so the grown image volume's stage was \
         refused as documented (FAILED_PRECONDITION naming the capability); the quota VM's \
         growth case runs the successful path"
    );
}

/// `runControllerTest`: create where NodeGetInfo says (topology), stage and publish `count`
/// times each, then the volume's stats at the target.
async fn full_workflow(s: &mut Sanity, count: usize) {
    let info = s.node_info().await;
    let request = CreateVolumeRequest {
        accessibility_requirements: (info.accessible_topology).map(|t| TopologyRequirement {
            requisite: vec![t],
            preferred: vec![],
        }),
        ..s.with_access(create_request(
            &s.unique(&format!("sanity-node-full-{count}")),
            s.size,
        ))
    };
    let id = s.must_create(request).await.volume_id;
    for _ in 0..count {
        s.stage(&id, s.rwo()).await;
    }
    for _ in 0..count {
        s.publish(&id, s.rwo()).await;
    }
    let target = s.target().display().to_string();
    let stats = s
        .csi
        .node
        .node_get_volume_stats(stats_request(&id, &target))
        .await;
    // csi-sanity is Go: an empty repeated field arrives as nil, which it refuses.
    assert!(
        !stats
            .expect("NodeGetVolumeStats")
            .into_inner()
            .usage
            .is_empty()
    );
}

pub async fn the_node_service_works_from_create_to_stats(s: &mut Sanity) {
    full_workflow(s, 1).await;
}

pub async fn the_node_service_is_idempotent_when_every_call_is_repeated_ten_times(s: &mut Sanity) {
    full_workflow(s, IDEMPOTENT_COUNT).await;
    // Ten publishes, one mount each at the staging and the target path (a block volume is
    // staged on a loop device: nothing is mounted at its staging path).
    let staged = mounts_at(&s.staging);
    let published = mounts_at(&s.target());
    assert_eq!((staged, published), (usize::from(!s.block), 1));
}
