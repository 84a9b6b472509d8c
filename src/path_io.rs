//! An I/O error on a path, naming what was attempted: the one shape every room gives a failed
//! syscall on a file or directory ("remove /var/lib/x: Permission denied"), so that the error
//! types which need it hold it instead of each spelling it again.

use std::io;
use std::path::{Path, PathBuf};

/// A failed operation on a path: `{op} {path}: {source}`.
#[derive(Debug, thiserror::Error)]
#[error("{op} {}: {source}", path.display())]
pub struct PathIoError {
    /// What was attempted, as a verb phrase: "remove", "set the mode of".
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

impl PathIoError {
    pub fn new(op: &'static str, path: &Path, source: io::Error) -> Self {
        Self {
            op,
            path: path.to_owned(),
            source,
        }
    }

    /// `map_err(PathIoError::at("remove", path))`: the error of `op` on `path`.
    pub fn at<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Self + 'a {
        move |source| Self::new(op, path, source)
    }

    /// [`PathIoError::at`] for a `nix` result.
    pub fn errno_at<'a>(
        op: &'static str,
        path: &'a Path,
    ) -> impl FnOnce(nix::errno::Errno) -> Self + 'a {
        move |errno| Self::new(op, path, errno.into())
    }

    /// The kind of the underlying I/O error.
    pub fn kind(&self) -> io::ErrorKind {
        self.source.kind()
    }

    /// The kernel's errno, when a syscall failed.
    pub fn raw_os_error(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_operation_the_path_and_the_cause() {
        let error = PathIoError::at("remove", Path::new("/x/y"))(io::Error::from_raw_os_error(
            nix::libc::EACCES,
        ));
        assert_eq!(
            error.to_string(),
            "remove /x/y: Permission denied (os error 13)"
        );
        assert_eq!(error.kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(error.raw_os_error(), Some(nix::libc::EACCES));
    }

    #[test]
    fn a_nix_errno_becomes_the_same_error_as_its_io_error() {
        let from_errno = PathIoError::errno_at("stat", Path::new("/x"))(nix::errno::Errno::ENOENT);
        assert_eq!(
            from_errno.to_string(),
            "stat /x: No such file or directory (os error 2)"
        );
    }
}
