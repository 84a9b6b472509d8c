//! The Node service's operations on the [`Driver`]: NodeStageVolume, NodeUnstageVolume,
//! NodePublishVolume, NodeUnpublishVolume (bind mounts of a volume's directory, or its loop
//! device for a block volume), NodeGetVolumeStats and NodeExpandVolume. Each runs on the
//! blocking pool under the volume's claim, which its handler takes.

use std::path::{Path, PathBuf};

use super::bind_mounts::{self, BindError, Publication, Published};
use super::controller_error::access_name;
use super::node_error::NodeError;
use super::{Driver, ephemeral};
use crate::csi_spec::Field;
use crate::linux::mount::MountOptions;
use crate::linux::mount_options::SelinuxContext;
use crate::node_server::state::volumes::Record;
use crate::node_server::state::volumes::project_quotas::Hold;
use crate::node_server::state::volumes::roles::Role;

/// A NodePublishVolume request after validation.
#[derive(Debug)]
pub struct PublishRequest {
    pub id: String,
    pub target: PathBuf,
    /// `None` only for an ephemeral volume, which is not staged.
    pub staging: Option<PathBuf>,
    pub options: MountOptions,
    /// The SELinux context the kubelet asked the volume's filesystem to carry.
    pub context: Option<SelinuxContext>,
    /// SINGLE_NODE_SINGLE_WRITER.
    pub exclusive: bool,
    pub group: Option<u32>,
    /// The volume context of an ephemeral inline volume.
    pub ephemeral: Option<std::collections::HashMap<String, String>>,
    /// Block access: the device at a target file, not a directory.
    pub block: bool,
    /// The pod's UID, where the kubelet passes it (`podInfoOnMount`).
    pub pod: Option<String>,
}

/// How a NodeStageVolume request stages.
#[derive(Debug, Clone)]
pub struct Staging {
    pub options: MountOptions,
    /// The SELinux context the kubelet asked the volume's filesystem to carry.
    pub context: Option<SelinuxContext>,
    pub group: Option<u32>,
    pub block: bool,
    /// SINGLE_NODE_SINGLE_WRITER: no second staging path.
    pub exclusive: bool,
}

/// What NodeGetVolumeStats reports: the filesystem's figures (if the directory is there),
/// how the volume's size holds (its own usage and limit, or why it is not enforced) and,
/// when the volume is not healthy at the path, why.
pub struct Stats {
    pub statvfs: Option<nix::sys::statvfs::Statvfs>,
    /// `None` when the directory is missing.
    pub hold: Option<Hold>,
    pub abnormal: Option<String>,
    /// A block volume's size: all there is to report of a device.
    pub block_capacity: Option<u64>,
}

impl Driver {
    pub fn stage(&self, id: &str, staging: &Path, how: Staging) -> Result<(), NodeError> {
        let Staging {
            options,
            context,
            group,
            block,
            exclusive,
        } = how;
        // An inline volume is never staged: a staging mount would outlive its pod.
        let record = self.volumes.records().provisioned(id, "NodeStageVolume")?;
        let field = Field::StagingTargetPath;
        let staging = self.existing_mount_point(field, staging)?;
        access(&record, block)?;
        self.not_the_other_calls(Role::Staging, &staging)?;
        self.not_inside_a_volume(field, &staging)?;
        if exclusive && let Some(at) = self.staged_elsewhere(&record, &staging)? {
            return Err(NodeError::StagedElsewhere { at });
        }
        if record.block {
            self.stage_block(&record)?;
            return Ok(self.volumes.records().note_staged(id, &staging)?);
        }
        if record.is_image() {
            self.stage_image(&record, &staging, options, context.as_ref(), group)?;
            return Ok(self.volumes.records().note_staged(id, &staging)?);
        }
        no_context_for_a_bind(&record, context.as_ref())?;
        if let Some(gid) = group {
            self.volumes.storage_of(&record).set_group(&record, gid)?;
        }
        let dir = self.volumes.path_of(id);
        if bind_mounts::bind_staging(&*self.mounter, &dir, &staging, options)? {
            log::debug!("staged volume {id} at {}", staging.display());
        }
        Ok(self.volumes.records().note_staged(id, &staging)?)
    }

