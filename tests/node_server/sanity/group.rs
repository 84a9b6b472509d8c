//! csi-sanity's GroupController specs (`groupcontroller.go`). Each runs only when Identity
//! lists GROUP_CONTROLLER_SERVICE, which is checked first as csi-sanity's BeforeEach does; the
//! snapshot specs also need CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT. csi-sanity never creates a
//! group successfully (our own tests in `node_server::group_snapshots` do).

use csi_nodekit::proto::csi::*;
use tonic::Code;

use super::*;

/// csi-sanity's BeforeEach: the group controller must be advertised, or every spec skips. Here
/// it must be, so a missing capability fails rather than skips.
async fn group_controller_is_advertised(s: &mut Sanity) {
    use plugin_capability::{Type, service};
    let reply = s
        .csi
        .identity
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {});
    let caps = reply.await.expect("GetPluginCapabilities").into_inner();
    let group = service::Type::GroupControllerService as i32;
    assert!(
        (caps.capabilities.iter())
            .any(|c| matches!(&c.r#type, Some(Type::Service(s)) if s.r#type == group)),
        "GROUP_CONTROLLER_SERVICE is not advertised"
    );
}

pub async fn group_controller_get_capabilities_returns_only_capabilities_csi_sanity_knows(
    s: &mut Sanity,
) {
    use group_controller_service_capability::{Type, rpc};
    group_controller_is_advertised(s).await;
    let reply = s
        .csi
        .group
        .group_controller_get_capabilities(GroupControllerGetCapabilitiesRequest {});
    let caps = reply.await.expect("GroupControllerGetCapabilities");
    let caps = caps.into_inner().capabilities;
    // An empty list decodes to nil in Go, which csi-sanity fails.
    assert!(!caps.is_empty());
    for cap in &caps {
        let Some(Type::Rpc(rpc)) = &cap.r#type else {
            panic!("csi-sanity fails on a capability without an RPC: {cap:?}");
        };
        assert_eq!(
            rpc::Type::try_from(rpc.r#type),
            Ok(rpc::Type::CreateDeleteGetVolumeGroupSnapshot),
            "csi-sanity fails on an unknown capability"
        );
    }
}

pub async fn create_volume_group_snapshot_fails_without_a_name(s: &mut Sanity) {
    group_controller_is_advertised(s).await;
    let reply = s
        .csi
        .group
        .create_volume_group_snapshot(CreateVolumeGroupSnapshotRequest::default());
    assert_eq!(code(reply.await), Code::InvalidArgument);
}

pub async fn get_volume_group_snapshot_fails_without_a_group_snapshot_id(s: &mut Sanity) {
    group_controller_is_advertised(s).await;
    let reply = s
        .csi
        .group
        .get_volume_group_snapshot(GetVolumeGroupSnapshotRequest::default());
    assert_eq!(code(reply.await), Code::InvalidArgument);
}

/// With no `snapshot_ids` (REQUIRED in the spec): the group is looked up first.
pub async fn get_volume_group_snapshot_fails_with_not_found_for_an_invalid_id(s: &mut Sanity) {
    group_controller_is_advertised(s).await;
    let request = GetVolumeGroupSnapshotRequest {
        group_snapshot_id: INVALID_VOLUME_ID.into(),
        ..Default::default()
    };
    let reply = s.csi.group.get_volume_group_snapshot(request).await;
    assert_eq!(code(reply), Code::NotFound);
}

pub async fn delete_volume_group_snapshot_fails_without_a_group_snapshot_id(s: &mut Sanity) {
    group_controller_is_advertised(s).await;
    let reply = s
        .csi
        .group
        .delete_volume_group_snapshot(DeleteVolumeGroupSnapshotRequest::default());
    assert_eq!(code(reply.await), Code::InvalidArgument);
}

/// With no `snapshot_ids`, as for Get: gone already is done.
pub async fn delete_volume_group_snapshot_succeeds_for_an_invalid_id(s: &mut Sanity) {
    group_controller_is_advertised(s).await;
    let request = DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: INVALID_VOLUME_ID.into(),
        ..Default::default()
    };
    let reply = s.csi.group.delete_volume_group_snapshot(request).await;
    reply.expect("DeleteVolumeGroupSnapshot of an ID that names nothing");
}
