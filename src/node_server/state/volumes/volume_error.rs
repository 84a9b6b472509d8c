//! What can go wrong with the volumes themselves, in the domain's words: each variant names
//! the volume, the sizes or the path involved. The services' code tables give each its gRPC
//! code.

use std::path::PathBuf;

use super::claims::Busy;
use super::project_quotas::LimitKept;
use crate::linux::mountinfo::Unlocatable;
use crate::linux::quota::QuotaError;
use crate::path_io::PathIoError;

/// What can go wrong with the volumes themselves; each variant names the volume, the sizes or
/// the path involved.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// Another operation holds the volume's (or the name's) claim.
    #[error(transparent)]
    Busy(#[from] Busy),
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
    /// Its filesystem could not be held still for a copy (frozen by someone else: EBUSY).
    #[error("{op} the filesystem of volume {id} for a copy: {source}")]
    Freeze {
        id: String,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
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
    /// A directory volume asked for where `--quota=auto` found that sizes cannot hold.
    #[error("volume {id} is not made: {why}")]
    SizeWouldNotHold { id: String, why: String },
}
