//! The plugin itself, below the gRPC handlers: [`Driver`], which holds the configuration, the
//! volumes and snapshots, the claims on them and the syscall seams, and is the one way to run
//! a blocking operation under a claim ([`Driver::claimed`]). Its operations, one file per
//! service's share:
//!
//! - `node_ops` — the Node service: stage, unstage, publish, unpublish, stats, expand;
//!   `mount_points` — the checks every request path goes through first; `bind_mounts` — bind
//!   mounts decided from the kernel; `block` — raw block volumes on loop devices; `image` —
//!   image volumes, a filesystem of their own on a loop device; `image_copies` — their
//!   snapshots and clones' sources, frozen for the copy, and the copies unshared after;
//!   `image_growth` — their expansion; `image_inline` — inline ones; `ephemeral` — inline
//!   volumes.
//! - `volume_ops` — CreateVolume, DeleteVolume, ControllerExpandVolume; `content` — restores
//!   and clones; `snapshot_ops` — snapshots and groups; `modify` — ControllerModifyVolume;
//!   `metadata_ops` — the snapshots a SnapshotMetadata map is read from, held while it is.
//! - `quota_patrol` — the background walk that sets back files taken out of their volume's
//!   project; `quota_watch` — such files set back as they are written; `io_limits` — a volume's IO limits in the cgroups of the pods it is published to.
//! - `node_error`, `controller_error` — what the operations fail with.

mod bind_mounts;
mod block;
mod content;
mod controller_error;
mod ephemeral;
mod image;
mod image_copies;
mod image_growth;
mod image_inline;
mod io_limits;
mod metadata_ops;
mod modify;
mod mount_points;
mod node_error;
mod node_ops;
mod quota_patrol;
mod quota_watch;
mod snapshot_ops;
mod volume_ops;

use std::path::Path;
use std::sync::Arc;

use super::config::{Config, ConfigError};
use crate::linux::loopdev::{KernelLoops, LoopDevices};
use crate::linux::mount::{LinuxMounter, Mounter};
use crate::node_server::state::escapes::Escapes;
use crate::node_server::state::orphans::Orphans;
use crate::node_server::state::owner::{Owner, OwnerError};
use crate::node_server::state::snapshots::{Filter, Snapshot, Snapshots};
use crate::node_server::state::sources::Sources;
use crate::node_server::state::state_dir::{StateDir, StateDirError};
use crate::node_server::state::volumes::project_quotas::{QuotaRefused, VolumeQuotas};
use crate::node_server::state::volumes::{
    Claims, ContentSource, QuotaDirectories, Record, Sizing, VolumeError, Volumes,
};
use crate::proto::csi::{Topology, Volume, VolumeContentSource, volume_content_source};

pub use crate::node_server::state::snapshots::SnapshotError;
pub use crate::runtime::WorkerError;
pub use bind_mounts::BindError;
pub use controller_error::ControllerError;
pub use ephemeral::is_ephemeral;
pub use io_limits::{IoLimitError, POD_UID};
pub use metadata_ops::{MapSource, MetadataError};
pub use node_error::NodeError;
pub use node_ops::{PublishRequest, Staging};
pub use quota_patrol::QuotaPatrol;
pub use volume_ops::Kind;

/// State shared by the Node, Controller and Identity services.
pub struct Driver {
    /// As given (`state_dir` too, for messages).
    config: Config,
    /// The state directory, canonical (mount points in mountinfo are), and every path in it.
    state_dir: StateDir,
    volumes: Volumes,
    /// Operations in progress, by volume ID, name or snapshot key.
    claims: Arc<Claims>,
    mounter: Arc<dyn Mounter>,
    /// Block volumes' loop devices.
    loops: Arc<dyn LoopDevices>,
    snapshots: Snapshots,
    /// Volumes and snapshots being copied from or deleted.
    sources: Arc<Sources>,
    /// Files found out of their volume's project quota, per volume.
    escapes: Escapes,
    /// Leftovers of interrupted operations, set aside at open, removed once serving.
    orphans: Orphans,
    /// The state directory is ours alone while this is held.
    _owner: Owner,
}

/// What the plugin's syscalls go through: the kernel's in production, fakes (or slowed or
/// observed real ones) in tests.
pub struct Seams {
    pub mounter: Arc<dyn Mounter>,
    pub loops: Arc<dyn LoopDevices>,
}

impl Seams {
    /// The real mounts and loop devices.
    pub fn linux() -> Self {
        Self {
            mounter: Arc::new(LinuxMounter),
            loops: Arc::new(KernelLoops),
        }
    }
}

/// How often, and how far apart, ending a deletion after the orphan removal tries for its
/// volume's claim: 10 s in all.
const CLAIM_TRIES: u32 = 200;
const CLAIM_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

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

