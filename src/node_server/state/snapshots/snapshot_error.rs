//! What a snapshot or group snapshot operation can fail with, in the domain's words; the
//! Controller's and GroupController's handlers give each its gRPC code
//! (`grpc::controller_snapshots::status`).

use std::path::PathBuf;

use crate::linux::copy::CopyError;
use crate::linux::loopdev::LoopError;
use crate::node_server::state::sources::SourceBusy;
use crate::node_server::state::volumes::VolumeError;
use crate::path_io::PathIoError;
use crate::runtime::WorkerError;

/// A failed snapshot or group snapshot operation.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(transparent)]
    Volume(#[from] VolumeError),
    #[error("snapshot {id} does not exist")]
    NotFound { id: String },
    #[error("snapshot {name:?} exists for another source volume, {source_volume}")]
    NameTaken { name: String, source_volume: String },
    #[error(
        "snapshot {id} belongs to group snapshot {group}: delete it with \
         DeleteVolumeGroupSnapshot"
    )]
    InGroup { id: String, group: String },
    #[error("group snapshot {id} does not exist")]
    GroupNotFound { id: String },
    #[error("group snapshot {name:?} exists for other source volumes")]
    GroupNameTaken { name: String },
    #[error("snapshot_ids do not match the members of group snapshot {id}")]
    MembersDiffer { id: String },
    #[error("snapshot_ids is required (the members of group snapshot {id})")]
    SnapshotIdsRequired { id: String },
    #[error(transparent)]
    SourceBusy(#[from] SourceBusy),
    #[error("snapshot of {} failed: {source}", from.display())]
    Copy {
        from: PathBuf,
        #[source]
        source: CopyError,
    },
    #[error("remove snapshot data: {0}")]
    Remove(CopyError),
    #[error("flush the block volume's device before the copy: {0}")]
    Flush(#[from] LoopError),
    #[error(transparent)]
    Io(#[from] PathIoError),
    #[error(transparent)]
    Worker(#[from] WorkerError),
}
