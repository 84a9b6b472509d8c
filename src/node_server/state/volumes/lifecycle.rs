//! A volume's life through its records, its capacity and its storage: created (empty, or
//! filled by a restore or a clone before its record promises it), grown, given new
//! attributes, deleted, and its deletion finished after a crash. The caller holds the claim
//! on the volume's ID or name.

use std::time::Duration;

use super::Volumes;
use super::project_quotas::{self, Released};
use super::storage::VolumeStorage;
use super::volume_error::VolumeError;
use super::volume_record::{ContentSource, Record};
use crate::linux::mountinfo::MountTable;
use crate::node_server::state::attributes::Attributes;
use crate::node_server::state::orphans::Orphans;

impl Volumes {
    /// Creates an empty volume if its size fits.
    pub fn create(&self, record: Record) -> Result<Record, VolumeError> {
        self.create_with(record, |_| Ok(()))
    }

    /// Creates a volume like [`create`](Self::create), with `fill` giving its prepared, empty
    /// place its first content (a restore, a clone) before the record promises it. The
    /// storage holds the place to the volume's size before `fill` (which gets the record, its
    /// project ID in it), so what it copies is charged to the volume. The size is reserved
    /// while `fill` runs, so other creates neither wait for a long copy nor take the bytes it
    /// needs; if `fill` fails, the place and what holds it go and nothing is recorded. A crash
    /// before the record leaves data that the next start sets aside (see
    /// [`Self::set_aside_unrecorded`]).
    pub fn create_with<E: From<VolumeError>>(
        &self,
        mut record: Record,
        fill: impl FnOnce(&Record) -> Result<(), E>,
    ) -> Result<Record, E> {
        let storage = self.storage_of(&record);
        let reservation = {
            let _deciding = self.ledger.deciding();
            (self.ledger).check_fits(&record, &self.catalog, storage)?;
            storage.prepare(&mut record)?;
            self.ledger.reserve(&record)
        };
        let filled = (storage.hold_new(&record))
            .map_err(E::from)
            .and_then(|()| fill(&record));
        if let Err(e) = filled {
            storage.abandon(&record);
            return Err(e);
        }
        storage.make_durable(&record)?;
        if let Err(e) = self.catalog.save(record.clone()) {
            storage.abandon(&record);
            return Err(VolumeError::from(e).into());
        }
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

    /// Holds a volume to its recorded size at once: after an expansion (a retry after a
    /// failed one finds the record already grown and only needs this), or once a copy's
    /// headroom ends.
    pub fn hold_to_size(&self, record: &Record) -> Result<(), VolumeError> {
        let storage = self.storage_of(record);
        storage.check_changeable(record)?;
        storage.apply_limits(record)
    }

    /// Grows a volume's size, if the growth fits: the record first, then the storage's
    /// limits.
    pub fn resize(&self, id: &str, capacity: u64) -> Result<Record, VolumeError> {
        let _deciding = self.ledger.deciding();
        let mut record = self.catalog.known(id)?;
        let storage = self.storage_of(&record);
        storage.check_changeable(&record)?;
        let growth = capacity.saturating_sub(record.capacity);
        let available = self.ledger.available(&self.catalog, storage)?;
        if growth > available {
            return Err(VolumeError::NoRoomToGrow { growth, available });
        }
        record.capacity = capacity;
        self.catalog.save(record.clone())?;
        log::info!("volume {id} now has {capacity} bytes");
        // After the record: a crash in between leaves the larger size to the next start.
        storage.apply_limits(&record)?;
        Ok(record)
    }

    /// Gives a volume new attributes: the record first, then its limits and its root
    /// directory's mode, which take effect at once. A crash in between leaves the record's
    /// limits to the next start, which puts every volume back under them; a retry applies
    /// them again.
    pub fn set_attributes(&self, id: &str, attributes: Attributes) -> Result<Record, VolumeError> {
        let mut record = self.catalog.known(id)?;
        if record.attributes != attributes {
            record.attributes = attributes;
            self.catalog.save(record.clone())?;
            log::info!("volume {id} now has attributes {:?}", attributes.to_map());
        }
        let storage = self.storage_of(&record);
        storage.apply_limits(&record)?;
        storage.apply_root_mode(&record)?;
        Ok(record)
    }

    /// Deletes a volume: marks its record deleted, removes its data, then the record;
    /// refused while anything is mounted on or from its data. A crash or a file that cannot
    /// be removed leaves a marked record (not listed, not found by name or ID), which the
    /// next DeleteVolume or start-up ([`Self::finish_deletes`]) finishes.
    pub fn delete(&self, id: &str, table: &MountTable) -> Result<(), VolumeError> {
        // Its data is being removed in the background, which ends the deletion.
        if crate::mutex::lock(&self.awaiting_removal).contains(id) {
            return Ok(());
        }
        self.delete_settling(id, table, false)
    }

    /// [`Self::delete`], told whether its data was just removed by someone else (the orphan
    /// removal), so what is still charged may be settling.
    fn delete_settling(
        &self,
        id: &str,
        table: &MountTable,
        removed_elsewhere: bool,
    ) -> Result<(), VolumeError> {
        let storage = self.storage_of_id(id);
        if let Some(at) = storage.user(id, table)? {
            return Err(VolumeError::InUse {
                id: id.to_owned(),
                at,
            });
        }
        if let Some(mut record) = self.catalog.get(id).filter(|r| !r.deleting) {
            record.deleting = true;
            self.catalog.save(record)?;
        }
        let removed = storage.remove_data(id)?;
        // What holds its size goes before the record that names it; a failure here leaves
        // the record, and the next DeleteVolume releases it. So does a project still charged
        // with files elsewhere, which keeps its ID, and so the record, until they are gone.
        if let Some(mut record) = self.catalog.get(id) {
            // Only data just removed may still be settling.
            let wait = match removed || removed_elsewhere {
                true => project_quotas::SETTLE,
                false => Duration::ZERO,
            };
            if let Released::Kept(_) = storage.release(&record, wait)? {
                if !record.leftover {
                    record.leftover = true;
                    self.catalog.save(record)?;
                }
                return Ok(());
            }
        }
        self.catalog.remove(id)?;
        log::info!("deleted volume {id}");
        Ok(())
    }

    /// Whether a deletion a crash interrupted is waiting for [`Self::finish_deletes`].
    pub fn has_marked_deletions(&self) -> bool {
        !self.catalog.marked_deleted().is_empty()
    }

    /// Finishes the deletions a crash or a file that could not be removed interrupted: run at
    /// start-up, before anything is served. What is left of the data, if nothing is mounted
    /// on or from it, is set aside for `orphans` to remove in the background (one rename).
    /// A volume with a project quota keeps its marked record until then, as those files
    /// still charge the project (its ID must not be reused), and
    /// [`Self::finish_delete_after_removal`] ends it; any other ends at once. One that still
    /// cannot finish is logged and left to the next DeleteVolume.
    pub fn finish_deletes(&self, table: &MountTable, orphans: &Orphans) {
        for id in self.catalog.marked_deleted() {
            let set_aside = self.storage_of_id(&id).set_aside(&id, table, orphans);
            let charged = (self.catalog.get(&id)).is_some_and(|r| r.project_id.is_some());
            if set_aside && charged {
                crate::mutex::lock(&self.awaiting_removal).insert(id);
                continue;
            }
            self.finish_delete(&id, table, false);
        }
    }

    /// Ends the marked deletion of `id` once the orphan removal took its data away: what
    /// holds its size is released (the removed files' charge given time to settle) and its
    /// record goes, unless files elsewhere still charge it. Until then a DeleteVolume of it
    /// answers at once, leaving the deletion to this; `claimed` says whether the caller
    /// holds the claim on `id` (without it, the deletion is left to the next DeleteVolume).
    pub fn finish_delete_after_removal(&self, id: &str, table: &MountTable, claimed: bool) {
        if claimed && self.catalog.get(id).is_some_and(|r| r.deleting) {
            self.finish_delete(id, table, true);
        }
    }

    /// Ends `id`'s background deletion once [`Self::finish_delete_after_removal`] has run and
    /// the caller let go of the claim: until then a DeleteVolume of it answers at once.
    pub fn end_background_deletion(&self, id: &str) {
        crate::mutex::lock(&self.awaiting_removal).remove(id);
    }

    /// Whether `id`'s deletion is being ended in the background (its data set aside at
    /// start-up): a DeleteVolume of it is answered at once, without waiting for its claim,
    /// which the background holds while the removed files' charge settles.
    pub fn deleting_in_background(&self, id: &str) -> bool {
        crate::mutex::lock(&self.awaiting_removal).contains(id)
    }

    fn finish_delete(&self, id: &str, table: &MountTable, removed_elsewhere: bool) {
        match self.delete_settling(id, table, removed_elsewhere) {
            Ok(()) if self.catalog.get(id).is_some() => {}
            Ok(()) => log::info!("finished deleting volume {id}"),
            Err(e) => log::error!("could not finish deleting volume {id}: {e}"),
        }
    }

    /// Sets aside for removal volume data that has no record file: creates (and restores,
    /// clones) that a crash interrupted before their record, which nobody was ever told
    /// about. Data whose record exists but cannot be read is kept. Run at start-up, before
    /// anything is served: one rename each, so no call can find them however large.
    pub fn set_aside_unrecorded(&self, orphans: &Orphans) -> Result<(), VolumeError> {
        let recorded = |id: &str| self.catalog.has_file(id);
        self.directories.set_aside_unrecorded(orphans, &recorded)
    }
}
