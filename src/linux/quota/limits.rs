//! A project's limits and usage, through the interface of its filesystem: XFS's own
//! (`fs_disk_quota`, 512-byte basic blocks) or the generic one on PRJQUOTA (`if_dqblk`,
//! limits in 1 KiB blocks, usage in bytes). Soft limits are always 0: a volume's size is a
//! hard ceiling, with no grace period to outlive.

use std::path::Path;

use super::fs::{FsKind, QuotaFs};
use super::project;
use super::quota_error::{QuotaError, QuotaOp};
use super::sys;
use crate::path_io::PathIoError;

/// Hard limits of a project; 0 means no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub bytes: u64,
    pub inodes: u64,
}

/// What a project uses, and the limits in force (as the filesystem rounded them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub bytes: u64,
    pub inodes: u64,
    pub limits: Limits,
}

impl Usage {
    /// Nothing is charged to the project.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0 && self.inodes == 0
    }
}

impl QuotaFs {
    /// Sets project `id`'s hard limits (block limit rounded up to the interface's unit) and
    /// zeroes its soft limits. Takes effect at once, also for files already open.
    pub fn set_limits(&self, id: u32, limits: Limits) -> Result<(), QuotaError> {
        match self.require_kind()? {
            FsKind::Xfs => {
                let mut q = sys::FsDiskQuota {
                    version: sys::FS_DQUOT_VERSION,
                    flags: sys::FS_PROJ_QUOTA,
                    fieldmask: sys::FS_DQ_BHARD
                        | sys::FS_DQ_BSOFT
                        | sys::FS_DQ_IHARD
                        | sys::FS_DQ_ISOFT,
                    id,
                    blk_hardlimit: limits.bytes.div_ceil(sys::XFS_BB_SIZE),
                    ino_hardlimit: limits.inodes,
                    ..Default::default()
                };
                let cmd = sys::qcmd(sys::Q_XSETQLIM, sys::PRJQUOTA);
                self.quotactl(QuotaOp::SetLimits, cmd, id, &mut q)
            }
            FsKind::Ext4 => {
                let mut q = sys::IfDqblk {
                    bhardlimit: limits.bytes.div_ceil(sys::QIF_DQBLKSIZE),
                    ihardlimit: limits.inodes,
                    valid: sys::QIF_BLIMITS | sys::QIF_ILIMITS,
                    ..Default::default()
                };
                let cmd = sys::qcmd(sys::Q_SETQUOTA, sys::PRJQUOTA);
                self.quotactl(QuotaOp::SetLimits, cmd, id, &mut q)
            }
        }
    }

    /// Project `id`'s usage and limits. A project without a quota record uses nothing and
    /// has no limits (XFS answers ENOENT for it).
    pub fn usage(&self, id: u32) -> Result<Usage, QuotaError> {
        match self.require_kind()? {
            FsKind::Xfs => {
                let mut q = sys::FsDiskQuota::default();
                let cmd = sys::qcmd(sys::Q_XGETQUOTA, sys::PRJQUOTA);
                match self.quotactl(QuotaOp::GetQuota, cmd, id, &mut q) {
                    Ok(()) => Ok(xfs_usage(&q)),
                    Err(e) if e.errno() == Some(libc::ENOENT) => Ok(Usage::default()),
                    Err(e) => Err(e),
                }
            }
            FsKind::Ext4 => {
                let mut q = sys::IfDqblk::default();
                let cmd = sys::qcmd(sys::Q_GETQUOTA, sys::PRJQUOTA);
                self.quotactl(QuotaOp::GetQuota, cmd, id, &mut q)?;
                Ok(Usage {
                    bytes: q.curspace,
                    inodes: q.curinodes,
                    limits: Limits {
                        bytes: q.bhardlimit * sys::QIF_DQBLKSIZE,
                        inodes: q.ihardlimit,
                    },
                })
            }
        }
    }