    pub fn unstage(&self, id: &str, staging: &Path) -> Result<(), NodeError> {
        let field = Field::StagingTargetPath;
        let Some(staging) = self.mount_point(field, staging)? else {
            return Ok(());
        };
        self.not_the_other_calls(Role::Staging, &staging)?;
        let Some(record) = self.volumes.records().get(id) else {
            return self.unknown_volume_at(id, field, &staging);
        };
        if record.block {
            self.unstage_block(&record)?;
            return Ok(self.volumes.records().forget_staged(id, &staging)?);
        }
        if record.is_image() {
            self.unstage_image(&record, &staging)?;
            return Ok(self.volumes.records().forget_staged(id, &staging)?);
        }
        let dir = self.volumes.path_of(id);
        if bind_mounts::unmount_volume(&*self.mounter, field, &staging, &dir)? {
            log::debug!("unstaged volume {id} from {}", staging.display());
        }
        Ok(self.volumes.records().forget_staged(id, &staging)?)
    }

    pub fn publish(&self, req: &PublishRequest) -> Result<(), NodeError> {
        let id = &req.id;
        let record = match &req.ephemeral {
            None => Some(self.volumes.records().known(id)?),
            Some(_) if req.block => {
                return Err(NodeError::AccessType {
                    id: id.clone(),
                    is: "mount (an ephemeral inline)",
                    asked: "block",
                });
            }
            Some(_) => None,
        };
        if let Some(record) = &record {
            access(record, req.block)?;
        }
        let target = self.existing_mount_point(Field::TargetPath, &req.target)?;
        let staging = match &req.staging {
            Some(path) => Some(
                self.mount_point(Field::StagingTargetPath, path)?
                    .ok_or_else(|| BindError::NotStaged {
                        staging: path.clone(),
                    })?,
            ),
            None => None,
        };
        // Checked on the request's paths already; resolved, a symlink could still nest them.
        if let Some(staging) = &staging
            && crate::paths::nested(&target, staging)
        {
            return Err(NodeError::TargetNestedWithStaging {
                target,
                staging: staging.clone(),
            });
        }
        self.not_the_other_calls(Role::Target, &target)?;
        if let Some(staging) = &staging {
            self.not_the_other_calls(Role::Staging, staging)?;
        }
        self.not_inside_a_volume(Field::TargetPath, &target)?;
        let limited_pod = match &record {
            Some(record) => self.io_limits_can_hold(record, req.pod.as_deref())?,
            None => None,
        };
        let published = match record.as_ref() {
            Some(record) if record.block => self.publish_block(
                record,
                staging.as_deref(),
                &target,
                req.options.readonly,
                req.exclusive,
            )?,
            Some(record) if record.is_image() => {
                self.publish_image(req, record, &target, staging.as_deref())?
            }
            _ => self.publish_directory(req, record.as_ref(), &target, staging.as_deref())?,
        };
        if published != Published::Already {
            log::debug!("published volume {id} at {}", target.display());
        }
        // A volume staged by a version that did not record it gets its staging path now.
        if let Some(staging) = &staging {
            self.volumes.records().note_staged(id, staging)?;
        }
        let created = matches!(published, Published::Mounted { created: true });
        self.volumes
            .records()
            .note_target(id, &target, created, req.pod.as_deref())?;
        // After the mount, and on a retry of a publish done already: the pod's limits hold
        // from its container's first IO (a container starts only after every publish).
        if let (Some(record), Some(pod)) = (&record, &limited_pod)
            && let Some(limits) = record.attributes.io_limits()
        {
            self.hold_io_limits(record, pod, limits)?;
        }
        Ok(())
    }

