//! The CSI Node service: stage, publish, unpublish, unstage as bind mounts; stats, expansion,
//! capabilities and node info. Each handler validates, takes the volume's lock, does its
//! blocking work on the blocking pool, and answers.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::ephemeral::is_ephemeral;
use super::publish::{self, Publication};
use super::validate::{self, AccessMode};
use super::{Driver, blocking};
use crate::proto::csi::{
    NodeExpandVolumeRequest, NodeExpandVolumeResponse, NodeGetCapabilitiesRequest,
    NodeGetCapabilitiesResponse, NodeGetInfoRequest, NodeGetInfoResponse,
    NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse, NodePublishVolumeRequest,
    NodePublishVolumeResponse, NodeServiceCapability, NodeStageVolumeRequest,
    NodeStageVolumeResponse, NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse,
    NodeUnstageVolumeRequest, NodeUnstageVolumeResponse, VolumeCondition, VolumeUsage,
    node_server::Node, node_service_capability, volume_usage,
};

pub struct NodeService(pub(crate) Arc<Driver>);

impl Driver {
    fn publish(&self, req: &NodePublishVolumeRequest, checked: Checked) -> Result<(), Status> {
        let id = &req.volume_id;
        let ephemeral = is_ephemeral(&req.volume_context);
        if !ephemeral {
            self.volumes.known(id)?;
        }
        let target = self
            .mount_point("target_path", &checked.target)?
            .ok_or_else(|| {
                Status::failed_precondition("the parent directory of target_path does not exist")
            })?;
        let staging = match &checked.staging {
            Some(path) if !ephemeral => Some(
                self.mount_point("staging_target_path", path)?
                    .ok_or_else(|| {
                        Status::failed_precondition(format!(
                            "volume is not staged at {}",
                            path.display()
                        ))
                    })?,
            ),
            _ => None,
        };
        let created = ephemeral && self.ephemeral(id, &req.volume_context)?.1;
        let dir = self.volumes.path_of(id);
        let publication = Publication {
            dir: &dir,
            staging: staging.as_deref(),
            target: &target,
            options: checked.options,
            exclusive: checked.mode == AccessMode::SingleNodeSingleWriter,
        };
        let result = checked
            .group
            .map_or(Ok(()), |gid| self.volumes.set_group(id, gid))
            .and_then(|()| publish::publish(&*self.mounter, &publication));
        match result {
            Ok(true) => log::debug!("published volume {id} at {}", target.display()),
            Ok(false) => {}
            Err(e) => {
                if created {
                    // Do not leave behind an ephemeral volume nobody will unpublish.
                    let table = self.mounter.mount_table()?;
                    self.volumes.delete(id, &table)?;
                }
                return Err(e);
            }
        }
        Ok(())
    }

    fn unpublish(&self, id: &str, target: &std::path::Path) -> Result<(), Status> {
        let Some(target) = self.mount_point("target_path", target)? else {
            // No parent, so nothing can be mounted there; an ephemeral volume still goes.
            return self.drop_ephemeral(id);
        };
        let Some(record) = self.volumes.get(id) else {
            return self.unknown_volume_at(id, "target_path", &target, true);
        };
        let dir = self.volumes.path_of(&record.id);
        if publish::unmount_volume(&*self.mounter, "target_path", &target, &dir)? {
            log::debug!("unpublished volume {id} from {}", target.display());
        }
        publish::remove_mount_point(&target)?;
        self.drop_ephemeral(id)
    }

    /// An unpublish or unstage for a volume we do not know: done already if nothing is
    /// mounted there (a retry after success, say), NOT_FOUND if something is.
    fn unknown_volume_at(
        &self,
        id: &str,
        field: &str,
        path: &std::path::Path,
        remove: bool,
    ) -> Result<(), Status> {
        if self.mounter.mount_table()?.mounted_at(path).is_some() {
            return Err(Status::not_found(format!(
                "volume {id} does not exist, and {field} {} is mounted",
                path.display()
            )));
        }
        if remove {
            publish::remove_mount_point(path)?;
        }
        Ok(())
    }
}

