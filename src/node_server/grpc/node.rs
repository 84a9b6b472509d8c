//! The CSI Node service: stage, publish, unpublish, unstage as bind mounts; stats, expansion,
//! capabilities and node info. Each handler validates, runs its operation on the [`Driver`]
//! under the volume's lock, and answers; [`status`] gives every failure its gRPC code.

use tonic::{Code, Request, Response, Status};

use crate::csi_spec::Field;
use crate::linux::cgroup_io::CgroupError as G;
use crate::linux::loopdev::LoopError as L;
use crate::linux::quota::QuotaError;
use crate::linux::resolve::ResolveError;
use crate::node_server::driver::BindError as P;
use crate::node_server::driver::IoLimitError as IoL;
use crate::node_server::driver::{
    Driver, NodeError, POD_UID, PublishRequest, Staging, is_ephemeral,
};
use crate::node_server::grpc::Backend;
use crate::node_server::grpc::field_limits::SizeLimits;
use crate::node_server::grpc::validate::{self, AccessMode};
use crate::node_server::state::volumes::VolumeError as V;
use crate::node_server::state::volumes::project_quotas::{Hold, Usage};
use crate::proto::csi::{
    NodeExpandVolumeRequest, NodeExpandVolumeResponse, NodeGetCapabilitiesRequest,
    NodeGetCapabilitiesResponse, NodeGetInfoRequest, NodeGetInfoResponse,
    NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse, NodePublishVolumeRequest,
    NodePublishVolumeResponse, NodeServiceCapability, NodeStageVolumeRequest,
    NodeStageVolumeResponse, NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse,
    NodeUnstageVolumeRequest, NodeUnstageVolumeResponse, VolumeCondition, VolumeUsage,
    node_server::Node, node_service_capability, volume_usage,
};

pub struct NodeService(pub(in crate::node_server) Backend);

/// The gRPC code of every failure of a Node call, as the CSI spec's error tables for
/// NodeStage/Unstage/Publish/Unpublish/GetVolumeStats/ExpandVolume name them. (Malformed
/// requests are refused earlier, by `validate`, with INVALID_ARGUMENT.)
fn status(error: NodeError) -> Status {
    use NodeError as E;
    let code = match &error {
        E::OverlapsState { .. }
        | E::TargetNestedWithStaging { .. }
        | E::OtherCallsPath { .. }
        | E::InsideVolume { .. }
        | E::Bind(P::NoParent { .. })
        | E::EphemeralSize(_)
        | E::EphemeralLayout(_)
        | E::ContextOnABind { .. } => Code::InvalidArgument,
        // "Exceeds capabilities": a block capability for a directory, or the other way round.
        E::AccessType { .. } => Code::FailedPrecondition,
        // Another driver's or an administrator's device on the file, or a node that is not
        // a loop device: never touched.
        E::Loop(L::ForeignDevice { .. } | L::NotOurs { .. } | L::WrongDeviceNode { .. }) => {
            Code::FailedPrecondition
        }
        // Still open (a pod's container not yet gone): the CO retries.
        E::Loop(L::Busy { .. }) => Code::Aborted,
        E::Loop(L::NoFreeDevice { .. }) => Code::ResourceExhausted,
        E::Loop(_) => Code::Internal,
        E::Volume(V::NotFound { .. }) | E::UnknownButMounted { .. } | E::PathNotFound { .. } => {
            Code::NotFound
        }
        // "Volume published but is incompatible", or something else is mounted there.
        E::Bind(P::OtherOptions { .. } | P::OtherMount { .. }) | E::NotEphemeral { .. } => {
            Code::AlreadyExists
        }
        // A filesystem that must grow while node-server lacks the capability to grow it.
        E::NoResizeCapability { .. } => Code::FailedPrecondition,
        // A volume with IO limits published where they cannot hold (no pod named, a node
        // without cgroup v2 or its io controller, no cgroup for the pod): nothing mounted.
        E::IoLimits(IoL::NoPod { .. })
        | E::IoLimits(IoL::Cgroup {
            source:
                G::NotV2 { .. }
                | G::NoIoController { .. }
                | G::BadUid(_)
                | G::PodNotFound { .. }
                | G::NotEnabled { .. },
            ..
        }) => Code::FailedPrecondition,
        E::IoLimits(_) => Code::Internal,
        E::MissingParent { .. }
        | E::StagedElsewhere { .. }
        | E::Volume(
            V::InUse { .. }
            | V::Ephemeral { .. }
            | V::LimitKept { .. }
            | V::SizeWouldNotHold { .. },
        )
        | E::Bind(
            P::Symlink { .. }
            | P::Resolve {
                source: ResolveError::UntrustedLink(_) | ResolveError::TooManyLinks(_),
                ..
            }
            | P::NotADirectory { .. }
            | P::NotAFile { .. }
            | P::CreateMountPoint { .. }
            | P::NotStaged { .. }
            | P::PublishedElsewhere { .. }
            | P::ForeignMount { .. },
        ) => Code::FailedPrecondition,
        // "Operation pending for volume".
        E::Volume(V::Busy(_)) => Code::Aborted,
        // An ephemeral volume that does not fit, or no project ID left for it.
        E::Volume(
            V::NoSpace { .. } | V::NoInodes { .. } | V::Quota(QuotaError::Exhausted { .. }),
        ) => Code::ResourceExhausted,
        E::Volume(V::NoRoomToGrow { .. }) => Code::OutOfRange,
        // Grown here on the node-only path: ControllerExpandVolume's codes, which the spec
        // gives NodeExpandVolume too (OUT_OF_RANGE for a size it cannot have).
        E::Grow(e) => super::controller::code(e),
        E::Volume(
            V::Unlocatable(_) | V::Io(_) | V::Undeletable { .. } | V::Quota(_) | V::Freeze { .. },
        )
        | E::Bind(
            P::Unlocatable(_)
            | P::Io { .. }
            | P::Mount(_)
            | P::Resolve {
                source: ResolveError::Io { .. },
                ..
            },
        )
        | E::Stats { .. }
        | E::Filesystem { .. }
        | E::Mount(_)
        | E::Worker(_) => Code::Internal,
    };
    Status::new(code, error.to_string())
}

