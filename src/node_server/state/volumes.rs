//! The volumes this node owns: their records (persisted by [`Store`]), their data directories
//! (where [`StateDir`] says), capacity accounting (and enforcement, through
//! [`VolumeQuotas`]), and per-volume locks.
//!
//! Locks are try-locks: a second call on a volume while one is running gets ABORTED at once
//! (the CSI rule; the CO retries), and calls on different volumes never wait for each other.

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::linux::mountinfo::{MountTable, Unlocatable};
use crate::linux::quota::QuotaError;
use crate::node_server::state::attributes::Attributes;
use crate::node_server::state::capacity;
use crate::node_server::state::layout::StateDir;
use crate::node_server::state::orphans::Orphans;
pub use crate::node_server::state::store::{ContentSource, Record};
use crate::node_server::state::store::{Store, sync_dir};
use crate::node_server::state::volume_quota::{self, Hold, LimitKept, Released, VolumeQuotas};
use crate::path_io::PathIoError;

/// What can go wrong with the volumes themselves; each variant names the volume, the sizes or
/// the path involved.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("an operation on {key} is already in progress")]
    Busy { key: String },
    #[error("volume {id} does not exist")]
    NotFound { id: String },
    #[error("{asked} bytes asked for, {available} available")]
    NoSpace { asked: u64, available: u64 },
    #[error(
        "{asked} inodes needed, {available} available (the filesystem's free inodes less \
         those promised to other volumes)"
    )]
    NoInodes { asked: u64, available: u64 },
    #[error("growing by {growth} bytes does not fit: {available} available")]
    NoRoomToGrow { growth: u64, available: u64 },
    /// An inline ephemeral volume asked for what only a provisioned volume does.
    #[error(
        "volume {id} is an inline ephemeral volume: it lives only as its pod's, and {call} \
         does not apply to it"
    )]
    Ephemeral { id: String, call: &'static str },
    #[error("volume {id} is in use: mounted at {}", at.display())]
    InUse { id: String, at: PathBuf },
    /// Marked deleted, but its data could not all be removed; the error names what is left.
    #[error("volume {id} is marked deleted, but {source}")]
    Undeletable {
        id: String,
        #[source]
        source: crate::linux::copy::CopyError,
    },
    #[error(transparent)]
    Unlocatable(#[from] Unlocatable),
    #[error(transparent)]
    Io(#[from] PathIoError),
    #[error(transparent)]
    Quota(#[from] QuotaError),
    #[error(transparent)]
    LimitKept(#[from] LimitKept),
}

#[derive(Debug, Default)]
struct Inner {
    records: BTreeMap<String, Record>,
    busy: HashSet<String>,
    /// Sizes of volumes being filled (restores, clones) whose records are not written yet.
    reserved: u64,
    /// Their inode limits, likewise.
    reserved_inodes: u64,
    /// Bytes `--capacity` spends outside volumes: the data snapshots hold.
    charged: u64,
}

#[derive(Debug)]
pub struct Volumes {
    state: StateDir,
    store: Store,
    /// `--capacity`; `None` means "the free space of the filesystem".
    total: Option<u64>,
    /// `--overcommit`: without `--capacity`, sizes are not reserved in the free space.
    overcommit: bool,
    inner: Mutex<Inner>,
    /// Held while a decision spends capacity (create, expand), so two of them cannot both
    /// take the last free bytes.
    provisioning: Mutex<()>,
    quotas: VolumeQuotas,
}

/// The size of a volume being filled, counted as allocated until its record is; dropping it
/// gives the size back (the record, if written, counts it from then on).
struct Reservation<'a> {
    volumes: &'a Volumes,
    bytes: u64,
    inodes: u64,
}

impl<'a> Reservation<'a> {
    fn new(volumes: &'a Volumes, record: &Record) -> Self {
        let (bytes, inodes) = (record.capacity, inodes_promised_by(record, None));
        let mut inner = volumes.inner();
        inner.reserved = inner.reserved.saturating_add(bytes);
        inner.reserved_inodes = inner.reserved_inodes.saturating_add(inodes);
        drop(inner);
        Self {
            volumes,
            bytes,
            inodes,
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut inner = self.volumes.inner();
        inner.reserved = inner.reserved.saturating_sub(self.bytes);
        inner.reserved_inodes = inner.reserved_inodes.saturating_sub(self.inodes);
    }
}

/// The inodes a filesystem volume may still create: its inode limit less `used` (none known:
/// all of it). A block volume is one file; a volume without a limit has nothing to keep.
fn inodes_promised_by(record: &Record, used: Option<u64>) -> u64 {
    if record.block {
        return 0;
    }
    let limit = capacity::inode_limit(record.attributes.inode_limit, record.capacity);
    capacity::promised_inodes(limit, used.unwrap_or(0))
}

/// An operation in progress on one volume (or one volume name); dropping it ends it.
#[derive(Debug)]
pub struct Busy {
    volumes: Arc<Volumes>,
    key: String,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.volumes.inner().busy.remove(&self.key);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the data consistent, so a panic elsewhere does not
    // make it unusable.
    crate::mutex::lock(mutex)
}

impl Volumes {
    /// Opens the volumes of the state directory and loads every record; sizes are accounted,
    /// not enforced.
    pub fn open(state: &StateDir, total: Option<u64>) -> Result<Arc<Self>, VolumeError> {
        Self::open_with(state, total, false, VolumeQuotas::off())
    }

    /// The directory volume directories are made in, created.
    pub fn create_data_dir(state: &StateDir) -> Result<&Path, VolumeError> {
        let data_dir = state.volume_data();
        std::fs::create_dir_all(data_dir).map_err(PathIoError::at("create", data_dir))?;
        Ok(data_dir)
    }

    /// [`Self::open`], with sizes held as `quotas` decided; the recorded volumes are put back
    /// under their limits.
    pub fn open_with(
        state: &StateDir,
        total: Option<u64>,
        overcommit: bool,
        quotas: VolumeQuotas,
    ) -> Result<Arc<Self>, VolumeError> {
        Self::create_data_dir(state)?;
        let (store, mut loaded) = Store::<Record>::open(state.volume_records().clone())?;
        loaded.iter_mut().for_each(|r| store.read_mount_notes(r));
        log::info!(
            "loaded {} volume record(s) from {}",
            loaded.len(),
            state.root().display()
        );
        let dirs: Vec<PathBuf> = loaded.iter().map(|r| state.volume(&r.id)).collect();
        quotas.adopt(dirs.iter().map(PathBuf::as_path).zip(&loaded));
        let records = loaded.into_iter().map(|r| (r.id.clone(), r)).collect();
        Ok(Arc::new(Self {
            state: state.clone(),
            store,
            total,
            overcommit,
            inner: Mutex::new(Inner {
                records,
                busy: HashSet::new(),
                ..Inner::default()
            }),
            provisioning: Mutex::new(()),
            quotas,
        }))
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// The data directory of a volume (which may not exist).
    pub fn path_of(&self, id: &str) -> PathBuf {
        self.state.volume(id)
    }

    /// Starts an operation on `key`, or refuses at once if one is running.
    pub fn lock(self: &Arc<Self>, key: &str) -> Result<Busy, VolumeError> {
        if !self.inner().busy.insert(key.to_owned()) {
            return Err(VolumeError::Busy {
                key: key.to_owned(),
            });
        }
        Ok(Busy {
            volumes: Arc::clone(self),
            key: key.to_owned(),
        })
    }

    pub fn get(&self, id: &str) -> Option<Record> {
        self.inner().records.get(id).cloned()
    }

    /// A volume that must exist.
    /// A volume that must exist (one being deleted does not).
    pub fn known(&self, id: &str) -> Result<Record, VolumeError> {
        self.get(id)
            .filter(|r| !r.deleting)
            .ok_or_else(|| VolumeError::NotFound { id: id.to_owned() })
    }

    /// A volume that must exist and be a provisioned one, not an inline ephemeral volume
    /// (which `call` does not apply to).
    pub fn provisioned(&self, id: &str, call: &'static str) -> Result<Record, VolumeError> {
        match self.known(id)? {
            record if record.ephemeral => Err(VolumeError::Ephemeral {
                id: id.to_owned(),
                call,
            }),
            record => Ok(record),
        }
    }

    pub fn find_name(&self, name: &str) -> Option<Record> {
        let inner = self.inner();
        let mut live = inner.records.values().filter(|r| !r.deleting);
        live.find(|r| r.name == name).cloned()
    }

    /// Up to `max` records (0: all) in ID order from `start`, and the ID that follows them.
    pub fn page(&self, start: Option<&str>, max: usize) -> (Vec<Record>, Option<String>) {
        let inner = self.inner();
        let mut iter = inner
            .records
            .range(start.unwrap_or_default().to_owned()..)
            .map(|(_, r)| r)
            .filter(|r| !r.deleting);
        let limit = if max == 0 { usize::MAX } else { max };
        let page: Vec<Record> = iter.by_ref().take(limit).cloned().collect();
        (page, iter.next().map(|r| r.id.clone()))
    }

    /// Bytes still free for new volumes. Without `--capacity` (and without `--overcommit`)
    /// each volume's size less its usage stays promised; a volume whose usage cannot be read
    /// (sizes only accounted) keeps its whole size promised, so the answer errs low, never high.
    pub fn available(&self) -> Result<u64, VolumeError> {
        let (allocated, live, reserved) = {
            let inner = self.inner();
            // A deleted volume's leftovers are the filesystem's, not a volume's.
            let allocated = (inner.records.values())
                .filter(|r| !r.leftover)
                .fold(0u64, |sum, r| sum.saturating_add(r.capacity))
                .saturating_add(inner.reserved)
                .saturating_add(inner.charged);
            let live: Vec<Record> = if self.total.is_none() && !self.overcommit {
                inner
                    .records
                    .values()
                    .filter(|r| !r.deleting)
                    .cloned()
                    .collect()
            } else {
                Vec::new()
            };
            (allocated, live, inner.reserved)
        };
        let promised = live
            .iter()
            .fold(reserved, |sum, r| sum.saturating_add(self.promised(r)));
        let promised = if self.overcommit { 0 } else { promised };
        let data_dir = self.state.volume_data();
        let available = capacity::available(self.total, allocated, promised, data_dir)
            .map_err(PathIoError::at("measure free space of", data_dir))?;
        Ok(available)
    }

    /// What a volume may still write: its size less its project's usage where that is read.
    fn promised(&self, record: &Record) -> u64 {
        let used = match self.quotas.hold(record) {
            Ok(Hold::Enforced { usage, .. }) => usage.bytes,
            _ => 0,
        };
        capacity::promised(record.capacity, used)
    }

    /// Refuses a new filesystem volume when the filesystem's free inodes, less those the
    /// other volumes' limits still promise, cannot hold its inode limit (any free one, with
    /// `--overcommit` or without a limit). Where the filesystem makes inodes as it needs them
    /// (XFS) nothing is promised; filesystems that report no inode count (btrfs) are not
    /// checked.
    fn check_inodes(&self, record: &Record) -> Result<(), VolumeError> {
        if record.block {
            return Ok(());
        }
        let data_dir = self.state.volume_data();
        let Some(inodes) = capacity::inodes(data_dir)
            .map_err(PathIoError::at("measure free inodes of", data_dir))?
        else {
            return Ok(());
        };
        let limit = capacity::inode_limit(record.attributes.inode_limit, record.capacity);
        let (asked, promised) = match self.overcommit {
            true => (1, 0),
            false => (limit.max(1), self.promised_inodes()),
        };
        let available = capacity::inodes_available(inodes, promised);
        if available < asked {
            return Err(VolumeError::NoInodes { asked, available });
        }
        Ok(())
    }

    /// The inodes the live volumes may still create (those being filled included): each
    /// one's inode limit less what its project uses, where that is read; its whole limit
    /// where it is not.
    fn promised_inodes(&self) -> u64 {
        let (live, reserved) = {
            let inner = self.inner();
            let live: Vec<Record> = (inner.records.values())
                .filter(|r| !r.deleting && !r.block)
                .cloned()
                .collect();
            (live, inner.reserved_inodes)
        };
        live.iter().fold(reserved, |sum, r| {
            let used = match self.quotas.hold(r) {
                Ok(Hold::Enforced { usage, .. }) => Some(usage.inodes),
                _ => None,
            };
            sum.saturating_add(inodes_promised_by(r, used))
        })
    }

    /// A fresh volume ID. IDs are random (std's per-process random hasher keys), never reused
    /// while a record or a directory of that name exists.
    pub fn new_id(&self) -> String {
        crate::node_server::state::store::new_id("vol-", |id| {
            self.inner().records.contains_key(id) || self.path_of(id).exists()
        })
    }

    /// Creates a volume's directory and record if its size fits. The caller holds the lock on
    /// the ID or name.
    pub fn create(&self, record: Record) -> Result<Record, VolumeError> {
        self.create_with(record, |_, _| Ok(()))
    }

    /// Creates a volume like [`create`](Self::create), with `fill` giving the prepared
    /// directory its first content (a restore, a clone) before the record promises it. Where
    /// sizes are enforced the directory is put in a project of its own, limited to the
    /// capacity, before `fill` (which gets the directory and the record, its project ID in it), so
    /// what it copies is charged to the volume. The size is
    /// reserved while `fill` runs, so other creates neither wait for a long copy nor take the
    /// bytes it needs; if `fill` fails, the directory and its project go and nothing is
    /// recorded. A crash before the record leaves a directory that the next start removes
    /// (its project ID, held by no record, is then free again).
    pub fn create_with<E: From<VolumeError>>(
        &self,
        mut record: Record,
        fill: impl FnOnce(&Path, &Record) -> Result<(), E>,
    ) -> Result<Record, E> {
        let dir = self.path_of(&record.id);
        let reservation = {
            let _provisioning = lock(&self.provisioning);
            let available = self.available()?;
            if record.capacity > available {
                return Err(VolumeError::NoSpace {
                    asked: record.capacity,
                    available,
                }
                .into());
            }
            self.check_inodes(&record)?;
            // A block volume's file cannot outgrow its size: it needs no project.
            if !record.block {
                record.project_id = self.quotas.allocate().map_err(VolumeError::from)?;
            }
            if let Err(e) = self.make_dir(&dir) {
                self.quotas.abandon(&dir, &record);
                return Err(e.into());
            }
            Reservation::new(self, &record)
        };
        let filled = (self.quotas.assign(&dir, &record))
            .map_err(|e| E::from(e.into()))
            .and_then(|()| fill(&dir, &record));
        if let Err(e) = filled {
            self.quotas.abandon(&dir, &record);
            if let Err(left) = crate::linux::copy::remove_tree(&dir) {
                log::error!("volume {} failed to fill; removing it: {left}", record.id);
            }
            return Err(e);
        }
        // The directory must be durable before the record that promises it.
        sync_dir(self.state.volume_data()).map_err(VolumeError::from)?;
        if let Err(e) = self.store.save(&record) {
            self.quotas.abandon(&dir, &record);
            let _ = crate::linux::copy::remove_tree(&dir);
            return Err(VolumeError::from(e).into());
        }
        self.inner()
            .records
            .insert(record.id.clone(), record.clone());
        drop(reservation);
        log::info!(
            "created volume {} ({} bytes{}{}{}{})",
            record.id,
            record.capacity,
            if record.ephemeral { ", ephemeral" } else { "" },
            if record.block { ", block" } else { "" },
            record
                .project_id
                .map(|id| format!(", project quota {id}"))
                .unwrap_or_default(),
            match &record.source {
                Some(ContentSource::Snapshot(id)) => format!(", restored from {id}"),
                Some(ContentSource::Volume(id)) => format!(", cloned from {id}"),
                None => String::new(),
            }
        );
        Ok(record)
    }

    /// A new volume's directory, world-writable (made durable, with its content, before its
    /// record).
    fn make_dir(&self, dir: &Path) -> Result<(), VolumeError> {
        match std::fs::create_dir(dir) {
            Ok(()) => {}
            // Left by a crash between mkdir and the record: the same volume, still empty.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(PathIoError::at("create", dir)(e).into()),
        }
        // World-writable like an emptyDir: pods run as any user; volume_mount_group narrows
        // the group when the CO asks.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
            .map_err(PathIoError::at("set mode of", dir))?;
        Ok(())
    }

    /// Counts `bytes` held outside volumes (a snapshot's data) against `--capacity`, if they
    /// fit; without `--capacity` the filesystem's free space already shows them.
    pub fn charge(&self, bytes: u64) -> Result<(), VolumeError> {
        let _provisioning = lock(&self.provisioning);
        if self.total.is_some() {
            let available = self.available()?;
            if bytes > available {
                return Err(VolumeError::NoSpace {
                    asked: bytes,
                    available,
                });
            }
        }
        self.charge_loaded(bytes);
        Ok(())
    }

    /// Counts bytes already on disk (snapshots found at start-up), fitting or not.
    pub fn charge_loaded(&self, bytes: u64) {
        let mut inner = self.inner();
        inner.charged = inner.charged.saturating_add(bytes);
    }

    /// Gives back what [`charge`](Self::charge) counted.
    pub fn refund(&self, bytes: u64) {
        let mut inner = self.inner();
        inner.charged = inner.charged.saturating_sub(bytes);
    }

    /// Sets aside for removal volume directories that have no record file: creates (and
    /// restores, clones) that a crash interrupted before their record, which nobody was ever
    /// told about. A directory whose record exists but cannot be read is kept. Run at start-up,
    /// before anything is served: one rename each, so no call can find them however large.
    pub fn set_aside_unrecorded(&self, orphans: &Orphans) -> Result<(), VolumeError> {
        let data_dir = self.state.volume_data();
        orphans
            .resume(data_dir)
            .map_err(PathIoError::at("list", data_dir))?;
        let names = std::fs::read_dir(data_dir).map_err(PathIoError::at("list", data_dir))?;
        for entry in names {
            let entry = entry.map_err(PathIoError::at("list", data_dir))?;
            let name = entry.file_name();
            let Some(id) = name.to_str() else { continue };
            if crate::node_server::state::layout::volume_id_problem(id).is_some()
                || self.store.has_file(id)
            {
                continue;
            }
            log::info!("volume directory {id} has no record: its create was interrupted");
            if let Err(e) = orphans.set_aside(data_dir, &name) {
                log::error!("could not set aside volume directory {id}: {e}");
            }
        }
        Ok(())
    }

    /// Grows a volume's accounted size, if the growth fits.
    pub fn resize(&self, id: &str, capacity: u64) -> Result<Record, VolumeError> {
        let _provisioning = lock(&self.provisioning);
        let mut record = self.known(id)?;
        self.quotas.check_changeable(&record)?;
        let growth = capacity.saturating_sub(record.capacity);
        let available = self.available()?;
        if growth > available {
            return Err(VolumeError::NoRoomToGrow { growth, available });
        }
        record.capacity = capacity;
        self.store.save(&record)?;
        self.inner().records.insert(id.to_owned(), record.clone());
        log::info!("volume {id} now has {capacity} bytes");
        // After the record: a crash in between leaves the larger size to the next start.
        self.quotas.apply(&record)?;
        Ok(record)
    }

    /// Why sizes are not enforced here (so no volume has a project quota to hold an inode
    /// limit), unless they are.
    pub fn quota_reason(&self) -> Option<&str> {
        self.quotas.reason()
    }

    /// Gives a volume new attributes: the record first, then its quota limits and its root
    /// directory's mode, which take effect at once. A crash in between leaves the record's
    /// limits to the next start, which puts every volume back under them; a retry applies
    /// them again.
    pub fn set_attributes(&self, id: &str, attributes: Attributes) -> Result<Record, VolumeError> {
        let mut record = self.known(id)?;
        if record.attributes != attributes {
            record.attributes = attributes;
            self.store.save(&record)?;
            self.inner().records.insert(id.to_owned(), record.clone());
            log::info!("volume {id} now has attributes {:?}", attributes.to_map());
        }
        self.quotas.apply(&record)?;
        self.apply_root_mode(&record)?;
        Ok(record)
    }

    /// Sets the root directory's mode to the volume's `rootMode`, if it has one.
    pub fn apply_root_mode(&self, record: &Record) -> Result<(), VolumeError> {
        let Some(mode) = record.attributes.root_mode else {
            return Ok(());
        };
        let dir = self.path_of(&record.id);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
            .map_err(PathIoError::at("set the mode of", &dir))?;
        Ok(())
    }

    /// Holds a volume to its recorded capacity at once (expansion; a retry after a failed
    /// one finds the record already grown and only needs this).
    pub fn apply_limit(&self, record: &Record) -> Result<(), VolumeError> {
        self.quotas.check_changeable(record)?;
        Ok(self.quotas.apply(record)?)
    }

    /// Raises a new volume's limit by `headroom` while its content is copied in; see
    /// [`VolumeQuotas::allow_copy`]. [`Self::apply_limit`] ends it.
    pub fn allow_copy(&self, record: &Record, headroom: u64) -> Result<(), VolumeError> {
        Ok(self.quotas.allow_copy(record, headroom)?)
    }

    /// How a volume's size holds: its own usage and limit, or why it is not enforced.
    pub fn hold(&self, record: &Record) -> Result<Hold, VolumeError> {
        Ok(self.quotas.hold(record)?)
    }

    /// Deletes a volume: marks its record deleted, removes its data, then the record;
    /// refused while anything is mounted on or from its directory. A crash or a file that
    /// cannot be removed leaves a marked record (not listed, not found by name or ID), which
    /// the next DeleteVolume or start-up ([`Self::finish_deletes`]) finishes. The caller holds
    /// the volume lock.
    pub fn delete(&self, id: &str, table: &MountTable) -> Result<(), VolumeError> {
        let dir = self.path_of(id);
        if dir.exists()
            && let Some(at) = table.first_user(&dir)?
        {
            return Err(VolumeError::InUse {
                id: id.to_owned(),
                at,
            });
        }
        if let Some(mut record) = self.get(id).filter(|r| !r.deleting) {
            record.deleting = true;
            self.store.save(&record)?;
            self.inner().records.insert(id.to_owned(), record);
        }
        let removing = dir.exists();
        if removing {
            // Never follows a symlink nor crosses a mount; names the entry it cannot remove.
            crate::linux::copy::remove_tree(&dir).map_err(|source| VolumeError::Undeletable {
                id: id.to_owned(),
                source,
            })?;
            // Durably gone before the record goes, so a crash cannot leave unlisted data.
            sync_dir(self.state.volume_data())?;
        }
        // Its project ID goes before the record that holds it; a failure here leaves the
        // record, and the next DeleteVolume releases it. So does a project still charged
        // with files elsewhere, which keeps its ID, and so the record, until they are gone.
        if let Some(mut record) = self.get(id) {
            // Only data just removed may still be settling.
            let wait = match removing {
                true => volume_quota::SETTLE,
                false => std::time::Duration::ZERO,
            };
            if let Released::Kept(_) = self.quotas.release(&record, wait)? {
                if !record.leftover {
                    record.leftover = true;
                    self.store.save(&record)?;
                    self.inner().records.insert(id.to_owned(), record);
                }
                return Ok(());
            }
        }
        self.store.remove_mount_notes(id)?;
        self.store.remove(id)?;
        self.inner().records.remove(id);
        log::info!("deleted volume {id}");
        Ok(())
    }

    /// Whether a deletion a crash interrupted is waiting for [`Self::finish_deletes`].
    pub fn has_marked_deletions(&self) -> bool {
        self.inner().records.values().any(|r| r.deleting)
    }

    /// Finishes the deletions a crash or a file that could not be removed interrupted: run at
    /// start-up, before anything is served. What is left of a directory nothing is mounted on
    /// or from is set aside for `orphans` to remove in the background (one rename), and the
    /// record goes at once; its project ID stays unused while files still charge it (the
    /// allocator skips IDs with a quota record). One that still cannot finish is logged and
    /// left to the next DeleteVolume.
    pub fn finish_deletes(&self, table: &MountTable, orphans: &Orphans) {
        let marked: Vec<String> = (self.inner().records.values())
            .filter(|r| r.deleting)
            .map(|r| r.id.clone())
            .collect();
        for id in marked {
            let dir = self.path_of(&id);
            let unused = dir.exists() && matches!(table.first_user(&dir), Ok(None));
            if unused
                && let Err(e) =
                    orphans.set_aside(self.state.volume_data(), std::ffi::OsStr::new(&id))
            {
                log::error!("could not set aside what is left of volume {id}: {e}");
            }
            match self.delete(&id, table) {
                Ok(()) if self.get(&id).is_some() => {}
                Ok(()) => log::info!("finished deleting volume {id}"),
                Err(e) => log::error!("could not finish deleting volume {id}: {e}"),
            }
        }
    }

    /// Gives the volume to `gid` (the CSI `volume_mount_group`), group-writable and setgid
    /// so files created in it inherit the group, as Kubernetes does for `fsGroup`.
    pub fn set_group(&self, id: &str, gid: u32) -> Result<(), VolumeError> {
        let dir = self.path_of(id);
        std::os::unix::fs::lchown(&dir, None, Some(gid))
            .map_err(PathIoError::at("set the group of", &dir))?;
        let mode = std::fs::symlink_metadata(&dir)
            .map_err(PathIoError::at("inspect", &dir))?
            .permissions()
            .mode();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode | 0o2070))
            .map_err(PathIoError::at("make group-writable and setgid", &dir))?;
        Ok(())
    }
}

pub mod roles;
#[cfg(test)]
mod tests;
