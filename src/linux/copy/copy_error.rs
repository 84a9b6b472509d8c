//! What can go wrong copying a tree or a file, each naming the operation and the path.

use std::ffi::OsString;
use std::io;
use std::path::PathBuf;

use nix::errno::Errno;

use crate::path_io::PathIoError;

#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// A syscall failed on a source or destination path. (A field, not a tuple: the storage
    /// tests read it as `CopyError::Io { source, .. }`.)
    #[error(transparent)]
    Io {
        #[from]
        source: PathIoError,
    },
    /// An extended attribute that must be kept could not be read or written.
    #[error("copy extended attribute {name:?} of {}: {source}", path.display())]
    Xattr {
        path: PathBuf,
        name: OsString,
        #[source]
        source: io::Error,
    },
    /// The destination (or its temporary name) is taken: a copy never replaces anything.
    #[error("destination {} already exists", .0.display())]
    DestinationExists(PathBuf),
    /// A copy into a directory needs it empty: it never mixes with what is there.
    #[error("destination {} is not empty", .0.display())]
    DestinationNotEmpty(PathBuf),
    #[error("source {} is not a directory", .0.display())]
    SourceNotADirectory(PathBuf),
    #[error("source {} is not a regular file", .0.display())]
    SourceNotARegularFile(PathBuf),
    /// The destination must name a new entry in an existing directory.
    #[error("destination {} has no parent directory and file name", .0.display())]
    BadDestination(PathBuf),
    /// Removal refused to descend into another mount.
    #[error("{} is a mount point; nothing under it is removed", .0.display())]
    MountPoint(PathBuf),
}

impl CopyError {
    /// Whether the destination ran out of room (`ENOSPC`, or a quota's `EDQUOT`): the caller's
    /// RESOURCE_EXHAUSTED, where other failures are internal.
    pub fn is_out_of_space(&self) -> bool {
        let errno = match self {
            CopyError::Io { source } => source.raw_os_error(),
            CopyError::Xattr { source, .. } => source.raw_os_error(),
            _ => return false,
        };
        matches!(
            errno,
            Some(code) if code == Errno::ENOSPC as i32 || code == Errno::EDQUOT as i32
        )
    }
}