/// Access modes that give the workload no right to write.
fn reader_only(mode: AccessMode) -> bool {
    matches!(
        mode,
        AccessMode::SingleNodeReaderOnly | AccessMode::MultiNodeReaderOnly
    )
}

fn rpc(kind: node_service_capability::rpc::Type) -> NodeServiceCapability {
    NodeServiceCapability {
        r#type: Some(node_service_capability::Type::Rpc(
            node_service_capability::Rpc {
                r#type: kind as i32,
            },
        )),
    }
}

fn usage(unit: volume_usage::Unit, total: u64, available: u64, used: u64) -> VolumeUsage {
    let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    VolumeUsage {
        total: clamp(total),
        available: clamp(available),
        used: clamp(used),
        unit: unit as i32,
    }
}

/// Bytes and inodes of the filesystem a volume lives on (for a volume whose size is accounted,
/// not enforced, the filesystem's figures are the true ones).
fn usages(stat: &nix::sys::statvfs::Statvfs) -> Vec<VolumeUsage> {
    let blocks = |n: u64| n.saturating_mul(stat.fragment_size());
    vec![
        usage(
            volume_usage::Unit::Bytes,
            blocks(stat.blocks()),
            blocks(stat.blocks_available()),
            blocks(stat.blocks().saturating_sub(stat.blocks_free())),
        ),
        usage(
            volume_usage::Unit::Inodes,
            stat.files(),
            stat.files_available(),
            stat.files().saturating_sub(stat.files_free()),
        ),
    ]
}

