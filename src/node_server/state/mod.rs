//! What node-server keeps: the records of its volumes and snapshots under `--state-dir`, written
//! atomically, and what lives beside them in memory (claims, capacity, copy sources in use).
//!
//! - [`state_dir`] — the state directory as one value: every name under `--state-dir`.
//! - [`loose_files`] — files an older version left readable by others, made 0600 at start.
//! - [`owner`] — the exclusive lock that makes one node-server the directory's only user.
//! - [`store`] — one JSON record per volume, snapshot or group, written atomically.
//! - [`reserve`] — room kept on the state filesystem so records (a DeleteVolume's mark) can
//!   still be written once it is full.
//! - [`volumes`] — the volumes this node owns: their records, claims, capacity, the storage
//!   behind them (a directory held by a project quota) and their lifecycle.
//! - [`snapshots`] — snapshot and group records, their data, start-up recovery, and cutting
//!   them with the copy engine.
//! - [`sources`] — volumes and snapshots being copied from, which may not be deleted meanwhile.
//! - [`orphans`] — what interrupted operations left, set aside at start-up under names no
//!   ID can have and removed in the background.
//! - [`capacity`] — the rules: a volume's size from a CSI range, inode limits, what is free.
//! - [`attributes`] — the mutable parameters a VolumeAttributesClass may set.
//! - [`escapes`] — escapes from volumes' project quotas: each volume's episode (said once,
//!   shown in its condition, counted) and the background walk's pace.

pub mod attributes;
pub mod capacity;
pub mod escapes;
pub mod loose_files;
pub mod orphans;
pub mod owner;
pub mod reserve;
pub mod snapshots;
pub(crate) mod sources;
pub mod state_dir;
pub(crate) mod store;
pub mod volumes;

#[cfg(test)]
mod format_tests;
