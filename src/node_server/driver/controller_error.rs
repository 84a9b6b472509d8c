//! What the Controller service's volume operations can fail with, in the domain's words;
//! `grpc::controller`'s table gives each its gRPC code. (Snapshots fail with
//! `state::snapshots::SnapshotError`.)

use crate::linux::copy::CopyError;
use crate::linux::loopdev::LoopError;
use crate::linux::mount::MountError;
use crate::node_server::state::attributes::ParameterError;
use crate::node_server::state::sources::SourceBusy;
use crate::node_server::state::volumes::VolumeError;
use crate::runtime::WorkerError;

/// "block" or "mount", for messages.
pub fn access_name(block: bool) -> &'static str {
    if block { "block" } else { "mount" }
}

/// A failed Controller service operation.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error(transparent)]
    Volume(#[from] VolumeError),
    #[error("volume {name:?} exists with {capacity} bytes, outside the range asked for")]
    NameTaken { name: String, capacity: u64 },
    #[error("volume {id} has {capacity} bytes and cannot shrink to {limit}")]
    WouldShrink {
        id: String,
        capacity: u64,
        limit: u64,
    },
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// New IO limits recorded, and not written to a pod the volume is published to.
    #[error(transparent)]
    IoLimits(#[from] super::IoLimitError),
    /// A restore from a snapshot, or a clone of a volume, that is not there.
    #[error("{kind} {id} does not exist")]
    SourceNotFound { kind: &'static str, id: String },
    #[error("the source holds {size} bytes; limit_bytes {limit} is smaller")]
    SourceTooLarge { size: u64, limit: u64 },
    /// A source that really holds more than the volume asked for may: its size, or its
    /// `inodeLimit` (0: none).
    #[error(
        "the content source holds {bytes} bytes in {inodes} inodes; a volume of {capacity} bytes{} cannot hold it",
        if *inode_limit > 0 { format!(" and {inode_limit} inodes") } else { String::new() }
    )]
    SourceHolds {
        bytes: u64,
        inodes: u64,
        capacity: u64,
        inode_limit: u64,
    },
    /// A copy that ended above the volume's size (its source grew while it was copied).
    #[error("the copy of the content source holds {held} bytes, more than the volume's {capacity}")]
    CopyTooLarge { held: u64, capacity: u64 },
    /// The copy could not be made without the quota override.
    #[error(transparent)]
    Privilege(#[from] crate::linux::privilege::PrivilegeError),
    #[error("volume {name:?} exists with another content source")]
    OtherSource { name: String },
    #[error(transparent)]
    SourceBusy(#[from] SourceBusy),
    #[error("copy the content source: {0}")]
    Copy(#[from] CopyError),
    /// A mutable parameter that is not ours or not well-formed.
    #[error(transparent)]
    Parameter(#[from] ParameterError),
    /// A parameter this volume (or this node) cannot apply: the spec's "exceeds capabilities".
    #[error("{key} cannot be applied to {what}: {why}")]
    CannotApply {
        key: &'static str,
        what: String,
        why: String,
    },
    #[error("volume {name:?} exists with {is} access")]
    OtherAccessType { name: String, is: &'static str },
    /// A restore or clone whose source is of the other layout.
    #[error(
        "the content source is a volume's of layout {is}; it cannot fill a volume of layout \
         {asked} (give the StorageClass parameter layout={is})"
    )]
    SourceLayout {
        is: &'static str,
        asked: &'static str,
    },
    /// A restore or clone whose source is of the other access type.
    #[error("the content source is a {is} volume's; it cannot fill a {asked} volume")]
    SourceAccessType {
        is: &'static str,
        asked: &'static str,
    },
    #[error(
        "{size} bytes, rounded up to whole 512-byte sectors for a block volume, exceeds limit_bytes {limit}"
    )]
    BlockSize { size: u64, limit: u64 },
    /// An image volume's size: whole 4 KiB blocks of its filesystem, at least its template's.
    #[error(
        "{size} bytes, rounded up to whole 4096-byte blocks and to at least {least} bytes (the \
         smallest filesystem of an image volume), exceeds limit_bytes {limit}"
    )]
    ImageSize { size: u64, least: u64, limit: u64 },
    #[error("volume {name:?} exists with layout {is}")]
    OtherLayout { name: String, is: &'static str },
    #[error(transparent)]
    Loop(#[from] LoopError),
    #[error("volume {name:?} exists with other mutable parameters ({existing:?})")]
    OtherAttributes {
        name: String,
        existing: std::collections::HashMap<String, String>,
    },
}