impl Driver {
    /// Opens the state directory `owner` holds (taken before anything in it is read): checks
    /// the configuration, decides how sizes hold, loads every volume and snapshot record,
    /// and sets aside what interrupted operations left. The one constructor; tests pass their
    /// seams in.
    pub fn open(config: Config, owner: Owner, seams: Seams) -> Result<Self, OpenError> {
        config.check()?;
        let state_dir = owner.state_dir().clone();
        state_dir.make_private()?;
        // Decided before the records load, so a refusal is the only thing said.
        let data_dir = QuotaDirectories::create_data_dir(&state_dir)?;
        let quotas = VolumeQuotas::start(data_dir, config.quota)?;
        let sizing = Sizing {
            total: config.capacity,
            overcommit: config.overcommit,
        };
        let directories = QuotaDirectories::new(&state_dir, quotas);
        let volumes = Volumes::open(&state_dir, sizing, directories)?;
        let orphans = Orphans::new();
        volumes.set_aside_unrecorded(&orphans)?;
        // The mount table is read only when a deletion is to be finished.
        if volumes.has_marked_deletions() {
            match seams.mounter.mount_table() {
                Ok(table) => volumes.finish_deletes(&table, &orphans),
                Err(e) => log::error!("interrupted deletions left for DeleteVolume: {e}"),
            }
        }
        let snapshots = Snapshots::open(&state_dir, &orphans)?;
        volumes.charge_loaded(snapshots.total_bytes());
        let driver = Self {
            config,
            volumes,
            claims: Claims::new(),
            mounter: seams.mounter,
            loops: seams.loops,
            snapshots,
            sources: Sources::new(),
            escapes: Escapes::default(),
            orphans,
            state_dir,
            _owner: owner,
        };
        driver.thaw_images();
        Ok(driver)
    }

    /// Starts removing what interrupted operations left (set aside at open) on a background
    /// thread, then ends the deletions whose data that was; run once the socket serves.
    /// `None` when there was nothing.
    pub fn remove_orphans_in_background(self: &Arc<Self>) -> Option<std::thread::JoinHandle<()>> {
        let driver = Arc::clone(self);
        (self.orphans).remove_in_background(move || driver.finish_deletes_after_removal())
    }

    /// Ends each deletion still marked now that the orphans are gone (their files charged the
    /// volume's project until then), under the volume's claim: a call holding it meanwhile
    /// (a DeleteVolume answered at once while the removal ran) is waited for.
    fn finish_deletes_after_removal(&self) {
        let marked = self.volumes.records().marked_deleted();
        if marked.is_empty() {
            return;
        }
        let table = match self.mounter.mount_table() {
            Ok(table) => table,
            Err(e) => return log::error!("interrupted deletions left for DeleteVolume: {e}"),
        };
        for id in marked {
            let claim = (0..CLAIM_TRIES).find_map(|try_| {
                if try_ > 0 {
                    std::thread::sleep(CLAIM_PAUSE);
                }
                self.claims.claim(&id).ok()
            });
            if claim.is_none() {
                log::warn!(
                    "volume {id}'s deletion is left to the next DeleteVolume: a call holds it"
                );
            }
            self.volumes
                .finish_delete_after_removal(&id, &table, claim.is_some());
            drop(claim);
            self.volumes.end_background_deletion(&id);
        }
    }

    /// Claims `key` (a volume ID, `name/<name>`, a snapshot's or group's key), then runs
    /// `work` on the blocking pool while holding the claim; a second call on the same key
    /// meanwhile is refused.
    pub async fn claimed<T, E>(
        self: &Arc<Self>,
        key: &str,
        work: impl FnOnce(&Driver) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<VolumeError> + From<WorkerError> + Send + 'static,
    {
        let claim = match self.claims.claim(key) {
            Ok(claim) => claim,
            Err(busy) => return Err(VolumeError::from(busy).into()),
        };
        self.blocking(move |driver| {
            let _claim = claim;
            work(driver)
        })
        .await
    }

    /// Runs `work` on the blocking pool without a claim: for reads that change nothing.
    pub async fn blocking<T, E>(
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

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The state directory, canonical.
    pub fn state_dir(&self) -> &Path {
        self.state_dir.root()
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

    /// Up to `max` volumes (0: all) in ID order from `start`, and the ID that follows them.
    pub fn volume_page(&self, start: Option<&str>, max: usize) -> (Vec<Record>, Option<String>) {
        self.volumes.records().page(start, max)
    }

    /// A provisioned volume that must exist (`call` names what an inline one refuses).
    pub fn provisioned(&self, id: &str, call: &'static str) -> Result<Record, VolumeError> {
        self.volumes.records().provisioned(id, call)
    }

    /// A volume that must exist.
    pub fn known_volume(&self, id: &str) -> Result<Record, VolumeError> {
        self.volumes.records().known(id)
    }

    /// Bytes still free for new volumes.
    pub fn available(&self) -> Result<u64, VolumeError> {
        self.volumes.available()
    }

    /// Up to `max` snapshots that pass `filter`, from `start`, and the ID that follows them.
    pub fn snapshot_page(
        &self,
        filter: Filter,
        start: Option<&str>,
        max: usize,
    ) -> (Vec<Snapshot>, Option<String>) {
        self.snapshots.page(filter, start, max)
    }

    /// Whether `id`'s deletion is being ended in the background (see
    /// [`finish_deletes_after_removal`](Self::finish_deletes_after_removal)).
    pub fn deleting_in_background(&self, id: &str) -> bool {
        self.volumes.deleting_in_background(id)
    }

    /// A snapshot that must exist.
    pub fn known_snapshot(&self, id: &str) -> Result<Snapshot, SnapshotError> {
        self.snapshots.known(id)
    }
}
