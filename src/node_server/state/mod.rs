//! What node-server keeps: the records of its volumes and snapshots under `--state-dir`, written
//! atomically, and what lives beside them in memory (per-volume locks, copy sources in use).
//!
//! - [`layout`] — the state directory as one value: every name under `--state-dir`.
//! - [`orphans`] — what interrupted operations left, set aside at start-up under names no
//!   ID can have and removed in the background.
//! - [`owner`] — the exclusive lock that makes one node-server the directory's only user.
//! - [`store`] — one JSON record per volume, snapshot or group, written atomically.
//! - [`volumes`] — the volumes this node owns: records, data directories, capacity accounting,
//!   per-volume try-locks, the one create path.
//! - [`snapshots`] — snapshot and group records, their data, start-up recovery, and cutting
//!   them with the copy engine.
//! - [`sources`] — volumes and snapshots being copied from, which may not be deleted meanwhile.
//! - [`capacity`] — choosing a volume's size from a CSI range; how much is left to provision.
//! - [`attributes`] — the mutable parameters a VolumeAttributesClass may set.
//! - [`escapes`] — escapes from volumes' project quotas: each volume's episode (said once,
//!   shown in its condition, counted) and the background walk's pace.
//! - [`volume_quota`] — what volumes get from project quotas: a project and a limit each,
//!   released at deletion, their own usage for stats.

pub mod attributes;
pub mod capacity;
pub mod escapes;
pub mod layout;
pub mod orphans;
pub mod owner;
pub mod snapshots;
pub(crate) mod sources;
pub(crate) mod store;
pub mod volume_quota;
pub mod volumes;

#[cfg(test)]
mod format_tests;
