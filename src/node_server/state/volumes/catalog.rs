//! The volume records: every volume's [`Record`] in memory, each written durably by the
//! [`Store`] before it counts, with where the volume is mounted kept beside it in its mount
//! notes ([`MountNoteFiles`]).

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use super::mount_notes::MountNoteFiles;
use super::volume_error::VolumeError;
use super::volume_record::Record;
use crate::node_server::state::state_dir::RecordDir;
use crate::node_server::state::store::Store;
use crate::path_io::PathIoError;

#[derive(Debug)]
pub struct Catalog {
    store: Store<Record>,
    notes: MountNoteFiles,
    records: Mutex<BTreeMap<String, Record>>,
}

impl Catalog {
    /// Loads every record in `dir` with its mount notes.
    pub fn open(dir: &RecordDir) -> Result<Self, PathIoError> {
        let (store, mut loaded) = Store::<Record>::open(dir.clone())?;
        let notes = MountNoteFiles::new(dir.clone());
        loaded.iter_mut().for_each(|r| notes.read(r));
        let records = loaded.into_iter().map(|r| (r.id.clone(), r)).collect();
        Ok(Self {
            store,
            notes,
            records: Mutex::new(records),
        })
    }

    fn records(&self) -> MutexGuard<'_, BTreeMap<String, Record>> {
        crate::mutex::lock(&self.records)
    }

    /// Runs `read` over every record (those being deleted too) under the catalog's lock: for
    /// sums, never for syscalls.
    pub fn with_all<T>(&self, read: impl FnOnce(&BTreeMap<String, Record>) -> T) -> T {
        read(&self.records())
    }

    pub fn get(&self, id: &str) -> Option<Record> {
        self.records().get(id).cloned()
    }

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
        let records = self.records();
        let mut live = records.values().filter(|r| !r.deleting);
        live.find(|r| r.name == name).cloned()
    }

    /// Up to `max` records (0: all) in ID order from `start`, and the ID that follows them.
    pub fn page(&self, start: Option<&str>, max: usize) -> (Vec<Record>, Option<String>) {
        let records = self.records();
        let mut iter = records
            .range(start.unwrap_or_default().to_owned()..)
            .map(|(_, r)| r)
            .filter(|r| !r.deleting);
        let limit = if max == 0 { usize::MAX } else { max };
        let page: Vec<Record> = iter.by_ref().take(limit).cloned().collect();
        (page, iter.next().map(|r| r.id.clone()))
    }

    pub fn contains(&self, id: &str) -> bool {
        self.records().contains_key(id)
    }

    /// Whether a record file for `id` is there, readable or not: data of an ID whose record
    /// could not be read is never treated as left over.
    pub fn has_file(&self, id: &str) -> bool {
        self.store.has_file(id)
    }

    /// The IDs of the volumes whose deletion began and has not finished.
    pub fn marked_deleted(&self) -> Vec<String> {
        (self.records().values())
            .filter(|r| r.deleting)
            .map(|r| r.id.clone())
            .collect()
    }

    /// Writes `record` durably, then lets it count.
    pub fn save(&self, record: Record) -> Result<(), PathIoError> {
        self.store.save(&record)?;
        self.records().insert(record.id.clone(), record);
        Ok(())
    }

    /// Writes a record's mount notes (unsynced: a reboot undoes the mounts themselves), then
    /// lets them count.
    pub(super) fn save_notes(&self, record: Record) -> Result<(), PathIoError> {
        self.notes.save(&record)?;
        self.records().insert(record.id.clone(), record);
        Ok(())
    }

    /// Removes a record durably, its mount notes first, so no notes outlive their record.
    pub fn remove(&self, id: &str) -> Result<(), PathIoError> {
        self.notes.remove(id)?;
        self.store.remove(id)?;
        self.records().remove(id);
        Ok(())
    }
}
