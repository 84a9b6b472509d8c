//! The snapshots this node holds: each one a copy of a volume's tree in its own data directory,
//! with its record beside the others, and group snapshots' records in a directory of their own
//! (where [`StateDir`] says).
//!
//! A snapshot exists, and is ready to use, once its record does: the copy is complete and
//! durable before the record is written ([`take`]), and a group's record is written after
//! every member's. Deletion goes the other way (record first, then data). So after a crash at
//! any point, start-up ([`Snapshots::open`]) finds only these leftovers, and sets their data
//! aside for removal in the background ([`Orphans`]): partial copies (temporary names), data
//! without a record file, and the members of a group whose record is missing (a group cut or
//! deleted only in part, never reported to anyone; their records are removed at once).
//!
//! [`records`] holds the snapshot and group records and their JSON (the volume records are
//! `state::volumes::volume_record`), `take` the cut itself, and `snapshot_error` what these
//! operations fail with ([`SnapshotError`]).

pub mod records;
mod snapshot_error;
mod take;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use crate::linux::copy;
use crate::node_server::state::orphans::Orphans;
use crate::node_server::state::state_dir::StateDir;
use crate::node_server::state::state_dir::volume_id_problem;
use crate::node_server::state::store::{self, Store};
use crate::path_io::PathIoError;
pub use records::{Group, Snapshot, Time};
pub use snapshot_error::SnapshotError;
pub use take::{Cut, spread};

#[derive(Debug, Default)]
struct Inner {
    snapshots: BTreeMap<String, Snapshot>,
    groups: BTreeMap<String, Group>,
}

/// Which snapshots ListSnapshots asks for.
#[derive(Debug, Clone, Copy, Default)]
pub struct Filter<'a> {
    pub snapshot: Option<&'a str>,
    pub source_volume: Option<&'a str>,
}

#[derive(Debug)]
pub struct Snapshots {
    state: StateDir,
    store: Store<Snapshot>,
    groups: Store<Group>,
    inner: Mutex<Inner>,
}

impl Snapshots {
    /// Opens the snapshot directories of the state directory (creating them), loads every
    /// record and sets aside what interrupted operations left, for `orphans` to remove.
    pub fn open(state: &StateDir, orphans: &Orphans) -> Result<Self, SnapshotError> {
        let data_dir = state.snapshot_data();
        std::fs::create_dir_all(data_dir).map_err(PathIoError::at("create", data_dir))?;
        let (store, snapshots) = Store::<Snapshot>::open(state.snapshot_records().clone())?;
        let (groups, loaded_groups) = Store::<Group>::open(state.group_records().clone())?;
        let this = Self {
            state: state.clone(),
            store,
            groups,
            inner: Mutex::default(),
        };
        this.recover(snapshots, loaded_groups, orphans)?;
        let inner = this.inner();
        log::info!(
            "loaded {} snapshot(s) and {} group snapshot(s)",
            inner.snapshots.len(),
            inner.groups.len()
        );
        drop(inner);
        Ok(this)
    }

    fn recover(
        &self,
        snapshots: Vec<Snapshot>,
        groups: Vec<Group>,
        orphans: &Orphans,
    ) -> Result<(), SnapshotError> {
        let data_dir = self.state.snapshot_data();
        orphans
            .resume(data_dir)
            .map_err(PathIoError::at("list", data_dir))?;
        let set_aside = |name: &std::ffi::OsStr| {
            if let Err(e) = orphans.set_aside(data_dir, name) {
                log::error!("could not set aside {}: {e}", data_dir.join(name).display());
            }
        };
        let partials = copy::partials(data_dir).map_err(SnapshotError::Remove)?;
        for name in partials {
            log::info!("found an interrupted snapshot copy {name:?}");
            set_aside(&name);
        }
        let mut inner = self.inner();
        for snapshot in snapshots {
            let id = snapshot.id.clone();
            if let Some(group) = &snapshot.group
                && !self.groups.has_file(group)
            {
                log::info!("removing snapshot {id}: its group snapshot {group} was not completed");
                self.store.remove(&id)?;
                set_aside(std::ffi::OsStr::new(&id));
            } else if !self.path_of(&id).is_dir() {
                log::error!("snapshot {id} has no data; not offered (its record is left in place)");
            } else {
                inner.snapshots.insert(id, snapshot);
            }
        }
        for group in groups {
            if group
                .members
                .iter()
                .all(|m| inner.snapshots.contains_key(m))
            {
                inner.groups.insert(group.id.clone(), group);
            } else {
                log::error!("group snapshot {} lacks members; not offered", group.id);
            }
        }
        drop(inner);
        for entry in std::fs::read_dir(data_dir).map_err(PathIoError::at("list", data_dir))? {
            let entry = entry.map_err(PathIoError::at("list", data_dir))?;
            let name = entry.file_name();
            let Some(id) = name.to_str() else { continue };
            if volume_id_problem(id).is_none() && !self.store.has_file(id) {
                log::info!("removing snapshot data {id}: its record was never written");
                set_aside(&name);
            }
        }
        Ok(())
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        // Every critical section leaves the maps consistent.
        crate::mutex::lock(&self.inner)
    }

