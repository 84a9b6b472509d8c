//! A directory's project ID and PROJINHERIT flag (`FS_IOC_FSGETXATTR` /
//! `FS_IOC_FSSETXATTR`). Only the directory itself changes: entries created below it
//! afterwards inherit the ID; entries already there keep theirs. Symlinks are refused, so a
//! path swapped for one cannot redirect the change.

use std::os::fd::AsFd;
use std::path::Path;

use super::fs::open_dir;
use super::quota_error::QuotaError;
use super::sys;
use crate::path_io::PathIoError;

/// A directory's project ID and whether new entries inherit it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProjectAttr {
    pub id: u32,
    pub inherit: bool,
}

/// Reads `path`'s project ID and PROJINHERIT flag (a directory; a file is read too).
pub fn project_of(path: &Path) -> Result<ProjectAttr, QuotaError> {
    let op = "read project ID of";
    let file = open_any(path).map_err(PathIoError::at(op, path))?;
    let attr = sys::get_fsxattr(file.as_fd()).map_err(PathIoError::at(op, path))?;
    Ok(ProjectAttr {
        id: attr.projid,
        inherit: attr.xflags & sys::FS_XFLAG_PROJINHERIT != 0,
    })
}

/// Sets directory `dir`'s project ID to `id`, with PROJINHERIT.
pub fn set_project(dir: &Path, id: u32) -> Result<(), QuotaError> {
    update(dir, "set project ID of", |attr| {
        attr.projid = id;
        attr.xflags |= sys::FS_XFLAG_PROJINHERIT;
    })
}

/// Returns directory `dir` to project 0 without PROJINHERIT.
pub fn clear_project(dir: &Path) -> Result<(), QuotaError> {
    update(dir, "clear project ID of", |attr| {
        attr.projid = 0;
        attr.xflags &= !sys::FS_XFLAG_PROJINHERIT;
    })
}

fn update(
    dir: &Path,
    op: &'static str,
    change: impl FnOnce(&mut sys::Fsxattr),
) -> Result<(), QuotaError> {
    let file = open_dir(dir).map_err(PathIoError::at(op, dir))?;
    let mut attr = sys::get_fsxattr(file.as_fd()).map_err(PathIoError::at(op, dir))?;
    change(&mut attr);
    sys::set_fsxattr(file.as_fd(), &attr).map_err(PathIoError::at(op, dir))?;
    Ok(())
}

/// Opens a directory or a regular file (read-only, not following a symlink).
fn open_any(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
}
