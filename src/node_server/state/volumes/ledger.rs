//! What the volumes spend of the node's capacity, and what is left (the rules are
//! [`capacity`]'s): every volume's size (a deleted one's leftovers excepted), the sizes and
//! inode limits of volumes still being filled ([`Reservation`]), and the bytes snapshots hold
//! (charged against `--capacity`). Without `--capacity` and without `--overcommit`, what each
//! volume may still write — its size less its usage — stays promised in the free space, and so
//! do the inodes its limit may still create.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use super::catalog::Catalog;
use super::storage::VolumeStorage;
use super::volume_error::VolumeError;
use super::volume_record::Record;
use crate::node_server::state::capacity;
use crate::path_io::PathIoError;

/// `--capacity` and `--overcommit`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sizing {
    /// `None` means "the free space of the filesystem".
    pub total: Option<u64>,
    /// Without `total`, sizes are not reserved in the free space.
    pub overcommit: bool,
}

#[derive(Debug, Default)]
struct Counts {
    /// Sizes of volumes being filled (restores, clones) whose records are not written yet.
    reserved: u64,
    /// Their inode limits, likewise.
    reserved_inodes: u64,
    /// Bytes `--capacity` spends outside volumes: the data snapshots hold.
    charged: u64,
}

#[derive(Debug)]
pub struct Ledger {
    sizing: Sizing,
    /// Where the volumes' data is: its filesystem's free space and inodes.
    data_dir: PathBuf,
    counts: Mutex<Counts>,
    /// Held while a decision spends capacity (create, expand, a snapshot's charge), so two of
    /// them cannot both take the last free bytes.
    deciding: Mutex<()>,
}

/// The size of a volume being filled, counted as allocated until its record is; dropping it
/// gives the size back (the record, if written, counts it from then on).
pub struct Reservation<'a> {
    ledger: &'a Ledger,
    bytes: u64,
    inodes: u64,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut counts = self.ledger.counts();
        counts.reserved = counts.reserved.saturating_sub(self.bytes);
        counts.reserved_inodes = counts.reserved_inodes.saturating_sub(self.inodes);
    }
}

/// The inodes a filesystem volume may still create: its inode limit less `used` (none known:
/// all of it). A block or image volume is one file; a volume without a limit has nothing to
/// keep.
fn inodes_promised_by(record: &Record, used: Option<u64>) -> u64 {
    if record.has_own_file() {
        return 0;
    }
    let limit = capacity::inode_limit(record.attributes.inode_limit, record.capacity);
    capacity::promised_inodes(limit, used.unwrap_or(0))
}

/// The bytes the file of a block or image volume holds on the filesystem (all of a thick
/// image's; a sparse block volume's written blocks); 0 if it cannot be read.
fn own_file_bytes(data_dir: &Path, id: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let file = crate::node_server::state::state_dir::block_image_in(&data_dir.join(id));
    std::fs::symlink_metadata(file).map_or(0, |meta| meta.blocks().saturating_mul(512))
}

impl Ledger {
    pub fn new(sizing: Sizing, data_dir: &Path) -> Self {
        Self {
            sizing,
            data_dir: data_dir.to_owned(),
            counts: Mutex::default(),
            deciding: Mutex::default(),
        }
    }