/// A publish request after validation.
struct Checked {
    target: std::path::PathBuf,
    staging: Option<std::path::PathBuf>,
    options: super::mount::MountOptions,
    mode: AccessMode,
    group: Option<u32>,
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

/// Bytes and inodes of the filesystem a volume lives on (sizes are accounted, not enforced,
/// so the filesystem's figures are the true ones).
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

fn abnormal(message: String) -> VolumeCondition {
    VolumeCondition {
        abnormal: true,
        message,
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let req = request.into_inner();
        let id = validate::volume_id(&req.volume_id)?.to_owned();
        let staging = validate::path("staging_target_path", &req.staging_target_path)?;
        let cap = validate::capability(req.volume_capability.as_ref())?;
        log::trace!("NodeStageVolume volume={id} staging={}", staging.display());
        cap.require_filesystem()?;
        let options = cap.options(false)?;
        let driver = Arc::clone(&self.0);
        let busy = driver.volumes.lock(&id)?;
        blocking(move || {
            let _busy = busy;
            driver.volumes.known(&id)?;
            let staging = driver
                .mount_point("staging_target_path", &staging)?
                .ok_or_else(|| Status::failed_precondition("staging_target_path does not exist"))?;
            if let Some(gid) = cap.group {
                driver.volumes.set_group(&id, gid)?;
            }
            let dir = driver.volumes.path_of(&id);
            if publish::stage(&*driver.mounter, &dir, &staging, options)? {
                log::debug!("staged volume {id} at {}", staging.display());
            }
            Ok(())
        })
        .await?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let req = request.into_inner();
        let id = validate::volume_id(&req.volume_id)?.to_owned();
        let staging = validate::path("staging_target_path", &req.staging_target_path)?;
        log::trace!(
            "NodeUnstageVolume volume={id} staging={}",
            staging.display()
        );
        let driver = Arc::clone(&self.0);
        let busy = driver.volumes.lock(&id)?;
        blocking(move || {
            let _busy = busy;
            let Some(staging) = driver.mount_point("staging_target_path", &staging)? else {
                return Ok(());
            };
            if driver.volumes.get(&id).is_none() {
                return driver.unknown_volume_at(&id, "staging_target_path", &staging, false);
            }
            let dir = driver.volumes.path_of(&id);
            if publish::unmount_volume(&*driver.mounter, "staging_target_path", &staging, &dir)? {
                log::debug!("unstaged volume {id} from {}", staging.display());
            }
            Ok(())
        })
        .await?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let id = validate::volume_id(&req.volume_id)?.to_owned();
        let target = validate::path("target_path", &req.target_path)?;
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
                return Err(Status::failed_precondition(
                    "staging_target_path is required: this plugin stages volumes",
                ));
            }
            path => Some(validate::path("staging_target_path", path)?),
        };
        cap.require_filesystem()?;
        let checked = Checked {
            target,
            staging,
            options: cap.options(req.readonly)?,
            mode: cap.mode,
            group: cap.group,
        };
        let driver = Arc::clone(&self.0);
        let busy = driver.volumes.lock(&id)?;
        blocking(move || {
            let _busy = busy;
            driver.publish(&req, checked)
        })
        .await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let id = validate::volume_id(&req.volume_id)?.to_owned();
        let target = validate::path("target_path", &req.target_path)?;
        log::trace!(
            "NodeUnpublishVolume volume={id} target={}",
            target.display()
        );
        let driver = Arc::clone(&self.0);
        let busy = driver.volumes.lock(&id)?;
        blocking(move || {
            let _busy = busy;
            driver.unpublish(&id, &target)
        })
        .await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let req = request.into_inner();
        let id = validate::required("volume_id", &req.volume_id)?.to_owned();
        validate::required("volume_path", &req.volume_path)?;
        log::trace!("NodeGetVolumeStats volume={id}");
        let driver = Arc::clone(&self.0);
        // No lock: reading statistics changes nothing and must not fail a concurrent call.
        let reply = blocking(move || {
            driver.volumes.known(&id)?;
            let path = existing_path(&req.volume_path)?;
            let dir = driver.volumes.path_of(&id);
            let table = driver.mounter.mount_table()?;
            let source = publish::source_of(&table, &dir)?;
            let stat = match nix::sys::statvfs::statvfs(&dir) {
                Ok(stat) => Some(stat),
                Err(nix::errno::Errno::ENOENT) => None,
                Err(e) => {
                    let message = format!("statistics of {}: {e}", dir.display());
                    return Err(Status::internal(message));
                }
            };
            let condition = match (&stat, table.mounted_at(&path)) {
                (None, _) => abnormal(format!("volume directory {} is missing", dir.display())),
                (Some(_), Some(entry)) if entry.shows(&source) => VolumeCondition {
                    abnormal: false,
                    message: "volume is mounted".into(),
                },
                _ => abnormal(format!("volume is not mounted at {}", path.display())),
            };
            Ok(NodeGetVolumeStatsResponse {
                usage: stat.map(|stat| usages(&stat)).unwrap_or_default(),
                volume_condition: Some(condition),
            })
        })
        .await?;
        Ok(Response::new(reply))
    }

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        let id = validate::required("volume_id", &req.volume_id)?.to_owned();
        validate::required("volume_path", &req.volume_path)?;
        validate::capacity_range(req.capacity_range.as_ref())?;
        log::trace!("NodeExpandVolume volume={id}");
        let record = self.0.volumes.known(&id)?;
        let _busy = self.0.volumes.lock(&id)?;
        blocking(move || existing_path(&req.volume_path).map(drop)).await?;
        // A directory has no filesystem to grow: ControllerExpandVolume already accounted
        // the new size, which is what the volume now has.
        Ok(Response::new(NodeExpandVolumeResponse {
            capacity_bytes: i64::try_from(record.capacity).unwrap_or(i64::MAX),
        }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        use node_service_capability::rpc::Type;
        log::trace!("NodeGetCapabilities");
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
        log::trace!("NodeGetInfo");
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.0.config.node_id.clone(),
            max_volumes_per_node: self.0.config.max_volumes_per_node,
            accessible_topology: Some(self.0.topology()),
        }))
    }
}

/// A path from a stats or expand request that must exist; anything else means the volume
/// is not there: NOT_FOUND, as the spec words it. Resolved, because mount points in the
/// mount table are canonical.
fn existing_path(value: &str) -> Result<std::path::PathBuf, Status> {
    let not_found = || Status::not_found(format!("volume_path {value:?} does not exist"));
    let path = validate::normalise(value).map_err(|_| not_found())?;
    std::fs::canonicalize(path).map_err(|_| not_found())
}
