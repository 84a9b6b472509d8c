//! The plugin itself, below the gRPC handlers: its configuration, its volumes and its mounter,
//! and every operation the Node and Controller services perform on them. Operations block
//! (syscalls, fsync); handlers run them through [`Driver::locked`], the one way to take a
//! volume's lock and do blocking work while holding it.

pub(super) mod block;
pub(super) mod content;
pub(super) mod ephemeral;
pub mod error;
pub(super) mod modify;
pub mod publish;
pub(super) mod snapshots;
pub(super) mod volumes;
pub mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::config::{Config, ConfigError};
use crate::csi_spec::Field;
use crate::linux::loopdev::{KernelLoops, LoopDevices};
use crate::linux::mount::{MountOptions, Mounter};
use crate::linux::mountinfo::Unlocatable;
use crate::node_server::driver::error::{NodeError, SnapshotError, WorkerError, access_name};
use crate::node_server::state::escapes::Escapes;
use crate::node_server::state::layout::{StateDir, StateDirError};
use crate::node_server::state::orphans::Orphans;
use crate::node_server::state::owner::{Owner, OwnerError};
use crate::node_server::state::snapshots::Snapshots;
use crate::node_server::state::sources::Sources;
use crate::node_server::state::volume_quota::{Hold, QuotaRefused, VolumeQuotas};
use crate::node_server::state::volumes::roles::Role;
use crate::node_server::state::volumes::{ContentSource, Record, VolumeError, Volumes};
use crate::proto::csi::{Topology, Volume, VolumeContentSource, volume_content_source};
use publish::{Publication, Published};

/// State shared by the Node, Controller and Identity services.
pub struct Driver {
    /// As given (`state_dir` too, for messages).
    pub(super) config: Config,
    /// The state directory, canonical (mount points in mountinfo are), and every path in it.
    pub(super) state_dir: StateDir,
    pub(super) volumes: Arc<Volumes>,
    pub(super) mounter: Arc<dyn Mounter>,
    /// Block volumes' loop devices.
    pub(super) loops: Arc<dyn LoopDevices>,
    pub(super) snapshots: Snapshots,
    /// Volumes and snapshots being copied from or deleted.
    pub(super) sources: Arc<Sources>,
    /// Files found out of their volume's project quota, per volume.
    pub(super) escapes: Escapes,
    /// Leftovers of interrupted operations, set aside at open, removed once serving.
    orphans: Orphans,
    /// The state directory is ours alone while this is held.
    _owner: Owner,
}