    fn counts(&self) -> MutexGuard<'_, Counts> {
        crate::mutex::lock(&self.counts)
    }

    /// Held while one decision spends capacity; the next waits.
    pub fn deciding(&self) -> MutexGuard<'_, ()> {
        crate::mutex::lock(&self.deciding)
    }

    /// Counts `record`'s size and inode limit as allocated while it is filled.
    pub fn reserve(&self, record: &Record) -> Reservation<'_> {
        let (bytes, inodes) = (record.capacity, inodes_promised_by(record, None));
        let mut counts = self.counts();
        counts.reserved = counts.reserved.saturating_add(bytes);
        counts.reserved_inodes = counts.reserved_inodes.saturating_add(inodes);
        drop(counts);
        Reservation {
            ledger: self,
            bytes,
            inodes,
        }
    }

    /// Bytes still free for new volumes. Without `--capacity` (and without `--overcommit`)
    /// each volume's size less its usage stays promised; a volume whose usage cannot be read
    /// (sizes only accounted) keeps its whole size promised, so the answer errs low, never high.
    pub fn available(
        &self,
        catalog: &Catalog,
        storage: &dyn VolumeStorage,
    ) -> Result<u64, VolumeError> {
        let Sizing { total, overcommit } = self.sizing;
        let (reserved, charged) = {
            let counts = self.counts();
            (counts.reserved, counts.charged)
        };
        let (allocated, live) = catalog.with_all(|records| {
            // A deleted volume's leftovers are the filesystem's, not a volume's.
            let allocated = (records.values())
                .filter(|r| !r.leftover)
                .fold(0u64, |sum, r| sum.saturating_add(r.capacity))
                .saturating_add(reserved)
                .saturating_add(charged);
            let live: Vec<Record> = if total.is_none() && !overcommit {
                let live = records.values().filter(|r| !r.deleting);
                live.cloned().collect()
            } else {
                Vec::new()
            };
            (allocated, live)
        });
        let promised = live.iter().fold(reserved, |sum, r| {
            let used = match r.has_own_file() {
                // What its file holds already is the filesystem's used space, not free.
                true => own_file_bytes(&self.data_dir, &r.id),
                false => storage.usage(r).map_or(0, |usage| usage.bytes),
            };
            sum.saturating_add(capacity::promised(r.capacity, used))
        });
        let promised = if overcommit { 0 } else { promised };
        let available = capacity::available(total, allocated, promised, &self.data_dir)
            .map_err(PathIoError::at("measure free space of", &self.data_dir))?;
        Ok(available)
    }

    /// Refuses a new volume that does not fit: its size in what is available, and its inode
    /// limit in the filesystem's free inodes less those the other volumes' limits still
    /// promise (any free one, with `--overcommit` or without a limit). Where the filesystem
    /// makes inodes as it needs them (XFS) nothing is promised; filesystems that report no
    /// inode count (btrfs) are not checked. The caller holds [`Self::deciding`].
    pub fn check_fits(
        &self,
        record: &Record,
        catalog: &Catalog,
        storage: &dyn VolumeStorage,
    ) -> Result<(), VolumeError> {
        let available = self.available(catalog, storage)?;
        if record.capacity > available {
            return Err(VolumeError::NoSpace {
                asked: record.capacity,
                available,
            });
        }
        if record.has_own_file() {
            return Ok(());
        }
        let Some(inodes) = capacity::inodes(&self.data_dir)
            .map_err(PathIoError::at("measure free inodes of", &self.data_dir))?
        else {
            return Ok(());
        };
        let limit = capacity::inode_limit(record.attributes.inode_limit, record.capacity);
        let (asked, promised) = match self.sizing.overcommit {
            true => (1, 0),
            false => (limit.max(1), self.promised_inodes(catalog, storage)),
        };
        let available = capacity::inodes_available(inodes, promised);
        if available < asked {
            return Err(VolumeError::NoInodes { asked, available });
        }
        Ok(())
    }

    /// The inodes the live volumes may still create (those being filled included): each
    /// one's inode limit less what it uses, where that is read; its whole limit where it is
    /// not.
    pub(super) fn promised_inodes(&self, catalog: &Catalog, storage: &dyn VolumeStorage) -> u64 {
        let reserved = self.counts().reserved_inodes;
        let live: Vec<Record> = catalog.with_all(|records| {
            let live = records
                .values()
                .filter(|r| !r.deleting && !r.has_own_file());
            live.cloned().collect()
        });
        live.iter().fold(reserved, |sum, r| {
            let used = storage.usage(r).map(|usage| usage.inodes);
            sum.saturating_add(inodes_promised_by(r, used))
        })
    }

    /// Counts `bytes` held outside volumes (a snapshot's data) against `--capacity`, if they
    /// fit; without `--capacity` the filesystem's free space already shows them.
    pub fn charge(
        &self,
        bytes: u64,
        catalog: &Catalog,
        storage: &dyn VolumeStorage,
    ) -> Result<(), VolumeError> {
        let _deciding = self.deciding();
        if self.sizing.total.is_some() {
            let available = self.available(catalog, storage)?;
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
        let mut counts = self.counts();
        counts.charged = counts.charged.saturating_add(bytes);
    }

    /// Gives back what [`charge`](Self::charge) counted.
    pub fn refund(&self, bytes: u64) {
        let mut counts = self.counts();
        counts.charged = counts.charged.saturating_sub(bytes);
    }
}