    /// A filesystem (or ephemeral) volume's publish: its directory bound on the target. An
    /// ephemeral volume (`record` is `None`) is created on its first publish.
    fn publish_directory(
        &self,
        req: &PublishRequest,
        record: Option<&Record>,
        target: &Path,
        staging: Option<&Path>,
    ) -> Result<Published, NodeError> {
        let id = &req.id;
        // Borrowed when `publish` looked the volume up: a copy of a record allocates.
        let found;
        let (record, created) = match (record, &req.ephemeral) {
            (Some(record), _) => (record, false),
            (None, Some(context)) => {
                let fill = |dir: &Path, bytes| self.fill_ephemeral_image(dir, bytes);
                let (opened, created) = ephemeral::open(&self.volumes, id, context, fill)?;
                if opened.is_image() {
                    return self.publish_ephemeral_image(req, &opened, created, target);
                }
                found = opened;
                (&found, created)
            }
            // `publish` looks a provisioned volume up before it gets here.
            (None, None) => {
                found = self.volumes.records().known(id)?;
                (&found, false)
            }
        };
        let dir = self.volumes.path_of(id);
        let publication = Publication {
            dir: &dir,
            staging,
            target,
            options: req.options,
            exclusive: req.exclusive,
        };
        let storage = self.volumes.storage_of(record);
        let result = no_context_for_a_bind(record, req.context.as_ref())
            .and_then(|()| {
                (req.group)
                    .map_or(Ok(()), |gid| storage.set_group(record, gid))
                    .map_err(NodeError::from)
            })
            .and_then(|()| Ok(bind_mounts::bind_target(&*self.mounter, &publication)?));
        if result.is_err() && created {
            // Do not leave behind an ephemeral volume nobody will unpublish.
            ephemeral::remove(&self.volumes, &*self.mounter, id)?;
        }
        result
    }

    /// NodeUnpublishVolume: the volume's mounts at the target undone, and the mount point
    /// removed only if publish made it for this volume; a staging path is refused untouched.
    pub fn unpublish(&self, id: &str, target: &Path) -> Result<(), NodeError> {
        let field = Field::TargetPath;
        let Some(target) = self.mount_point(field, target)? else {
            // No parent, so nothing can be mounted there; an ephemeral volume still goes.
            return ephemeral::remove(&self.volumes, &*self.mounter, id);
        };
        self.not_the_other_calls(Role::Target, &target)?;
        let Some(record) = self.volumes.records().get(id) else {
            return self.unknown_volume_at(id, field, &target);
        };
        let created = (record.targets.iter()).any(|t| t.path == target && t.created);
        // Lifted while the volume's devices are all still attached (a read-only publish's
        // goes at its unpublish), unless the same pod keeps another publication of it.
        let pod_of = |t: &crate::node_server::state::volumes::Target| t.pod.clone();
        let pod = record
            .targets
            .iter()
            .find(|t| t.path == target)
            .and_then(pod_of);
        if let Some(pod) = pod
            && record.attributes.io_limits().is_some()
            && !(record.targets.iter()).any(|t| t.path != target && t.pod.as_ref() == Some(&pod))
        {
            self.lift_io_limits(&record, &pod);
        }
        if record.block {
            self.unpublish_block(&record, &target, created)?;
        } else if record.is_image() && record.ephemeral {
            // Mounted at the target itself: unmounted there, its device detached.
            self.unstage_image(&record, &target)?;
            if created {
                bind_mounts::remove_mount_point(&target)?;
            }
        } else if record.is_image() {
            if self.unpublish_image(&record, &target)? {
                log::debug!("unpublished volume {id} from {}", target.display());
            }
            if created {
                bind_mounts::remove_mount_point(&target)?;
            }
        } else {
            let dir = self.volumes.path_of(id);
            if bind_mounts::unmount_volume(&*self.mounter, field, &target, &dir)? {
                log::debug!("unpublished volume {id} from {}", target.display());
            }
            if created {
                bind_mounts::remove_mount_point(&target)?;
            }
        }
        self.volumes.records().forget_target(id, &target)?;
        ephemeral::remove(&self.volumes, &*self.mounter, id)
    }

    /// An unpublish or unstage for a volume we do not know: done already if nothing is
    /// mounted there (a retry after success, say), refused if something is. Nothing there is
    /// removed: this driver made no mount point for a volume it does not know.
    fn unknown_volume_at(&self, id: &str, field: Field, path: &Path) -> Result<(), NodeError> {
        if self.mounter.mount_at(path)?.is_some() {
            return Err(NodeError::UnknownButMounted {
                id: id.to_owned(),
                field,
                path: path.to_owned(),
            });
        }
        Ok(())
    }

