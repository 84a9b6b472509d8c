//! Quota errors: each names the operation, the path it was done on and, for quotactl, the
//! project; the kernel's errno is the source. `Display` repeats the source's text because the
//! callers (log lines, gRPC status messages) print one line, not a chain.

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::path_io::PathIoError;

/// A quotactl command, named as the kernel documents it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaOp {
    /// Q_XGETQSTATV: which quota types are accounted and enforced.
    GetState,
    /// Q_GETFMT: the quota format in use for projects (ext4).
    GetFormat,
    /// Q_XGETQUOTA / Q_GETQUOTA.
    GetQuota,
    /// Q_XSETQLIM / Q_SETQUOTA.
    SetLimits,
    /// Q_XGETNEXTQUOTA / Q_GETNEXTQUOTA.
    NextQuota,
}

impl fmt::Display for QuotaOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::GetState => "read quota state (Q_XGETQSTATV)",
            Self::GetFormat => "read project quota format (Q_GETFMT)",
            Self::GetQuota => "read project quota",
            Self::SetLimits => "set project quota limits",
            Self::NextQuota => "find next project with a quota record",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    /// Opening, inspecting or syncing the filesystem or a directory, reading or changing a
    /// directory's project ID (`set project ID of /v/volumes/a: …`), reading the projects file.
    #[error(transparent)]
    Io(#[from] PathIoError),
    #[error("{op} for project {id} on {}: {source}", path.display())]
    Quotactl {
        op: QuotaOp,
        id: u32,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// quotactl_fd is missing (Linux before 5.14) and no device node matches the filesystem.
    #[error(
        "the kernel has no quotactl_fd (Linux 5.14+) and no block device node for {} \
         (device {major}:{minor}) was found in the mount table or /dev/block",
        path.display()
    )]
    NoDevice {
        path: PathBuf,
        major: u32,
        minor: u32,
    },
    #[error("{} is not on XFS or ext4 (filesystem magic {magic:#x})", path.display())]
    NotSupported { path: PathBuf, magic: u64 },
    #[error("{} is on another filesystem than {}", path.display(), root.display())]
    OtherFilesystem { path: PathBuf, root: PathBuf },
    #[error("no free project ID left in {start}..={end} on {}", path.display())]
    Exhausted { start: u32, end: u32, path: PathBuf },
    /// The kernel's random numbers, for a project ID no pod can guess, were not to be had.
    #[error("draw a random project ID: {0}")]
    Random(String),
}

impl QuotaError {
    /// The kernel's errno, when a syscall failed.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Io(error) => error.raw_os_error(),
            Self::Quotactl { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    #[test]
    fn a_quotactl_error_names_the_operation_the_project_and_the_path_and_keeps_its_source() {
        let e = QuotaError::Quotactl {
            op: QuotaOp::SetLimits,
            id: 1_073_741_824,
            path: "/var/lib/csi-nodekit".into(),
            source: io::Error::from_raw_os_error(libc::EPERM),
        };
        let text = e.to_string();
        assert!(text.starts_with(
            "set project quota limits for project 1073741824 on /var/lib/csi-nodekit: "
        ));
        assert_eq!(e.errno(), Some(libc::EPERM));
        let source = e.source().expect("source");
        assert_eq!(
            source
                .downcast_ref::<io::Error>()
                .and_then(io::Error::raw_os_error),
            Some(libc::EPERM)
        );
    }

    #[test]
    fn an_attribute_error_names_the_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let gone = dir.path().join("a");
        let e = super::super::project::set_project(&gone, 7).expect_err("no such directory");
        let named = format!("set project ID of {}: ", gone.display());
        assert!(e.to_string().starts_with(&named), "{e}");
        assert_eq!(e.errno(), Some(libc::ENOENT));
        assert!(e.source().is_some());
    }
}
