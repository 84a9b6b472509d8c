//! The storage behind a volume, as the lifecycle ([`super::lifecycle`]) and the driver's
//! operations see it: where a new volume's data goes and what holds it to its size, how its
//! data goes at deletion, and what it can tell of its usage. Capacity, claims and records do
//! not depend on how this is done.
//!
//! One layout implements it today: a directory on the state directory's filesystem, held by a
//! project quota ([`QuotaDirectories`](super::quota_directories::QuotaDirectories)). A volume
//! with a filesystem of its own is a second implementation, chosen per volume by its record.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use super::project_quotas::{Hold, Released, Usage};
use super::volume_error::VolumeError;
use super::volume_record::Record;
use crate::linux::mountinfo::MountTable;
use crate::node_server::state::orphans::Orphans;

/// How one layout keeps volumes. Every method blocks (syscalls, fsync).
pub trait VolumeStorage: fmt::Debug + Send + Sync {
    /// Makes a new volume's place, empty, and notes in `record` what holds it (its project
    /// ID); refuses when nothing can hold it (no project ID left). Nothing is durable yet.
    fn prepare(&self, record: &mut Record) -> Result<(), VolumeError>;

    /// Holds a prepared volume to `record`'s size before anything is written into it, so a
    /// restore's or clone's copy is held like a pod's writes.
    fn hold_new(&self, record: &Record) -> Result<(), VolumeError>;

    /// Undoes [`Self::prepare`] and whatever a failed fill left: best effort, logged, as the
    /// failure's own error is the one to report.
    fn abandon(&self, record: &Record);

    /// Makes what [`Self::prepare`] and the fill made durable, before the record that
    /// promises it.
    fn make_durable(&self, record: &Record) -> Result<(), VolumeError>;

    /// Where something is mounted on or from the volume's data, if anywhere: deleting it
    /// then would pull data from under a mount.
    fn user(&self, id: &str, table: &MountTable) -> Result<Option<PathBuf>, VolumeError>;

    /// Removes a deleted volume's data durably, never following a link nor crossing a mount;
    /// whether there was any.
    fn remove_data(&self, id: &str) -> Result<bool, VolumeError>;

    /// Gives up what held a deleted volume to its size, once nothing is charged to it any
    /// more (after up to `wait` for just-removed data to settle).
    fn release(&self, record: &Record, wait: Duration) -> Result<Released, VolumeError>;

    /// Sets what is left of a deleted volume's data aside for `orphans` to remove in the
    /// background (one rename), unless something is mounted on or from it; whether it did.
    fn set_aside(&self, id: &str, table: &MountTable, orphans: &Orphans) -> bool;

    /// At start-up: sets aside volume data that `recorded` says has no record (a create a
    /// crash interrupted before its record, which nobody was ever told about).
    fn set_aside_unrecorded(
        &self,
        orphans: &Orphans,
        recorded: &dyn Fn(&str) -> bool,
    ) -> Result<(), VolumeError>;

    /// How the volume's size holds: its own usage and limit, or why it is not enforced.
    fn hold(&self, record: &Record) -> Result<Hold, VolumeError>;

    /// The volume's own usage, where it is read (`None`: only accounted).
    fn usage(&self, record: &Record) -> Option<Usage> {
        match self.hold(record) {
            Ok(Hold::Enforced { usage, .. }) => Some(usage),
            _ => None,
        }
    }

    /// Refuses a change of the volume's size or limits that could not be put in force.
    fn check_changeable(&self, record: &Record) -> Result<(), VolumeError>;

    /// Puts the record's size and limits in force at once.
    fn apply_limits(&self, record: &Record) -> Result<(), VolumeError>;

    /// While a copy fills the new volume: its byte limit raised by `headroom`;
    /// [`Self::apply_limits`] ends it.
    fn allow_copy(&self, record: &Record, headroom: u64) -> Result<(), VolumeError>;

    /// Sets the root directory's mode to the volume's `rootMode`, if it has one.
    fn apply_root_mode(&self, record: &Record) -> Result<(), VolumeError>;

    /// Gives the volume's root to `gid` (the CSI `volume_mount_group`), group-writable and
    /// setgid so files created in it inherit the group, as Kubernetes does for `fsGroup`.
    fn set_group(&self, record: &Record, gid: u32) -> Result<(), VolumeError>;

    /// At start-up: puts every recorded volume back under its limits, which also finishes a
    /// creation or an expansion a crash interrupted.
    fn adopt(&self, records: &[Record]);
}