    pub fn stats(&self, id: &str, volume_path: &str) -> Result<Stats, NodeError> {
        let record = self.volumes.records().known(id)?;
        let path = existing_path(volume_path)?;
        if record.block {
            return self.block_stats(&record, &path);
        }
        if record.is_image() {
            return self.image_stats(&record, &path);
        }
        let dir = self.volumes.path_of(id);
        let statvfs = match nix::sys::statvfs::statvfs(&dir) {
            Ok(stat) => Some(stat),
            Err(nix::errno::Errno::ENOENT) => None,
            Err(source) => return Err(NodeError::Stats { dir, source }),
        };
        let shown = match statvfs {
            Some(_) => Some(self.mounter.identity(&dir)?),
            None => None,
        };
        let mounted = match (shown, self.mounter.mount_at(&path)?) {
            (None, _) => Some(format!("volume directory {} is missing", dir.display())),
            (Some(dir), Some(top)) if top.shows == dir => None,
            _ => Some(format!("volume is not mounted at {}", path.display())),
        };
        // Stats are polled; a quota that cannot be read is reported, not an error.
        let hold =
            statvfs.as_ref().map(|_| {
                self.volumes.storage_of(&record).hold(&record).unwrap_or_else(|e| {
                Hold::Accounted(format!(
                    "its project quota cannot be read ({e}): these are the filesystem's figures"
                ))
            })
            });
        if let Some(Hold::Enforced { project_id, .. }) = &hold {
            self.check_root(&record, *project_id, &dir);
        }
        let escaped = self.escapes.condition(id);
        let abnormal = match (mounted, escaped) {
            (Some(mounted), Some(escaped)) => Some(format!("{mounted}; {escaped}")),
            (mounted, escaped) => mounted.or(escaped),
        };
        Ok(Stats {
            statvfs,
            hold,
            abnormal,
            block_capacity: None,
        })
    }

    /// NodeExpandVolume: grows the volume to `required` bytes, within `limit` (0: none), when
    /// no ControllerExpandVolume did first — the external-resizer's node-only path, whose
    /// "trivial resizer" only records the size asked in the PV — exactly as that call would
    /// (the record, and a block or image volume's file); then the node's part. A directory has
    /// no filesystem to grow, so its limit is (re)applied at once; a block volume's devices
    /// are told the size its file grew to; an image volume's too, and its filesystem, mounted
    /// at `volume_path`, grows to it. A request without a range grows to the recorded size.
    pub fn expand_on_node(
        &self,
        id: &str,
        volume_path: &str,
        required: u64,
        limit: u64,
    ) -> Result<u64, NodeError> {
        let mut record = self.volumes.records().known(id)?;
        let path = existing_path(volume_path)?;
        let outside = required > record.capacity || (limit > 0 && record.capacity > limit);
        if outside {
            self.expand(id, required, limit, "NodeExpandVolume")?;
            record = self.volumes.records().known(id)?;
        }
        if record.is_image() {
            return self.expand_image_on_node(&record, &path);
        }
        if record.block {
            return self.expand_block_on_node(&record);
        }
        self.volumes.hold_to_size(&record)?;
        Ok(record.capacity)
    }
}

/// A request's access type against the volume's: the spec's "exceeds capabilities".
fn access(record: &Record, block: bool) -> Result<(), NodeError> {
    if record.block == block {
        return Ok(());
    }
    Err(NodeError::AccessType {
        id: record.id.clone(),
        is: access_name(record.block),
        asked: access_name(block),
    })
}

/// A path from a stats or expand request that must exist; resolved, because mount points in
/// the mount table are canonical.
fn existing_path(value: &str) -> Result<PathBuf, NodeError> {
    let not_found = || NodeError::PathNotFound {
        field: Field::VolumePath,
        value: value.to_owned(),
    };
    let path = crate::paths::normalise(value).map_err(|_| not_found())?;
    std::fs::canonicalize(path).map_err(|_| not_found())
}

/// A directory volume is bind-mounted from the state directory's filesystem, whose label it
/// shows: it cannot carry an SELinux context of its own.
fn no_context_for_a_bind(
    record: &Record,
    context: Option<&SelinuxContext>,
) -> Result<(), NodeError> {
    match context {
        Some(context) => Err(NodeError::ContextOnABind {
            id: record.id.clone(),
            label: context.label().to_owned(),
        }),
        None => Ok(()),
    }
}