    /// Where a snapshot's tree is (or goes).
    pub fn path_of(&self, id: &str) -> PathBuf {
        self.state.snapshot(id)
    }

    /// A fresh ID with `prefix` (`snap-`, `group-`): never a volume's, never one in use.
    pub fn new_id(&self, prefix: &str) -> String {
        store::new_id(prefix, |id| {
            let inner = self.inner();
            inner.snapshots.contains_key(id)
                || inner.groups.contains_key(id)
                || self.path_of(id).exists()
                || self.store.has_file(id)
                || self.groups.has_file(id)
        })
    }

    pub fn get(&self, id: &str) -> Option<Snapshot> {
        self.inner().snapshots.get(id).cloned()
    }

    /// A snapshot that must exist.
    pub fn known(&self, id: &str) -> Result<Snapshot, SnapshotError> {
        self.get(id)
            .ok_or_else(|| SnapshotError::NotFound { id: id.to_owned() })
    }

    /// The snapshot CreateSnapshot made under `name` (group members have none).
    pub fn find_name(&self, name: &str) -> Option<Snapshot> {
        let inner = self.inner();
        inner.snapshots.values().find(|s| s.name == name).cloned()
    }

    pub fn group(&self, id: &str) -> Option<Group> {
        self.inner().groups.get(id).cloned()
    }

    pub fn find_group_name(&self, name: &str) -> Option<Group> {
        let inner = self.inner();
        inner.groups.values().find(|g| g.name == name).cloned()
    }

    /// A group's member snapshots, in the order of its sources.
    pub fn members(&self, group: &Group) -> Vec<Snapshot> {
        let inner = self.inner();
        (group.members.iter())
            .filter_map(|id| inner.snapshots.get(id).cloned())
            .collect()
    }

    /// The bytes all snapshots hold, as `--capacity` counts them.
    pub fn total_bytes(&self) -> u64 {
        let inner = self.inner();
        (inner.snapshots.values()).fold(0u64, |sum, s| sum.saturating_add(s.bytes))
    }

    /// Up to `max` snapshots (0: all) that pass `filter`, in ID order from `start`, and the ID
    /// that follows them.
    pub fn page(
        &self,
        filter: Filter<'_>,
        start: Option<&str>,
        max: usize,
    ) -> (Vec<Snapshot>, Option<String>) {
        let inner = self.inner();
        let mut iter = (inner
            .snapshots
            .range(start.unwrap_or_default().to_owned()..))
        .map(|(_, s)| s)
        .filter(|s| filter.snapshot.is_none_or(|id| s.id == id))
        .filter(|s| filter.source_volume.is_none_or(|id| s.source_volume == id));
        let limit = if max == 0 { usize::MAX } else { max };
        let page: Vec<Snapshot> = iter.by_ref().take(limit).cloned().collect();
        (page, iter.next().map(|s| s.id.clone()))
    }

    /// Records cut snapshots, and then the group they make (if any): from here on they exist
    /// and are ready. On failure nothing is recorded and their data is removed.
    pub fn commit(
        &self,
        snapshots: &[Snapshot],
        group: Option<&Group>,
    ) -> Result<(), SnapshotError> {
        let saved = (snapshots.iter())
            .try_for_each(|s| self.store.save(s))
            .and_then(|()| group.map_or(Ok(()), |g| self.groups.save(g)));
        if let Err(e) = saved {
            for snapshot in snapshots {
                if let Err(left) = self.discard(&snapshot.id) {
                    log::error!("could not undo snapshot {}: {left}", snapshot.id);
                }
            }
            return Err(e.into());
        }
        let mut inner = self.inner();
        for snapshot in snapshots {
            inner
                .snapshots
                .insert(snapshot.id.clone(), snapshot.clone());
        }
        if let Some(group) = group {
            inner.groups.insert(group.id.clone(), group.clone());
        }
        Ok(())
    }

    /// Deletes a snapshot: its record, durably, and then its data (a crash in between leaves
    /// data without a record, which the next start-up removes). The caller holds its lock.
    pub fn remove(&self, id: &str) -> Result<(), SnapshotError> {
        self.store.remove(id)?;
        self.inner().snapshots.remove(id);
        copy::remove_tree(&self.path_of(id)).map_err(SnapshotError::Remove)?;
        log::info!("deleted snapshot {id}");
        Ok(())
    }

    /// Deletes a group snapshot: its record first, so that a crash midway leaves members
    /// whose group is gone, which the next start-up removes; then every member.
    pub fn remove_group(&self, group: &Group) -> Result<(), SnapshotError> {
        self.groups.remove(&group.id)?;
        self.inner().groups.remove(&group.id);
        for member in &group.members {
            self.remove(member)?;
        }
        log::info!("deleted group snapshot {}", group.id);
        Ok(())
    }

    /// Removes a snapshot that was never (or is no longer) offered: record, then data.
    pub fn discard(&self, id: &str) -> Result<(), SnapshotError> {
        self.store.remove(id)?;
        copy::remove_tree(&self.path_of(id)).map_err(SnapshotError::Remove)
    }
}

#[cfg(test)]
mod tests;
