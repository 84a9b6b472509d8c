//! The CSI Controller service for this node's own volumes (external-provisioner's node
//! deployment): create (empty, restored from a snapshot, or cloned), delete, validate, list,
//! capacity, expand, modify (a volume's mutable attributes); the snapshot calls are in `controller_snapshots`. Volumes are pinned to
//! this node by topology. Controller publish is not offered.

use tonic::{Code, Request, Response, Status};

use crate::linux::quota::QuotaError;
use crate::node_server::driver::{ControllerError, Driver, Kind};
use crate::node_server::grpc::Backend;
use crate::node_server::grpc::controller_snapshots as snapshots;
use crate::node_server::grpc::field_limits::SizeLimits;
use crate::node_server::grpc::validate::{self, decode_token, encode_token};
use crate::node_server::resizer_only;
use crate::node_server::state::attributes::{Attributes, ParameterError};
use crate::node_server::state::volumes::{ContentSource, LAYOUT, Layout, VolumeError as V};
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
    ValidateVolumeCapabilitiesResponse, VolumeContentSource, controller_server::Controller,
    controller_service_capability, list_volumes_response,
    validate_volume_capabilities_response::Confirmed, volume_content_source,
};

pub struct ControllerService(pub(in crate::node_server) Backend);

/// The gRPC code of every failure of a Controller call, as the CSI spec's error tables for
/// CreateVolume, DeleteVolume, ControllerExpandVolume and GetCapacity name them. (Malformed
/// requests are refused earlier, by `validate`, with INVALID_ARGUMENT; snapshot calls have
/// their own table, `controller_snapshots::status`.)
fn status(error: ControllerError) -> Status {
    Status::new(code(&error), error.to_string())
}

/// The gRPC code of a failed Controller operation (NodeExpandVolume's growth too).
pub(super) fn code(error: &ControllerError) -> Code {
    use ControllerError as E;
    match error {
        // "Source does not exist" too.
        E::Volume(V::NotFound { .. }) | E::SourceNotFound { .. } => Code::NotFound,
        // "Volume already exists but is incompatible" (size, content source or attributes).
        E::NameTaken { .. }
        | E::OtherSource { .. }
        | E::OtherAttributes { .. }
        | E::OtherAccessType { .. }
        | E::OtherLayout { .. } => Code::AlreadyExists,
        // ModifyVolume's "parameters not supported" and "exceeds capabilities"; CreateVolume's
        // "source incompatible".
        E::Parameter(_)
        | E::CannotApply { .. }
        | E::SourceAccessType { .. }
        | E::SourceLayout { .. } => Code::InvalidArgument,
        E::BlockSize { .. } | E::ImageSize { .. } => Code::OutOfRange,
        // Recorded, and not written to a pod's cgroup: the CO retries the call.
        E::IoLimits(_) => Code::Internal,
        // DeleteVolume of a volume that is still mounted; an expansion whose limit would
        // stay where it is (sizes not enforced now); a directory volume where its size would
        // not hold (`--quota=auto` on a filesystem without project quotas).
        E::Volume(
            V::InUse { .. }
            | V::Ephemeral { .. }
            | V::LimitKept { .. }
            | V::SizeWouldNotHold { .. },
        ) => Code::FailedPrecondition,
        // "Operation pending for volume" (or for the source: it is being deleted or copied).
        E::Volume(V::Busy(_)) | E::SourceBusy(_) => Code::Aborted,
        // "Unable to provision in `accessible_topology`" / out of capacity (or of project
        // IDs to enforce it with).
        E::Volume(
            V::NoSpace { .. } | V::NoInodes { .. } | V::Quota(QuotaError::Exhausted { .. }),
        ) => Code::ResourceExhausted,
        E::Copy(e) if e.is_out_of_space() => Code::ResourceExhausted,
        // "Unsupported capacity" on expansion, or smaller than the source.
        // A source holding more than the size asked for is "smaller than the source" too.
        E::Volume(V::NoRoomToGrow { .. })
        | E::WouldShrink { .. }
        | E::SourceTooLarge { .. }
        | E::SourceHolds { .. }
        | E::CopyTooLarge { .. } => Code::OutOfRange,
        // A clone's source frozen by someone else (`fsfreeze`): not in a state to be copied.
        E::Volume(V::Freeze { source, .. }) if source.raw_os_error() == Some(libc::EBUSY) => {
            Code::FailedPrecondition
        }
        E::Volume(
            V::Unlocatable(_) | V::Io(_) | V::Undeletable { .. } | V::Quota(_) | V::Freeze { .. },
        )
        | E::Mount(_)
        | E::Worker(_)
        | E::Loop(_)
        | E::Privilege(_)
        | E::Copy(_) => Code::Internal,
    }
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

/// The access type all of a request's capabilities ask for: `true` for block. A volume is a
/// directory or a device, never both.
fn access_type(caps: &[validate::Capability]) -> Result<bool, Status> {
    let block = caps.iter().any(|c| c.block);
    if block && caps.iter().any(|c| !c.block) {
        return Err(Status::invalid_argument(
            "volume_capabilities ask for both block and mount access; a volume is one or the other",
        ));
    }
    Ok(block)
}

/// A content source, checked: a snapshot or volume ID, whichever it names, held to the same
/// rules as that ID in any other field (INVALID_ARGUMENT, the ID clipped and quoted).
fn content_source(source: &VolumeContentSource) -> Result<ContentSource, Status> {
    use volume_content_source::Type;
    match &source.r#type {
        Some(Type::Snapshot(s)) => Ok(ContentSource::Snapshot(
            validate::snapshot_id("volume_content_source.snapshot.snapshot_id", &s.snapshot_id)?
                .to_owned(),
        )),
        Some(Type::Volume(v)) => Ok(ContentSource::Volume(
            validate::volume_id_of("volume_content_source.volume.volume_id", &v.volume_id)?
                .to_owned(),
        )),
        None => Err(Status::invalid_argument(
            "volume_content_source names neither a snapshot nor a volume",
        )),
    }
}

