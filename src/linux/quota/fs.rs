//! One filesystem's project quotas: how quotactl reaches it, and whether it accounts and
//! enforces project quotas at all.
//!
//! quotactl wants the filesystem's block device, which inside a container often has no node
//! in `/dev`. `quotactl_fd(2)` (Linux 5.14+) takes a descriptor on the filesystem instead, so
//! it is used whenever the kernel has it; older kernels (ext4 project quotas need 4.5, their
//! iteration 4.6) fall back to the device node named in the mount table, then to
//! `/dev/block/MAJ:MIN`.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::quota_error::{QuotaError, QuotaOp};
use super::sys;
use crate::path_io::PathIoError;

/// The filesystems whose project quotas this layer drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsKind {
    /// The XFS quota interface (`Q_X*`, 512-byte basic blocks).
    Xfs,
    /// The generic VFS interface on `PRJQUOTA` (`if_dqblk`, 1 KiB limit units).
    Ext4,
}

/// How quotactl reaches the filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `quotactl_fd` on a directory of the filesystem.
    Fd,
    /// `quotactl` on the block device node.
    Device,
}

/// What a filesystem offers for project quotas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    /// Project usage is accounted and hard limits are enforced.
    Enforcing,
    /// Usage is accounted (stats work) but limits are not enforced.
    AccountingOnly { why: String },
    /// No project quotas here.
    Unsupported { why: String },
}

/// A directory on a filesystem (normally the state directory), held open so quotactl and the
/// same-filesystem checks always mean this filesystem.
#[derive(Debug)]
pub struct QuotaFs {
    root: File,
    path: PathBuf,
    dev: u64,
    magic: u64,
    kind: Option<FsKind>,
    /// `Some`: quotactl through this device node; `None`: quotactl_fd on `root`.
    device: Option<CString>,
}

impl QuotaFs {
    /// Opens `path`, using quotactl_fd when the kernel has it.
    pub fn open(path: &Path) -> Result<Self, QuotaError> {
        Self::open_with(path, !quotactl_fd_available())
    }

    /// Opens `path` reaching quotactl through the block device even when quotactl_fd exists
    /// (how kernels before 5.14 are served; tests use it to check that path too).
    pub fn open_via_device(path: &Path) -> Result<Self, QuotaError> {
        Self::open_with(path, true)
    }

