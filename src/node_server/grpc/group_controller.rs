//! The CSI GroupController service: group snapshots of this node's volumes (create, delete,
//! get). The members are cut together (one sync, then parallel copies; see
//! `snapshots::take`), recorded, and only then the group; they are deleted with it. Failures
//! get their codes from the snapshot table, `controller_snapshots::status`.

use std::collections::HashSet;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::node_server::driver::Driver;
use crate::node_server::grpc::controller_snapshots::{message, status, timestamp};
use crate::node_server::grpc::field_limits::SizeLimits;
use crate::node_server::grpc::validate;
use crate::node_server::state::snapshots::{Group, Snapshot};
use crate::proto::csi::{
    CreateVolumeGroupSnapshotRequest, CreateVolumeGroupSnapshotResponse,
    DeleteVolumeGroupSnapshotRequest, DeleteVolumeGroupSnapshotResponse,
    GetVolumeGroupSnapshotRequest, GetVolumeGroupSnapshotResponse,
    GroupControllerGetCapabilitiesRequest, GroupControllerGetCapabilitiesResponse,
    GroupControllerServiceCapability, VolumeGroupSnapshot,
    group_controller_server::GroupController, group_controller_service_capability,
};

pub struct GroupControllerService(pub(in crate::node_server) Arc<Driver>);

/// A group as the CO sees it, with every member in full (external-snapshotter maps each
/// member's `source_volume_id` to its `snapshot_id`, on a repeated create too).
fn group_message((group, members): (Group, Vec<Snapshot>)) -> VolumeGroupSnapshot {
    VolumeGroupSnapshot {
        group_snapshot_id: group.id,
        snapshots: members.iter().map(message).collect(),
        creation_time: Some(timestamp(group.created)),
        ready_to_use: true,
    }
}

/// A required list of volume IDs, each well-formed and none twice.
fn id_list(field: &str, ids: &[String]) -> Result<(), Status> {
    if ids.is_empty() {
        return Err(Status::invalid_argument(format!("{field} is required")));
    }
    let mut seen = HashSet::new();
    for id in ids {
        validate::volume_id_of(field, id)?;
        if !seen.insert(id) {
            return Err(Status::invalid_argument(format!(
                "{field} lists {:?} twice",
                validate::clip(id)
            )));
        }
    }
    Ok(())
}

/// The optional `snapshot_ids` of a delete or get: each a well-formed snapshot ID.
fn snapshot_ids(ids: &[String]) -> Result<(), Status> {
    (ids.iter()).try_for_each(|id| validate::snapshot_id("snapshot_ids", id).map(drop))
}

#[tonic::async_trait]
impl GroupController for GroupControllerService {
    async fn group_controller_get_capabilities(
        &self,
        _: Request<GroupControllerGetCapabilitiesRequest>,
    ) -> Result<Response<GroupControllerGetCapabilitiesResponse>, Status> {
        use group_controller_service_capability::{Rpc, Type, rpc};
        log::trace!("GroupControllerGetCapabilities");
        let capability = GroupControllerServiceCapability {
            r#type: Some(Type::Rpc(Rpc {
                r#type: rpc::Type::CreateDeleteGetVolumeGroupSnapshot as i32,
            })),
        };
        Ok(Response::new(GroupControllerGetCapabilitiesResponse {
            capabilities: vec![capability],
        }))
    }

    async fn create_volume_group_snapshot(
        &self,
        request: Request<CreateVolumeGroupSnapshotRequest>,
    ) -> Result<Response<CreateVolumeGroupSnapshotResponse>, Status> {
        let req = request.into_inner();
        req.check_sizes()?;
        let name = validate::named("name", &req.name)?.to_owned();
        id_list("source_volume_ids", &req.source_volume_ids)?;
        log::trace!(
            "CreateVolumeGroupSnapshot name={name} volumes={}",
            req.source_volume_ids.len()
        );
        let key = format!("group-name/{name}");
        let sources = req.source_volume_ids;
        let work = move |d: &Driver| d.create_group(&name, &sources);
        let group = self.0.claimed(&key, work).await.map_err(status)?;
        Ok(Response::new(CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(group_message(group)),
        }))
    }

    async fn delete_volume_group_snapshot(
        &self,
        request: Request<DeleteVolumeGroupSnapshotRequest>,
    ) -> Result<Response<DeleteVolumeGroupSnapshotResponse>, Status> {
        let req = request.into_inner();
        req.check_sizes()?;
        let id = validate::snapshot_id("group_snapshot_id", &req.group_snapshot_id)?.to_owned();
        snapshot_ids(&req.snapshot_ids)?;
        log::trace!("DeleteVolumeGroupSnapshot group={id}");
        let key = format!("group/{id}");
        let members = req.snapshot_ids;
        let work = move |d: &Driver| d.delete_group(&id, &members);
        self.0.claimed(&key, work).await.map_err(status)?;
        Ok(Response::new(DeleteVolumeGroupSnapshotResponse {}))
    }

    async fn get_volume_group_snapshot(
        &self,
        request: Request<GetVolumeGroupSnapshotRequest>,
    ) -> Result<Response<GetVolumeGroupSnapshotResponse>, Status> {
        let req = request.into_inner();
        req.check_sizes()?;
        let id = validate::snapshot_id("group_snapshot_id", &req.group_snapshot_id)?;
        snapshot_ids(&req.snapshot_ids)?;
        log::trace!("GetVolumeGroupSnapshot group={id}");
        let group = self.0.get_group(id, &req.snapshot_ids).map_err(status)?;
        Ok(Response::new(GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(group_message(group)),
        }))
    }
}