/// A malformed parameter: INVALID_ARGUMENT, naming it.
fn invalid(error: ParameterError) -> Status {
    Status::invalid_argument(error.to_string())
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
        let driver = self.0.driver()?;
        let req = request.into_inner();
        req.check_sizes()?;
        let name = validate::name(&req.name)?.to_owned();
        let block = access_type(&validate::capabilities(&req.volume_capabilities)?)?;
        let (required, limit) = validate::capacity_range(req.capacity_range.as_ref())?;
        let source = (req.volume_content_source.as_ref())
            .map(content_source)
            .transpose()?;
        // A StorageClass's parameters, then its VolumeAttributesClass's, which take precedence.
        let attributes = Attributes::from_parameters(&req.parameters)
            .and_then(|class| Ok(class.with(Attributes::from_mutable(&req.mutable_parameters)?)))
            .map_err(invalid)?;
        let layout = Layout::from_parameters(&req.parameters, block).map_err(invalid)?;
        let kind = Kind { block, layout };
        log::trace!("CreateVolume name={name} required={required} limit={limit}");
        if let Some(wanted) = &req.accessibility_requirements
            && !wanted.requisite.is_empty()
            && !wanted.requisite.iter().any(|t| driver.matches(t))
        {
            return Err(Status::resource_exhausted(format!(
                "volumes can only be created on node {}",
                driver.config().node_id
            )));
        }
        // Names may contain anything; "name/" keys cannot collide with volume IDs.
        let key = format!("name/{name}");
        let work = move |d: &Driver| {
            Ok(d.volume(&d.create(&name, required, limit, source, attributes, kind)?))
        };
        let volume = driver.claimed(&key, work).await.map_err(status)?;
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(volume),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let driver = self.0.driver()?;
        let req = request.into_inner();
        req.check_sizes()?;
        // Malformed is INVALID_ARGUMENT, as in every call; a well-formed unknown ID is deleted
        // already (OK).
        let id = validate::volume_id(&req.volume_id)?.to_owned();
        log::trace!("DeleteVolume volume={id}");
        // A deletion a crash cut short, being ended in the background under the volume's
        // claim: the CO's retry is answered at once rather than ABORTED while it settles.
        if driver.deleting_in_background(&id) {
            return Ok(Response::new(DeleteVolumeResponse {}));
        }
        let key = id.clone();
        let work = move |d: &Driver| d.delete(&id);
        driver.claimed(&key, work).await.map_err(status)?;
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let driver = self.0.driver()?;
        let req = request.into_inner();
        req.check_sizes()?;
        let id = validate::volume_id(&req.volume_id)?;
        let caps = validate::capabilities(&req.volume_capabilities)?;
        log::trace!("ValidateVolumeCapabilities volume={id}");
        let record = driver.known_volume(id).map_err(|e| status(e.into()))?;
        let kind = access_type(&caps).and_then(|block| match block == record.block {
            true => Ok(()),
            false if record.block => Err(Status::invalid_argument(format!(
                "volume {id} is a block volume, not a mount volume"
            ))),
            false => Err(Status::invalid_argument(format!(
                "volume {id} is a mount volume, not a block volume"
            ))),
        });
        let asks_layout = req.parameters.contains_key(LAYOUT);
        let attributes = Attributes::from_parameters(&req.parameters)
            .and_then(|_| Attributes::from_mutable(&req.mutable_parameters))
            .and_then(|_| Layout::from_parameters(&req.parameters, record.block))
            .map_err(|e| Status::invalid_argument(e.to_string()))
            // A request naming no layout asks nothing of it (the parameters are optional).
            .and_then(|layout| match layout == record.layout || !asks_layout {
                true => Ok(()),
                false => Err(Status::invalid_argument(format!(
                    "volume {id} has layout {}, not {}",
                    record.layout.name(),
                    layout.name()
                ))),
            });
        let reply = match kind.and(attributes) {
            Ok(_) => ValidateVolumeCapabilitiesResponse {
                confirmed: Some(Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                    mutable_parameters: req.mutable_parameters,
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
        let driver = self.0.driver()?;
        let req = request.into_inner();
        req.check_sizes()?;
        let max = usize::try_from(req.max_entries)
            .map_err(|_| Status::invalid_argument("max_entries may not be negative"))?;
        let start = decode_token(&req.starting_token, validate::any_volume_id)?;
        log::trace!("ListVolumes max_entries={max}");
        let (page, next) = driver.volume_page(start.as_deref(), max);
        Ok(Response::new(ListVolumesResponse {
            entries: page
                .iter()
                .map(|record| list_volumes_response::Entry {
                    volume: Some(driver.volume(record)),
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
        let driver = self.0.driver()?;
        let req = request.into_inner();
        req.check_sizes()?;
        log::trace!("GetCapacity");
        let usable = (req.volume_capabilities.is_empty()
            || validate::capabilities(&req.volume_capabilities)
                .and_then(|caps| access_type(&caps))
                .is_ok())
            && req
                .accessible_topology
                .as_ref()
                .is_none_or(|t| driver.matches(t));
        let available = if usable {
            let work = |d: &Driver| Ok(d.available()?);
            driver.blocking(work).await.map_err(status)?
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
        // None behind --resizer-only: without EXPAND_VOLUME the resizer expands on the node.
        let Backend::Driver(driver) = &self.0 else {
            return Ok(Response::new(ControllerGetCapabilitiesResponse::default()));
        };
        let mut capabilities = vec![
            Type::CreateDeleteVolume,
            Type::ListVolumes,
            Type::GetCapacity,
            Type::ExpandVolume,
            Type::SingleNodeMultiWriter,
            Type::CreateDeleteSnapshot,
            Type::ListSnapshots,
            Type::CloneVolume,
            Type::ModifyVolume,
        ];
        // GetSnapshot is served either way; its capability (alpha in the spec) is rejected
        // by csi-sanity before v5.5, and no Kubernetes sidecar asks for it yet.
        if driver.config().advertise_get_snapshot {
            capabilities.push(Type::GetSnapshot);
        }
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: capabilities.into_iter().map(rpc).collect(),
        }))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        let driver = self.0.driver()?;
        let req = request.into_inner();
        req.check_sizes()?;
        let id = validate::volume_id(&req.volume_id)?.to_owned();
        let range = req
            .capacity_range
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("capacity_range is required"))?;
        let (required, limit) = validate::capacity_range(Some(range))?;
        if let Some(cap) = &req.volume_capability {
            validate::capability(Some(cap))?;
        }
        log::trace!("ControllerExpandVolume volume={id} required={required} limit={limit}");
        let key = id.clone();
        let work = move |d: &Driver| d.expand(&id, required, limit, "ControllerExpandVolume");
        let (capacity, on_node) = driver.claimed(&key, work).await.map_err(status)?;
        Ok(Response::new(ControllerExpandVolumeResponse {
            capacity_bytes: i64::try_from(capacity).unwrap_or(i64::MAX),
            // A directory has no filesystem to grow on the node; a block volume's loop
            // devices must be told the file's new size.
            node_expansion_required: on_node,
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
        request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        let driver = self.0.driver()?;
        snapshots::create(driver, request.into_inner()).await
    }

    async fn delete_snapshot(
        &self,
        request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        let driver = self.0.driver()?;
        snapshots::delete(driver, request.into_inner()).await
    }

    async fn list_snapshots(
        &self,
        request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        let driver = self.0.driver()?;
        snapshots::list(driver, request.into_inner()).await
    }

    async fn get_snapshot(
        &self,
        request: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        let driver = self.0.driver()?;
        snapshots::get(driver, request.into_inner()).await
    }

    async fn controller_get_volume(
        &self,
        _: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        unsupported("ControllerGetVolume")
    }

    async fn controller_modify_volume(
        &self,
        request: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        if let Backend::ResizerOnly { driver_name } = &self.0 {
            return Err(resizer_only::refuse_modify(
                driver_name,
                &request.get_ref().volume_id,
            ));
        }
        let driver = self.0.driver()?;
        let req = request.into_inner();
        req.check_sizes()?;
        let id = validate::volume_id(&req.volume_id)?.to_owned();
        let change = Attributes::from_mutable(&req.mutable_parameters).map_err(invalid)?;
        log::trace!("ControllerModifyVolume volume={id}");
        // An unknown volume is NOT_FOUND before an empty map is refused: csi-sanity sends
        // the parameters of its --csi.testvolumemutableparameters file, none without one,
        // and expects NOT_FOUND for a volume that does not exist either way.
        (driver.provisioned(&id, "ControllerModifyVolume")).map_err(|e| status(e.into()))?;
        if req.mutable_parameters.is_empty() {
            return Err(Status::invalid_argument(
                "mutable_parameters is required: name at least one parameter to change",
            ));
        }
        let key = id.clone();
        let work = move |d: &Driver| d.modify(&id, change);
        driver.claimed(&key, work).await.map_err(status)?;
        Ok(Response::new(ControllerModifyVolumeResponse {}))
    }
}