/// A volume's own bytes and inodes, from its project quota: the limit is the total. Without an
/// inode limit, the inodes it can still take are the filesystem's. What is available is never
/// more than the filesystem has free (an overcommitted or over-full filesystem runs out first).
fn quota_usages(quota: &Usage, stat: &nix::sys::statvfs::Statvfs) -> Vec<VolumeUsage> {
    let limit = quota.limits.bytes;
    let free_bytes = stat.blocks_available().saturating_mul(stat.fragment_size());
    let (inodes, free_inodes) = match quota.limits.inodes {
        0 => (stat.files(), stat.files_available()),
        limit => (
            limit,
            limit
                .saturating_sub(quota.inodes)
                .min(stat.files_available()),
        ),
    };
    vec![
        usage(
            volume_usage::Unit::Bytes,
            limit,
            limit.saturating_sub(quota.bytes).min(free_bytes),
            quota.bytes,
        ),
        usage(
            volume_usage::Unit::Inodes,
            inodes,
            free_inodes,
            quota.inodes,
        ),
    ]
}

/// The stats condition: healthy or not at the path, and what the figures are.
fn condition(abnormal: Option<String>, hold: Option<&Hold>) -> VolumeCondition {
    let sizes = match hold {
        Some(Hold::Enforced { project_id, usage }) => format!(
            "; its size is enforced: project quota {project_id}, limit {} bytes",
            usage.limits.bytes
        ),
        Some(Hold::Accounted(why)) => format!("; the figures are the shared filesystem's ({why})"),
        None => String::new(),
    };
    VolumeCondition {
        abnormal: abnormal.is_some(),
        message: abnormal.unwrap_or_else(|| "volume is mounted".into()) + &sizes,
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let driver = self.0.driver()?;
        let req = request.into_inner();
        req.check_sizes()?;
        let id = validate::volume_id(&req.volume_id)?.to_owned();
        let staging = validate::path(Field::StagingTargetPath, &req.staging_target_path)?;
        let cap = validate::capability(req.volume_capability.as_ref())?;
        log::trace!("NodeStageVolume volume={id} staging={}", staging.display());
        let options = cap.options(false)?;
        let key = id.clone();
        let exclusive = cap.mode == AccessMode::SingleNodeSingleWriter;
        let how = Staging {
            options,
            context: cap.context.clone(),
            group: cap.group,
            block: cap.block,
            exclusive,
        };
        let work = move |d: &Driver| d.stage(&id, &staging, how);
        driver.claimed(&key, work).await.map_err(status)?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let driver = self.0.driver()?;
        let req = request.into_inner();
        req.check_sizes()?;
        let id = validate::volume_id(&req.volume_id)?.to_owned();
        let staging = validate::path(Field::StagingTargetPath, &req.staging_target_path)?;
        log::trace!(
            "NodeUnstageVolume volume={id} staging={}",
            staging.display()
        );
        let key = id.clone();
        let work = move |d: &Driver| d.unstage(&id, &staging);
        driver.claimed(&key, work).await.map_err(status)?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let driver = self.0.driver()?;
        let req = request.into_inner();
        req.check_sizes()?;
        let id = validate::volume_id(&req.volume_id)?.to_owned();
        let target = validate::path(Field::TargetPath, &req.target_path)?;
        let cap = validate::capability(req.volume_capability.as_ref())?;
        log::trace!(
            "NodePublishVolume volume={id} target={} readonly={}",
            target.display(),
            req.readonly
        );
        let ephemeral = is_ephemeral(&req.volume_context);
        let staging = match req.staging_target_path.as_str() {
            "" if ephemeral => None,
            "" => {
                return Err(Status::failed_precondition(format!(
                    "{} is required: this plugin stages volumes",
                    Field::StagingTargetPath
                )));
            }
            path => Some(validate::path(Field::StagingTargetPath, path)?),
        };
        if let Some(staging) = staging.as_ref().filter(|_| !ephemeral)
            && validate::nested(&target, staging)
        {
            return Err(Status::invalid_argument(format!(
                "{} {} and {} {} are the same or one is inside the other: the volume cannot \
                 be published onto its own staging mount",
                Field::TargetPath,
                target.display(),
                Field::StagingTargetPath,
                staging.display()
            )));
        }
        let publish = PublishRequest {
            id: id.clone(),
            target,
            // An ephemeral volume is bound from its directory: it was never staged.
            staging: staging.filter(|_| !ephemeral),
            // A reader-only mode is published read-only whatever `readonly` says.
            options: cap.options(req.readonly || reader_only(cap.mode))?,
            context: cap.context.clone(),
            exclusive: cap.mode == AccessMode::SingleNodeSingleWriter,
            group: cap.group,
            pod: req.volume_context.get(POD_UID).cloned(),
            ephemeral: ephemeral.then_some(req.volume_context),
            block: cap.block,
        };
        let work = move |d: &Driver| d.publish(&publish);
        driver.claimed(&id, work).await.map_err(status)?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let driver = self.0.driver()?;
        let req = request.into_inner();
        req.check_sizes()?;
        let id = validate::volume_id(&req.volume_id)?.to_owned();
        let target = validate::path(Field::TargetPath, &req.target_path)?;
        log::trace!(
            "NodeUnpublishVolume volume={id} target={}",
            target.display()
        );
        let key = id.clone();
        let work = move |d: &Driver| d.unpublish(&id, &target);
        driver.claimed(&key, work).await.map_err(status)?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let driver = self.0.driver()?;
        let req = request.into_inner();
        req.check_sizes()?;
        let id = validate::volume_id(&req.volume_id)?.to_owned();
        validate::required(Field::VolumePath.wire_name(), &req.volume_path)?;
        log::trace!("NodeGetVolumeStats volume={id}");
        // No lock: reading statistics changes nothing and must not fail a concurrent call.
        let work = move |d: &Driver| d.stats(&id, &req.volume_path);
        let stats = driver.blocking(work).await.map_err(status)?;
        let usage = match (&stats.statvfs, &stats.hold, stats.block_capacity) {
            // A device has a size, and no used or free space of its own to tell.
            (_, _, Some(capacity)) => vec![usage(volume_usage::Unit::Bytes, capacity, 0, 0)],
            (Some(stat), Some(Hold::Enforced { usage, .. }), _) => quota_usages(usage, stat),
            (Some(stat), _, _) => usages(stat),
            (None, _, _) => Vec::new(),
        };
        Ok(Response::new(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(condition(stats.abnormal, stats.hold.as_ref())),
        }))
    }

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let driver = self.0.driver()?;
        let req = request.into_inner();
        req.check_sizes()?;
        let id = validate::volume_id(&req.volume_id)?.to_owned();
        validate::required(Field::VolumePath.wire_name(), &req.volume_path)?;
        let (required, limit) = validate::capacity_range(req.capacity_range.as_ref())?;
        log::trace!("NodeExpandVolume volume={id} required={required} limit={limit}");
        let key = id.clone();
        let work = move |d: &Driver| d.expand_on_node(&id, &req.volume_path, required, limit);
        let capacity = driver.claimed(&key, work).await.map_err(status)?;
        Ok(Response::new(NodeExpandVolumeResponse {
            capacity_bytes: i64::try_from(capacity).unwrap_or(i64::MAX),
        }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        use node_service_capability::rpc::Type;
        log::trace!("NodeGetCapabilities");
        // Behind --resizer-only, EXPAND_VOLUME alone: the resizer's sign to leave expansion
        // to the kubelet on the volume's node, which asks its own node-server, not this one.
        if let Backend::ResizerOnly { .. } = &self.0 {
            return Ok(Response::new(NodeGetCapabilitiesResponse {
                capabilities: vec![rpc(Type::ExpandVolume)],
            }));
        }
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: [
                Type::StageUnstageVolume,
                Type::GetVolumeStats,
                Type::ExpandVolume,
                Type::VolumeCondition,
                Type::SingleNodeMultiWriter,
                Type::VolumeMountGroup,
            ]
            .into_iter()
            .map(rpc)
            .collect(),
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        let driver = self.0.driver()?;
        log::trace!("NodeGetInfo");
        Ok(Response::new(NodeGetInfoResponse {
            node_id: driver.config().node_id.clone(),
            max_volumes_per_node: driver.config().max_volumes_per_node,
            accessible_topology: Some(driver.topology()),
        }))
    }
}
