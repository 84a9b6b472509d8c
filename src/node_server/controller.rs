//! The CSI Controller service for this node's own volumes (external-provisioner's node
//! deployment): create, delete, validate, list, capacity, expand. Volumes are pinned to this
//! node by topology. Snapshots and controller publish are not offered.

use std::sync::Arc;

use tonic::{Code, Request, Response, Status};

use super::driver::Driver;
use super::error::ControllerError;
use super::field_limits::SizeLimits;
use super::quota::QuotaError;
use super::validate::{self, decode_token, encode_token};
use super::volumes::VolumeError as V;
use crate::proto::csi::{
    ControllerExpandVolumeRequest, ControllerExpandVolumeResponse,
    ControllerGetCapabilitiesRequest, ControllerGetCapabilitiesResponse,
    ControllerGetVolumeRequest, ControllerGetVolumeResponse, ControllerModifyVolumeRequest,
    ControllerModifyVolumeResponse, ControllerPublishVolumeRequest,
    ControllerPublishVolumeResponse, ControllerServiceCapability, ControllerUnpublishVolumeRequest,
    ControllerUnpublishVolumeResponse, CreateSnapshotRequest, CreateSnapshotResponse,
    CreateVolumeRequest, CreateVolumeResponse, DeleteSnapshotRequest, DeleteSnapshotResponse,
    DeleteVolumeRequest, DeleteVolumeResponse, GetCapacityRequest, GetCapacityResponse,
    GetSnapshotRequest, GetSnapshotResponse, ListSnapshotsRequest, ListSnapshotsResponse,
    ListVolumesRequest, ListVolumesResponse, ValidateVolumeCapabilitiesRequest,
    ValidateVolumeCapabilitiesResponse, controller_server::Controller,
    controller_service_capability, list_volumes_response,
    validate_volume_capabilities_response::Confirmed,
};

pub struct ControllerService(pub(super) Arc<Driver>);

/// The gRPC code of every failure of a Controller call, as the CSI spec's error tables for
/// CreateVolume, DeleteVolume, ControllerExpandVolume and GetCapacity name them. (Malformed
/// requests are refused earlier, by `validate`, with INVALID_ARGUMENT.)
fn status(error: ControllerError) -> Status {
    use ControllerError as E;
    let code = match &error {
        E::Volume(V::NotFound { .. }) => Code::NotFound,
        // "Volume already exists but is incompatible".
        E::NameTaken { .. } => Code::AlreadyExists,
        // DeleteVolume of a volume that is still mounted.
        E::Volume(V::InUse { .. }) => Code::FailedPrecondition,
        // "Operation pending for volume".
        E::Volume(V::Busy { .. }) => Code::Aborted,
        // "Unable to provision in `accessible_topology`" / out of capacity (or of project
        // IDs to enforce it with).
        E::Volume(V::NoSpace { .. } | V::Quota(QuotaError::Exhausted { .. })) => {
            Code::ResourceExhausted
        }
        // "Unsupported capacity" on expansion.
        E::Volume(V::NoRoomToGrow { .. }) | E::WouldShrink { .. } => Code::OutOfRange,
        E::Volume(V::Unlocatable(_) | V::Io { .. } | V::Store(_) | V::Quota(_))
        | E::Mount(_)
        | E::Worker(_) => Code::Internal,
    };
    Status::new(code, error.to_string())
}

fn rpc(kind: controller_service_capability::rpc::Type) -> ControllerServiceCapability {
    ControllerServiceCapability {
        r#type: Some(controller_service_capability::Type::Rpc(
            controller_service_capability::Rpc {
                r#type: kind as i32,
            },
        )),
    }
}

fn no_block(caps: &[validate::Capability]) -> Result<(), Status> {
    if caps.iter().any(|c| c.block) {
        return Err(Status::invalid_argument(
            "block access is not supported: volumes are directories",
        ));
    }
    Ok(())
}

