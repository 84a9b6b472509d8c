//! What the Node service's operations can fail with, in the domain's words; `grpc::node`'s
//! table gives each its gRPC code, next to the calls, so the code of every failure can be
//! checked against the CSI spec in one place.

use std::path::PathBuf;

use super::bind_mounts::BindError;
use crate::csi_spec::Field;
use crate::linux::loopdev::LoopError;
use crate::linux::mount::MountError;
use crate::node_server::state::volumes::VolumeError;
use crate::quantity::QuantityError;
use crate::runtime::WorkerError;

/// A failed Node service operation.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Volume(#[from] VolumeError),
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error(
        "{field} {} overlaps the state directory {}",
        path.display(),
        state_dir.display()
    )]
    OverlapsState {
        field: Field,
        path: PathBuf,
        state_dir: PathBuf,
    },
    /// A target that resolves to (or into) the staging path, or the other way round.
    #[error(
        "{} {} and {} {} are the same or one is inside the other",
        Field::TargetPath,
        target.display(),
        Field::StagingTargetPath,
        staging.display()
    )]
    TargetNestedWithStaging { target: PathBuf, staging: PathBuf },
    /// A staging path given to a call that takes a target, or the other way round.
    #[error(
        "{field} {} is the {is} of volume {id}: that path belongs to the other call",
        path.display()
    )]
    OtherCallsPath {
        field: Field,
        path: PathBuf,
        is: Field,
        id: String,
    },
    /// A mount point inside a mount of one of our volumes: it would be made in that
    /// volume's data.
    #[error(
        "{field} {} lies inside {}, a mount of a volume of this driver",
        path.display(),
        mount.display()
    )]
    InsideVolume {
        field: Field,
        path: PathBuf,
        mount: PathBuf,
    },
    /// SINGLE_NODE_SINGLE_WRITER, staged at a second path: the spec's "exceeds capabilities".
    #[error("SINGLE_NODE_SINGLE_WRITER volume is already staged at {}", at.display())]
    StagedElsewhere { at: PathBuf },
    #[error("the parent directory of {field} does not exist")]
    MissingParent { field: Field },
    /// A stats or expand path that is not there: the volume is not there, as the spec words it.
    #[error("{field} {value:?} does not exist")]
    PathNotFound { field: Field, value: String },
    #[error("volume {id} does not exist, and {field} {} is mounted", path.display())]
    UnknownButMounted {
        id: String,
        field: Field,
        path: PathBuf,
    },
    #[error("volume {id} exists and is not an ephemeral volume")]
    NotEphemeral { id: String },
    #[error(transparent)]
    EphemeralSize(QuantityError),
    /// An inline volume's `layout` attribute is neither `directory` nor `image`.
    #[error(transparent)]
    EphemeralLayout(crate::node_server::state::attributes::ParameterError),
    #[error("statistics of {}: {source}", dir.display())]
    Stats {
        dir: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// A block capability for a filesystem volume, or the other way round.
    #[error("volume {id} is a {is} volume; it cannot be used with {asked} access")]
    AccessType {
        id: String,
        is: &'static str,
        asked: &'static str,
    },
    #[error(transparent)]
    Loop(#[from] LoopError),
    /// An image volume's filesystem that could not be readied or read.
    #[error("{op} the filesystem of volume {id}: {source}")]
    Filesystem {
        id: String,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// An SELinux `context=` mount flag for a volume bind-mounted from the state directory.
    #[error(
        "volume {id} is a directory on the state directory's filesystem, bind-mounted, and a \
         bind mount shows its filesystem's SELinux label: it cannot be mounted with \
         context={label:?}; volumes of `layout: image` (a filesystem of their own) can, or \
         give this driver's CSIDriver `seLinuxMount: false`"
    )]
    ContextOnABind { id: String, label: String },
    /// Growing an image volume's filesystem needs CAP_SYS_RESOURCE (`EXT4_IOC_RESIZE_FS`).
    #[error(
        "the filesystem of volume {id} must grow from {from} to {to} bytes, and the kernel \
         lets only a process with CAP_SYS_RESOURCE grow it (EXT4_IOC_RESIZE_FS): give \
         node-server's container that capability"
    )]
    NoResizeCapability { id: String, from: u64, to: u64 },
    #[error(transparent)]
    IoLimits(#[from] super::IoLimitError),
    /// NodeExpandVolume growing a volume itself (the node-only path): what
    /// ControllerExpandVolume would have failed with, with that call's codes.
    #[error(transparent)]
    Grow(#[from] super::ControllerError),
}