    fn open_with(path: &Path, via_device: bool) -> Result<Self, QuotaError> {
        let root = open_dir(path).map_err(PathIoError::at("open", path))?;
        let statfs =
            nix::sys::statfs::fstatfs(&root).map_err(PathIoError::errno_at("statfs", path))?;
        let fs_type = statfs.filesystem_type();
        let magic = fs_type.0 as u64;
        let kind = match fs_type {
            nix::sys::statfs::XFS_SUPER_MAGIC => Some(FsKind::Xfs),
            // ext2 and ext3 share the magic; only ext4 has project quotas, and the probe
            // (Q_GETFMT on PRJQUOTA) tells the difference.
            nix::sys::statfs::EXT4_SUPER_MAGIC => Some(FsKind::Ext4),
            _ => None,
        };
        let dev = root
            .metadata()
            .map_err(PathIoError::at("statfs", path))?
            .dev();
        let device = match (via_device, kind) {
            (true, Some(_)) => Some(find_device(path, dev)?),
            _ => None,
        };
        Ok(Self {
            root,
            path: path.to_owned(),
            dev,
            magic,
            kind,
            device,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory held open on the filesystem.
    pub(super) fn root(&self) -> &File {
        &self.root
    }

    pub fn kind(&self) -> Option<FsKind> {
        self.kind
    }

    pub fn access(&self) -> Access {
        if self.device.is_some() {
            Access::Device
        } else {
            Access::Fd
        }
    }

    /// The filesystem's kind, or the error every quota operation on another one returns.
    pub(super) fn require_kind(&self) -> Result<FsKind, QuotaError> {
        self.kind.ok_or_else(|| QuotaError::NotSupported {
            path: self.path.clone(),
            magic: self.magic,
        })
    }

    /// Refuses a directory on another filesystem than this one (a mount in between would
    /// put a volume's files out of this quota's reach).
    pub(super) fn require_same_fs(
        &self,
        dir: &Path,
        meta: &std::fs::Metadata,
    ) -> Result<(), QuotaError> {
        if meta.dev() == self.dev {
            Ok(())
        } else {
            Err(QuotaError::OtherFilesystem {
                path: dir.to_owned(),
                root: self.path.clone(),
            })
        }
    }

    /// One quotactl on this filesystem; `data` is the command's structure.
    pub(super) fn quotactl<T>(
        &self,
        op: QuotaOp,
        cmd: i32,
        id: u32,
        data: &mut T,
    ) -> Result<(), QuotaError> {
        let target = match &self.device {
            Some(device) => sys::Target::Device(device),
            None => sys::Target::Fd(self.root.as_fd()),
        };
        // SAFETY: every caller passes the structure its command reads or writes.
        unsafe { sys::quotactl(target, cmd, id, (data as *mut T).cast()) }.map_err(|source| {
            QuotaError::Quotactl {
                op,
                id,
                path: self.path.clone(),
                source,
            }
        })
    }

    /// Whether project quotas are accounted and enforced here, with the reason when not.
    pub fn support(&self) -> Result<Support, QuotaError> {
        let Some(kind) = self.kind else {
            return Ok(Support::Unsupported {
                why: format!(
                    "{} is not on XFS or ext4 (filesystem magic {:#x})",
                    self.path.display(),
                    self.magic
                ),
            });
        };
        let unsupported = |why: &str| Support::Unsupported {
            why: format!("{}: {why}", self.path.display()),
        };
        if kind == FsKind::Ext4 {
            let mut format = 0u32;
            let cmd = sys::qcmd(sys::Q_GETFMT, sys::PRJQUOTA);
            match self.quotactl(QuotaOp::GetFormat, cmd, 0, &mut format) {
                Ok(()) => {}
                Err(e) if matches!(e.errno(), Some(libc::ESRCH)) => {
                    return Ok(unsupported(
                        "ext4 project quotas are off (the filesystem needs the quota and \
                         project features: mkfs.ext4 -O quota,project or tune2fs -O \
                         quota,project, and the prjquota mount option)",
                    ));
                }
                Err(e) if matches!(e.errno(), Some(libc::ENOSYS)) => {
                    return Ok(unsupported("the kernel has no quota support for ext4"));
                }
                Err(e) => return Err(e),
            }
        }
        let mut statv = sys::FsQuotaStatv {
            version: sys::FS_QSTATV_VERSION1,
            ..Default::default()
        };
        let cmd = sys::qcmd(sys::Q_XGETQSTATV, sys::PRJQUOTA);
        let mount_option = match kind {
            FsKind::Xfs => "XFS: mount with -o prjquota",
            FsKind::Ext4 => "ext4: mount with -o prjquota",
        };
        match self.quotactl(QuotaOp::GetState, cmd, 0, &mut statv) {
            Ok(()) => {}
            // XFS runs no quota code at all on a filesystem mounted without quota options.
            Err(e) if matches!(e.errno(), Some(libc::ENOSYS)) => {
                return Ok(unsupported(&format!(
                    "no quotas are running on this filesystem ({mount_option}; the kernel \
                     needs quota support for it)"
                )));
            }
            Err(e) => return Err(e),
        }
        Ok(if statv.flags & sys::FS_QUOTA_PDQ_ACCT == 0 {
            unsupported(&format!("project quota accounting is off ({mount_option})"))
        } else if statv.flags & sys::FS_QUOTA_PDQ_ENFD == 0 {
            Support::AccountingOnly {
                why: format!(
                    "{}: project quotas are accounted but not enforced ({mount_option})",
                    self.path.display()
                ),
            }
        } else {
            Support::Enforcing
        })
    }
}

/// Opens a directory for ioctls and quotactl_fd (an `O_PATH` descriptor serves neither),
/// refusing a symlink in its place.
pub(super) fn open_dir(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Whether the kernel has quotactl_fd: with a bad descriptor it answers EBADF, while a
/// kernel without it (or a seccomp filter refusing it) answers ENOSYS or EPERM.
pub fn quotactl_fd_available() -> bool {
    // SAFETY: a null data pointer with fd -1: the kernel fails before reading anything.
    let rc = unsafe { libc::syscall(libc::SYS_quotactl_fd, -1, 0, 0, std::ptr::null_mut::<u8>()) };
    rc < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EBADF)
}

/// The block device node of the filesystem with device number `dev`: the mount table's
/// source, else `/dev/block/MAJ:MIN`, whichever is a block device with that number.
fn find_device(path: &Path, dev: u64) -> Result<CString, QuotaError> {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let mountinfo = std::fs::read("/proc/self/mountinfo").unwrap_or_default();
    let mut candidates = mount_sources(&mountinfo, (major, minor));
    candidates.push(PathBuf::from(format!("/dev/block/{major}:{minor}")));
    candidates
        .iter()
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|m| m.file_type().is_block_device() && m.rdev() == dev)
        })
        .and_then(|found| sys::device_cstring(found).ok())
        .ok_or(QuotaError::NoDevice {
            path: path.to_owned(),
            major,
            minor,
        })
}