/// Why the plugin could not start.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    StateDir(#[from] StateDirError),
    /// Another node-server holds the state directory.
    #[error(transparent)]
    Owner(#[from] OwnerError),
    #[error(transparent)]
    Volumes(#[from] VolumeError),
    /// `--quota=on` where sizes cannot be enforced.
    #[error(transparent)]
    Quota(#[from] QuotaRefused),
    #[error(transparent)]
    Snapshots(#[from] SnapshotError),
}

/// A NodePublishVolume request after validation.
#[derive(Debug)]
pub struct PublishRequest {
    pub id: String,
    pub target: PathBuf,
    /// `None` only for an ephemeral volume, which is not staged.
    pub staging: Option<PathBuf>,
    pub options: MountOptions,
    /// SINGLE_NODE_SINGLE_WRITER.
    pub exclusive: bool,
    pub group: Option<u32>,
    /// The volume context of an ephemeral inline volume.
    pub ephemeral: Option<std::collections::HashMap<String, String>>,
    /// Block access: the device at a target file, not a directory.
    pub block: bool,
}

/// How a NodeStageVolume request stages.
#[derive(Debug, Clone, Copy)]
pub struct Staging {
    pub options: MountOptions,
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
    /// Opens the state directory (creating it), loads every volume record, and checks the
    /// configuration; block volumes go on the kernel's loop devices.
    pub fn open(config: Config, mounter: Arc<dyn Mounter>) -> Result<Self, OpenError> {
        Self::open_with(config, mounter, Arc::new(KernelLoops))
    }

    /// [`Self::open`] with the loop devices given: the seam unit tests use.
    pub fn open_with(
        config: Config,
        mounter: Arc<dyn Mounter>,
        loops: Arc<dyn LoopDevices>,
    ) -> Result<Self, OpenError> {
        config.check()?;
        let owner = Owner::try_take(&StateDir::open(&config.state_dir)?)?;
        Self::open_owned(config, mounter, loops, owner)
    }

    /// Opens the state directory `owner` holds (taken before anything in it is read).
    pub fn open_owned(
        config: Config,
        mounter: Arc<dyn Mounter>,
        loops: Arc<dyn LoopDevices>,
        owner: Owner,
    ) -> Result<Self, OpenError> {
        config.check()?;
        let state_dir = owner.state_dir().clone();
        state_dir.make_private()?;
        // Decided before the records load, so a refusal is the only thing said.
        let data_dir = Volumes::create_data_dir(&state_dir)?;
        let quotas = VolumeQuotas::start(data_dir, config.quota)?;
        let volumes = Volumes::open_with(&state_dir, config.capacity, config.overcommit, quotas)?;
        let orphans = Orphans::new();
        volumes.set_aside_unrecorded(&orphans)?;
        // The mount table is read only when a deletion is to be finished.
        if volumes.has_marked_deletions() {
            match mounter.mount_table() {
                Ok(table) => volumes.finish_deletes(&table, &orphans),
                Err(e) => log::error!("interrupted deletions left for DeleteVolume: {e}"),
            }
        }
        let snapshots = Snapshots::open(&state_dir, &orphans)?;
        volumes.charge_loaded(snapshots.total_bytes());
        Ok(Self {
            config,
            state_dir,
            volumes,
            mounter,
            loops,
            snapshots,
            sources: Sources::new(),
            escapes: Escapes::default(),
            orphans,
            _owner: owner,
        })
    }

    /// Starts removing what interrupted operations left (set aside at open) on a background
    /// thread; run once the socket serves. `None` when there was nothing.
    pub fn remove_orphans_in_background(&self) -> Option<std::thread::JoinHandle<()>> {
        self.orphans.remove_in_background()
    }

    /// Takes the lock on `key` (a volume ID, or `name/<name>`), then runs `work` on the
    /// blocking pool while holding it; a second call on the same key meanwhile is refused.
    pub async fn locked<T, E>(
        self: &Arc<Self>,
        key: &str,
        work: impl FnOnce(&Driver) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<VolumeError> + From<WorkerError> + Send + 'static,
    {
        let busy = self.volumes.lock(key)?;
        self.unlocked(move |driver| {
            let _busy = busy;
            work(driver)
        })
        .await
    }

    /// Runs `work` on the blocking pool without a lock: for reads that change nothing.
    pub async fn unlocked<T, E>(
        self: &Arc<Self>,
        work: impl FnOnce(&Driver) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<WorkerError> + Send + 'static,
    {
        let driver = Arc::clone(self);
        tokio::task::spawn_blocking(move || work(&driver))
            .await
            .map_err(|e| E::from(WorkerError(e)))?
    }

    fn topology_key(&self) -> String {
        format!("topology.{}/node", self.config.driver_name)
    }

    /// This node as a topology segment: local volumes are reachable only here.
    pub fn topology(&self) -> Topology {
        Topology {
            segments: [(self.topology_key(), self.config.node_id.clone())].into(),
        }
    }

    /// Whether a topology from a request can be this node (a missing key does not exclude).
    pub fn matches(&self, topology: &Topology) -> bool {
        topology
            .segments
            .get(&self.topology_key())
            .is_none_or(|node| *node == self.config.node_id)
    }

    /// A record as the CO sees it: pinned to this node.
    pub fn volume(&self, record: &Record) -> Volume {
        use volume_content_source::{SnapshotSource, Type, VolumeSource};
        let source = record.source.clone().map(|source| match source {
            ContentSource::Snapshot(snapshot_id) => Type::Snapshot(SnapshotSource { snapshot_id }),
            ContentSource::Volume(volume_id) => Type::Volume(VolumeSource { volume_id }),
        });
        Volume {
            capacity_bytes: i64::try_from(record.capacity).unwrap_or(i64::MAX),
            volume_id: record.id.clone(),
            volume_context: Default::default(),
            content_source: source.map(|t| VolumeContentSource { r#type: Some(t) }),
            accessible_topology: vec![self.topology()],
        }
    }

    /// A mount point from a request, resolved; refused inside or above the state directory,
    /// where a mount could cover or be deleted with volume data.
    fn mount_point(&self, field: Field, path: &Path) -> Result<Option<PathBuf>, NodeError> {
        let resolved = publish::resolve(field, path)?;
        let state_dir = self.state_dir.root();
        if let Some(real) = &resolved
            && (real.starts_with(state_dir) || state_dir.starts_with(real))
        {
            return Err(NodeError::OverlapsState {
                field,
                path: path.to_owned(),
                state_dir: state_dir.to_owned(),
            });
        }
        Ok(resolved)
    }

    /// A mount point whose parent must exist.
    fn existing_mount_point(&self, field: Field, path: &Path) -> Result<PathBuf, NodeError> {
        self.mount_point(field, path)?
            .ok_or(NodeError::MissingParent { field })
    }

    /// Refuses a path that another call owns: a staging path where a target is expected (or
    /// the other way round), by any volume's record.
    fn not_the_other_calls(&self, role: Role, path: &Path) -> Result<(), NodeError> {
        let other = match role {
            Role::Staging => Role::Target,
            Role::Target => Role::Staging,
        };
        match self.volumes.using(path, other) {
            Some(id) => Err(NodeError::OtherCallsPath {
                field: role.field(),
                path: path.to_owned(),
                is: other.field(),
                id,
            }),
            None => Ok(()),
        }
    }

    /// Refuses a mount point whose parent lies in a mount of one of our volumes (a staging or
    /// target mount of any volume): making it would write into that volume's data. Asked of
    /// the two mounts concerned (the parent's, the volume data's), not the whole table.
    fn not_inside_a_volume(&self, field: Field, path: &Path) -> Result<(), NodeError> {
        let Some(parent) = path.parent() else {
            return Ok(());
        };
        let data_dir = self.state_dir.volume_data();
        let unlocatable = || VolumeError::from(Unlocatable(data_dir.to_owned()));
        let data = (self.mounter.containing(data_dir)?)
            .and_then(|mount| mount.source_of(data_dir))
            .ok_or_else(unlocatable)?;
        let Some(mount) = self.mounter.containing(parent)? else {
            return Ok(());
        };
        if mount.dev == data.dev && mount.root.starts_with(&data.path) {
            return Err(NodeError::InsideVolume {
                field,
                path: path.to_owned(),
                mount: mount.mount_point,
            });
        }
        Ok(())
    }

    /// Another staging path the volume is staged at still: recorded, and still mounted (a
    /// block volume: still on a device of ours). A record a reboot outdated does not count.
    /// Each recorded path is asked by itself (statx), not the whole mount table.
    fn staged_elsewhere(
        &self,
        record: &Record,
        staging: &Path,
    ) -> Result<Option<PathBuf>, NodeError> {
        let mut others = record.staged_at.iter().filter(|p| *p != staging);
        if record.block {
            let attached = !self.found(record)?.ours.is_empty();
            return Ok(others.next().filter(|_| attached).cloned());
        }
        for other in others {
            if self.mounter.mount_at(other)?.is_some() {
                return Ok(Some(other.clone()));
            }
        }
        Ok(None)
    }

    // ---- Node service ----

    pub fn stage(&self, id: &str, staging: &Path, how: Staging) -> Result<(), NodeError> {
        let Staging {
            options,
            group,
            block,
            exclusive,
        } = how;
        // An inline volume is never staged: a staging mount would outlive its pod.
        let record = self.volumes.provisioned(id, "NodeStageVolume")?;
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
            return Ok(self.volumes.note_staged(id, &staging)?);
        }
        if let Some(gid) = group {
            self.volumes.set_group(id, gid)?;
        }
        let dir = self.volumes.path_of(id);
        if publish::stage(&*self.mounter, &dir, &staging, options)? {
            log::debug!("staged volume {id} at {}", staging.display());
        }
        Ok(self.volumes.note_staged(id, &staging)?)
    }

    pub fn unstage(&self, id: &str, staging: &Path) -> Result<(), NodeError> {
        let field = Field::StagingTargetPath;
        let Some(staging) = self.mount_point(field, staging)? else {
            return Ok(());
        };
        self.not_the_other_calls(Role::Staging, &staging)?;
        let Some(record) = self.volumes.get(id) else {
            return self.unknown_volume_at(id, field, &staging);
        };
        if record.block {
            self.unstage_block(&record)?;
            return Ok(self.volumes.forget_staged(id, &staging)?);
        }
        let dir = self.volumes.path_of(id);
        if publish::unmount_volume(&*self.mounter, field, &staging, &dir)? {
            log::debug!("unstaged volume {id} from {}", staging.display());
        }
        Ok(self.volumes.forget_staged(id, &staging)?)
    }

    pub fn publish(&self, req: &PublishRequest) -> Result<(), NodeError> {
        let id = &req.id;
        let record = match &req.ephemeral {
            None => Some(self.volumes.known(id)?),
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
                    .ok_or_else(|| publish::PublishError::NotStaged {
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
        let published = match record.as_ref().filter(|r| r.block) {
            Some(record) => self.publish_block(
                record,
                staging.as_deref(),
                &target,
                req.options.readonly,
                req.exclusive,
            )?,
            None => self.publish_directory(req, &target, staging.as_deref())?,
        };
        if published != Published::Already {
            log::debug!("published volume {id} at {}", target.display());
        }
        // A volume staged by a version that did not record it gets its staging path now.
        if let Some(staging) = &staging {
            self.volumes.note_staged(id, staging)?;
        }
        let created = matches!(published, Published::Mounted { created: true });
        Ok(self.volumes.note_target(id, &target, created)?)
    }

    /// A filesystem (or ephemeral) volume's publish: its directory bound on the target.
    fn publish_directory(
        &self,
        req: &PublishRequest,
        target: &Path,
        staging: Option<&Path>,
    ) -> Result<Published, NodeError> {
        let id = &req.id;
        let created = match &req.ephemeral {
            Some(context) => ephemeral::open(&self.volumes, id, context)?.1,
            None => false,
        };
        let dir = self.volumes.path_of(id);
        let publication = Publication {
            dir: &dir,
            staging,
            target,
            options: req.options,
            exclusive: req.exclusive,
        };
        let result = req
            .group
            .map_or(Ok(()), |gid| self.volumes.set_group(id, gid))
            .map_err(NodeError::from)
            .and_then(|()| Ok(publish::publish(&*self.mounter, &publication)?));
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
        let Some(record) = self.volumes.get(id) else {
            return self.unknown_volume_at(id, field, &target);
        };
        let created = (record.targets.iter()).any(|t| t.path == target && t.created);
        if record.block {
            self.unpublish_block(&record, &target, created)?;
        } else {
            let dir = self.volumes.path_of(id);
            if publish::unmount_volume(&*self.mounter, field, &target, &dir)? {
                log::debug!("unpublished volume {id} from {}", target.display());
            }
            if created {
                publish::remove_mount_point(&target)?;
            }
        }
        self.volumes.forget_target(id, &target)?;
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
        let record = self.volumes.known(id)?;
        let path = existing_path(volume_path)?;
        if record.block {
            return self.block_stats(&record, &path);
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
        let hold = statvfs.as_ref().map(|_| {
            self.volumes.hold(&record).unwrap_or_else(|e| {
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

    /// NodeExpandVolume: a directory has no filesystem to grow, so the size is the one
    /// ControllerExpandVolume already accounted; its limit is (re)applied at once. A block
    /// volume's devices are told the size its file grew to.
    pub fn expand_on_node(&self, id: &str, volume_path: &str) -> Result<u64, NodeError> {
        let record = self.volumes.known(id)?;
        existing_path(volume_path)?;
        if record.block {
            return self.expand_block_on_node(&record);
        }
        self.volumes.apply_limit(&record)?;
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