fn unsupported<T>(what: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!(
        "{what} is not offered by this plugin"
    )))
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let req = request.into_inner();
        req.check_sizes()?;
        let name = validate::name(&req.name)?.to_owned();
        no_block(&validate::capabilities(&req.volume_capabilities)?)?;
        let (required, limit) = validate::capacity_range(req.capacity_range.as_ref())?;
        log::trace!("CreateVolume name={name} required={required} limit={limit}");
        if req.volume_content_source.is_some() {
            return Err(Status::invalid_argument(
                "volume_content_source is not supported: no snapshots or clones",
            ));
        }
        let driver = &self.0;
        if let Some(wanted) = &req.accessibility_requirements
            && !wanted.requisite.is_empty()
            && !wanted.requisite.iter().any(|t| driver.matches(t))
        {
            return Err(Status::resource_exhausted(format!(
                "volumes can only be created on node {}",
                driver.config.node_id
            )));
        }
        // Names may contain anything; "name/" keys cannot collide with volume IDs.
        let key = format!("name/{name}");
        let work = move |d: &Driver| Ok(d.volume(&d.create(&name, required, limit)?));
        let volume = driver.locked(&key, work).await.map_err(status)?;
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(volume),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let req = request.into_inner();
        req.check_sizes()?;
        // Malformed is INVALID_ARGUMENT, as in every call; a well-formed unknown ID is deleted
        // already (OK).
        let id = validate::volume_id(&req.volume_id)?.to_owned();
        log::trace!("DeleteVolume volume={id}");
        let key = id.clone();
        let work = move |d: &Driver| d.delete(&id);
        self.0.locked(&key, work).await.map_err(status)?;
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let req = request.into_inner();
        req.check_sizes()?;
        let id = validate::volume_id(&req.volume_id)?;
        let caps = validate::capabilities(&req.volume_capabilities)?;
        log::trace!("ValidateVolumeCapabilities volume={id}");
        self.0.volumes.known(id).map_err(|e| status(e.into()))?;
        let reply = match no_block(&caps) {
            Ok(()) => ValidateVolumeCapabilitiesResponse {
                confirmed: Some(Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                    mutable_parameters: Default::default(),
                }),
                message: String::new(),
            },
            Err(why) => ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: why.message().to_owned(),
            },
        };
        Ok(Response::new(reply))
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let req = request.into_inner();
        let max = usize::try_from(req.max_entries)
            .map_err(|_| Status::invalid_argument("max_entries may not be negative"))?;
        let start = decode_token(&req.starting_token)?;
        log::trace!("ListVolumes max_entries={max}");
        let (page, next) = self.0.volumes.page(start.as_deref(), max);
        Ok(Response::new(ListVolumesResponse {
            entries: page
                .iter()
                .map(|record| list_volumes_response::Entry {
                    volume: Some(self.0.volume(record)),
                    status: None,
                })
                .collect(),
            next_token: next.as_deref().map(encode_token).unwrap_or_default(),
        }))
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        let req = request.into_inner();
        req.check_sizes()?;
        log::trace!("GetCapacity");
        let usable = (req.volume_capabilities.is_empty()
            || validate::capabilities(&req.volume_capabilities)
                .and_then(|caps| no_block(&caps))
                .is_ok())
            && req
                .accessible_topology
                .as_ref()
                .is_none_or(|t| self.0.matches(t));
        let available = if usable {
            let work = |d: &Driver| Ok(d.volumes.available()?);
            self.0.unlocked(work).await.map_err(status)?
        } else {
            0
        };
        let available = i64::try_from(available).unwrap_or(i64::MAX);
        Ok(Response::new(GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: Some(available),
            minimum_volume_size: None,
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        use controller_service_capability::rpc::Type;
        log::trace!("ControllerGetCapabilities");
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: [
                Type::CreateDeleteVolume,
                Type::ListVolumes,
                Type::GetCapacity,
                Type::ExpandVolume,
                Type::SingleNodeMultiWriter,
            ]
            .into_iter()
            .map(rpc)
            .collect(),
        }))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        req.check_sizes()?;
        let id = validate::volume_id(&req.volume_id)?.to_owned();
        let range = req
            .capacity_range
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("capacity_range is required"))?;
        let (required, limit) = validate::capacity_range(Some(range))?;
        if let Some(cap) = &req.volume_capability {
            no_block(&[validate::capability(Some(cap))?])?;
        }
        log::trace!("ControllerExpandVolume volume={id} required={required} limit={limit}");
        let key = id.clone();
        let work = move |d: &Driver| d.expand(&id, required, limit);
        let capacity = self.0.locked(&key, work).await.map_err(status)?;
        Ok(Response::new(ControllerExpandVolumeResponse {
            capacity_bytes: i64::try_from(capacity).unwrap_or(i64::MAX),
            // A directory has no filesystem to grow on the node.
            node_expansion_required: false,
        }))
    }

    async fn controller_publish_volume(
        &self,
        _: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        unsupported("ControllerPublishVolume")
    }

    async fn controller_unpublish_volume(
        &self,
        _: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        unsupported("ControllerUnpublishVolume")
    }

    async fn create_snapshot(
        &self,
        _: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        unsupported("CreateSnapshot")
    }

    async fn delete_snapshot(
        &self,
        _: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        unsupported("DeleteSnapshot")
    }

    async fn list_snapshots(
        &self,
        _: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        unsupported("ListSnapshots")
    }

    async fn get_snapshot(
        &self,
        _: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        unsupported("GetSnapshot")
    }

    async fn controller_get_volume(
        &self,
        _: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        unsupported("ControllerGetVolume")
    }

    async fn controller_modify_volume(
        &self,
        _: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        unsupported("ControllerModifyVolume")
    }
}