/// The mount sources (`/dev/…`) that mountinfo lists for device `major:minor`.
fn mount_sources(mountinfo: &[u8], (major, minor): (u32, u32)) -> Vec<PathBuf> {
    let wanted = format!("{major}:{minor}");
    let text = String::from_utf8_lossy(mountinfo);
    text.lines()
        .filter(|line| line.split(' ').nth(2) == Some(wanted.as_str()))
        .filter_map(|line| {
            // After the optional fields: " - fstype source super-options".
            let (_, tail) = line.split_once(" - ")?;
            let source = tail.split(' ').nth(1)?;
            source
                .starts_with('/')
                .then(|| PathBuf::from(unescape(source)))
        })
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &[u8] = b"\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 7:0 / /var/lib/csi\\040nodekit rw shared:9 - xfs /dev/loop0 rw,prjquota
31 22 7:0 /volumes /mnt/bind rw - xfs /dev/loop0 rw,prjquota
40 22 0:5 / /dev rw - devtmpfs udev rw
41 22 7:1 / /net rw - nfs server:/export rw
";

    #[test]
    fn mount_sources_are_the_device_paths_listed_for_that_device_number() {
        assert_eq!(
            mount_sources(MOUNTINFO, (7, 0)),
            vec![PathBuf::from("/dev/loop0"), PathBuf::from("/dev/loop0")]
        );
        assert_eq!(
            mount_sources(MOUNTINFO, (254, 0)),
            vec![PathBuf::from("/dev/vda")]
        );
    }

    #[test]
    fn a_source_that_is_not_a_path_is_no_device() {
        assert!(mount_sources(MOUNTINFO, (7, 1)).is_empty());
        assert!(mount_sources(MOUNTINFO, (0, 5)).is_empty());
    }

    #[test]
    fn octal_escapes_in_mountinfo_are_undone() {
        assert_eq!(unescape("/var/lib/csi\\040nodekit"), "/var/lib/csi nodekit");
        assert_eq!(unescape("/a\\\\b\\1"), "/a\\\\b\\1");
    }

    #[test]
    fn a_directory_on_a_filesystem_without_quotas_is_reported_unsupported_not_an_error() {
        // /proc is neither XFS nor ext4 on any machine.
        let fs = QuotaFs::open(Path::new("/proc")).expect("open /proc");
        assert_eq!(fs.kind(), None);
        match fs.support().expect("support") {
            Support::Unsupported { why } => assert!(why.contains("not on XFS or ext4"), "{why}"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn opening_a_symlink_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path(), &link).expect("symlink");
        let err = QuotaFs::open(&link).expect_err("a symlink must be refused");
        assert!(matches!(&err, QuotaError::Io(e) if e.op == "open"), "{err}");
    }
}