    /// The lowest project ID at or above `from` that has a quota record (usage or limits)
    /// on this filesystem, whoever made it: other volumes, the kubelet, an administrator.
    pub fn next_in_use(&self, from: u32) -> Result<Option<u32>, QuotaError> {
        let found = match self.require_kind()? {
            FsKind::Xfs => {
                let mut q = sys::FsDiskQuota::default();
                let cmd = sys::qcmd(sys::Q_XGETNEXTQUOTA, sys::PRJQUOTA);
                self.quotactl(QuotaOp::NextQuota, cmd, from, &mut q)
                    .map(|()| q.id)
            }
            FsKind::Ext4 => {
                let mut q = sys::IfNextDqblk::default();
                let cmd = sys::qcmd(sys::Q_GETNEXTQUOTA, sys::PRJQUOTA);
                self.quotactl(QuotaOp::NextQuota, cmd, from, &mut q)
                    .map(|()| q.id)
            }
        };
        match found {
            Ok(id) => Ok(Some(id)),
            Err(e) if e.errno() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Gives directory `dir` (on this filesystem) project `id` with PROJINHERIT, so that
    /// everything created below is charged to it, under `limits`. The limits come first, so
    /// the directory is never in an unlimited project; if tagging fails they are cleared.
    pub fn assign(&self, dir: &Path, id: u32, limits: Limits) -> Result<(), QuotaError> {
        let meta = std::fs::symlink_metadata(dir).map_err(PathIoError::at("open", dir))?;
        self.require_same_fs(dir, &meta)?;
        self.set_limits(id, limits)?;
        if let Err(e) = project::set_project(dir, id) {
            let _ = self.set_limits(id, Limits::default());
            return Err(e);
        }
        Ok(())
    }

    /// Brings the quota's usage up to date after files were removed: syncfs, then statfs,
    /// which on XFS pushes the background inactivation of removed inodes (until it has run,
    /// their blocks and the inodes themselves are still charged to their project).
    pub fn settle(&self) -> Result<(), QuotaError> {
        nix::unistd::syncfs(self.root()).map_err(PathIoError::errno_at("sync", self.path()))?;
        nix::sys::statfs::fstatfs(self.root())
            .map_err(PathIoError::errno_at("statfs", self.path()))?;
        Ok(())
    }

    /// Releases project `id`: clears its limits and, if `dir` still exists, its project ID
    /// and PROJINHERIT. Once nothing is charged to it, the ID has no quota record left.
    pub fn release(&self, dir: Option<&Path>, id: u32) -> Result<(), QuotaError> {
        if let Some(dir) = dir.filter(|d| d.symlink_metadata().is_ok_and(|m| m.is_dir())) {
            project::clear_project(dir)?;
        }
        self.set_limits(id, Limits::default())
    }
}

fn xfs_usage(q: &sys::FsDiskQuota) -> Usage {
    Usage {
        bytes: q.bcount * sys::XFS_BB_SIZE,
        inodes: q.icount,
        limits: Limits {
            bytes: q.blk_hardlimit * sys::XFS_BB_SIZE,
            inodes: q.ino_hardlimit,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xfs_basic_blocks_become_bytes() {
        let q = sys::FsDiskQuota {
            bcount: 3,
            icount: 2,
            blk_hardlimit: 2048,
            ino_hardlimit: 100,
            ..Default::default()
        };
        assert_eq!(
            xfs_usage(&q),
            Usage {
                bytes: 1536,
                inodes: 2,
                limits: Limits {
                    bytes: 1 << 20,
                    inodes: 100
                }
            }
        );
    }

    #[test]
    fn limits_on_a_filesystem_without_quotas_are_refused_with_its_path() {
        let fs = QuotaFs::open(Path::new("/proc")).expect("open /proc");
        let err = fs
            .set_limits(
                7,
                Limits {
                    bytes: 1,
                    inodes: 0,
                },
            )
            .expect_err("no quotas on /proc");
        assert!(
            err.to_string().contains("/proc is not on XFS or ext4"),
            "{err}"
        );
    }
}
