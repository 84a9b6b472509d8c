//! The volumes this node owns, in the seams a second layout of volume needs:
//!
//! - [`volume_record`] — what is remembered of a volume ([`Record`]) and its JSON on disk;
//!   [`layout`] — a filesystem volume's layout ([`Layout`]: a directory, or an image file
//!   holding a filesystem of its own);
//!   [`catalog`] — the records in memory, written by the store before they count, with their
//!   [`mount_notes`] beside them; [`roles`] — which call each noted path belongs to.
//! - [`claims`] — the per-key claims that refuse a second operation on a busy volume.
//! - [`ledger`] — capacity: what the volumes spend, what is reserved and promised, and what is
//!   left.
//! - [`storage`] — the storage behind a volume, as a trait ([`VolumeStorage`]);
//!   [`quota_directories`] — today's layout: a directory held by a project quota;
//!   [`project_quotas`] — what volumes get from project quotas: a project and a limit each,
//!   released at deletion, their own usage for stats.
//! - [`lifecycle`] — create (with a fill), resize, new attributes, delete, and deletions
//!   finished after a crash, through the three above.
//! - [`volume_error`] — what they fail with.

pub mod catalog;
pub mod claims;
pub mod layout;
pub mod ledger;
mod lifecycle;
pub mod mount_notes;
pub mod project_quotas;
pub mod quota_directories;
pub mod roles;
pub mod storage;
pub mod volume_error;
pub mod volume_record;

use std::path::PathBuf;

use crate::node_server::state::state_dir::StateDir;
use crate::node_server::state::store;
pub use catalog::Catalog;
pub use claims::{Busy, Claim, Claims};
pub use layout::{LAYOUT, Layout};
pub use ledger::{Ledger, Sizing};
pub use quota_directories::QuotaDirectories;
pub use storage::VolumeStorage;
pub use volume_error::VolumeError;
pub use volume_record::{ContentSource, Record, Target};

#[derive(Debug)]
pub struct Volumes {
    state: StateDir,
    catalog: Catalog,
    ledger: Ledger,
    directories: QuotaDirectories,
    /// Deletions whose data start-up set aside, still charging their projects until the
    /// background removal is done ([`Self::finish_delete_after_removal`]).
    awaiting_removal: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl Volumes {
    /// Loads every volume record of the state directory and puts each recorded volume back
    /// under its limits.
    pub fn open(
        state: &StateDir,
        sizing: Sizing,
        directories: QuotaDirectories,
    ) -> Result<Self, VolumeError> {
        let catalog = Catalog::open(state.volume_records())?;
        let loaded = catalog.with_all(|records| records.values().cloned().collect::<Vec<_>>());
        log::info!(
            "loaded {} volume record(s) from {}",
            loaded.len(),
            state.root().display()
        );
        directories.adopt(&loaded);
        Ok(Self {
            state: state.clone(),
            catalog,
            ledger: Ledger::new(sizing, state.volume_data()),
            directories,
            awaiting_removal: Default::default(),
        })
    }

    /// The records.
    pub fn records(&self) -> &Catalog {
        &self.catalog
    }

    /// Today's one layout, for what only it has (project quotas, the patrol's walks).
    pub fn directories(&self) -> &QuotaDirectories {
        &self.directories
    }

    /// The storage behind `record`'s volume.
    pub fn storage_of(&self, _record: &Record) -> &dyn VolumeStorage {
        &self.directories
    }

    /// The storage behind volume `id`, recorded or not (its data is still to be found).
    fn storage_of_id(&self, _id: &str) -> &dyn VolumeStorage {
        &self.directories
    }

    /// The directory of a volume's data, whatever its layout (which may not exist).
    pub fn path_of(&self, id: &str) -> PathBuf {
        self.state.volume(id)
    }

    /// A fresh volume ID. IDs are random (std's per-process random hasher keys), never reused
    /// while a record or a directory of that name exists.
    pub fn new_id(&self) -> String {
        store::new_id("vol-", |id| {
            self.catalog.contains(id) || self.path_of(id).exists()
        })
    }

    /// Bytes still free for new volumes (see [`Ledger::available`]).
    pub fn available(&self) -> Result<u64, VolumeError> {
        self.ledger.available(&self.catalog, &self.directories)
    }

    /// Counts a snapshot's bytes against `--capacity`, if they fit.
    pub fn charge(&self, bytes: u64) -> Result<(), VolumeError> {
        self.ledger.charge(bytes, &self.catalog, &self.directories)
    }

    /// Counts bytes already on disk (snapshots found at start-up), fitting or not.
    pub fn charge_loaded(&self, bytes: u64) {
        self.ledger.charge_loaded(bytes);
    }

    /// Gives back what [`Self::charge`] counted.
    pub fn refund(&self, bytes: u64) {
        self.ledger.refund(bytes);
    }
}

#[cfg(test)]
mod tests;
