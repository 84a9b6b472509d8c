//! Mount syscalls behind a small trait: the real Linux implementation (bind mounts through
//! `O_PATH` descriptors, read-only and other per-mount flags by remount, the flags read from
//! [`mount_options`](crate::linux::mount_options)), and a recording fake (`fake`) that lets the
//! publish logic be unit-tested without root.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::mount::{MntFlags, MsFlags};

use crate::linux::mount_options::kept_flags;
pub use crate::linux::mount_options::{MountOptions, OptionsError};
use crate::linux::mountinfo::MountTable;
use crate::linux::mountpoint::{self, Shown, Top};
use crate::linux::statmount::{self, Containing};
use crate::path_io::PathIoError;

/// A failed mount operation, naming what was attempted and on which path.
pub type MountError = PathIoError;

/// The mount operations the node service needs. Implementations must be callable from many
/// threads at once; every call blocks.
pub trait Mounter: Send + Sync {
    /// The current mount table of this process: every mount, read in time linear in their
    /// number. Only for questions about every mount (see [`mountpoint`] for why).
    fn mount_table(&self) -> Result<MountTable, MountError>;
    /// The topmost mount at `path` if `path` is a mount point, asked of that path alone.
    fn mount_at(&self, path: &Path) -> Result<Option<Top>, MountError>;
    /// What a mount of `path` shows: its device and inode (a symlink is not followed).
    fn identity(&self, path: &Path) -> Result<Shown, MountError>;
    /// The mount the existing path `path` lies in, asked of that mount alone where the kernel
    /// can (`None`: no mount in the table holds it).
    fn containing(&self, path: &Path) -> Result<Option<Containing>, MountError>;
    /// Bind-mounts directory `source` on directory `target` with `options`; on failure
    /// nothing stays mounted.
    fn bind(&self, source: &Path, target: &Path, options: MountOptions) -> Result<(), MountError>;
    /// Bind-mounts the device node (or other non-directory) `source` on the regular file
    /// `target`, read-only if asked; on failure nothing stays mounted.
    fn bind_file(&self, source: &Path, target: &Path, readonly: bool) -> Result<(), MountError>;
    /// Unmounts the topmost mount at `target`.
    fn unmount(&self, target: &Path) -> Result<(), MountError>;
}

/// The real thing: `mount(2)` and `umount2(2)`.
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxMounter;

/// Opens a directory without following a symlink in its last component; mounting through
/// the descriptor means a path swapped for a symlink after our checks cannot redirect the
/// mount elsewhere.
fn open_dir(path: &Path) -> std::io::Result<File> {
    use nix::libc::{O_CLOEXEC, O_DIRECTORY, O_NOFOLLOW, O_PATH};
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(O_PATH | O_NOFOLLOW | O_DIRECTORY | O_CLOEXEC)
        .open(path)
}

/// Opens a file that is not a directory, as [`open_dir`] opens directories.
fn open_file(path: &Path) -> std::io::Result<File> {
    use nix::libc::{O_CLOEXEC, O_NOFOLLOW, O_PATH};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(O_PATH | O_NOFOLLOW | O_CLOEXEC)
        .open(path)?;
    if file.metadata()?.is_dir() {
        return Err(std::io::Error::from_raw_os_error(nix::libc::EISDIR));
    }
    Ok(file)
}

fn fd_path(file: &File) -> String {
    format!("/proc/self/fd/{}", file.as_raw_fd())
}

/// Bind-mounts what `from` is open on onto what `onto` is open on, through their
/// `/proc/self/fd` paths, so neither path can be swapped for a symlink in between.
fn bind_opened(from: &File, onto: &File, target: &Path) -> Result<(), MountError> {
    nix::mount::mount(
        Some(fd_path(from).as_str()),
        fd_path(onto).as_str(),
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(PathIoError::errno_at("bind-mount onto", target))
}

impl LinuxMounter {
    /// A remount that failed leaves the plain bind mount at `target`: it is undone, and the
    /// remount's error is the one reported.
    fn undo_if_failed(
        &self,
        target: &Path,
        remounted: Result<(), MountError>,
    ) -> Result<(), MountError> {
        remounted.inspect_err(|_| {
            if let Err(e) = self.unmount(target) {
                log::error!("could not undo the bind mount after a failed remount: {e}");
            }
        })
    }
}

impl Mounter for LinuxMounter {
    fn mount_table(&self) -> Result<MountTable, MountError> {
        MountTable::read().map_err(PathIoError::at(
            "read mount table",
            Path::new("/proc/self/mountinfo"),
        ))
    }

    fn mount_at(&self, path: &Path) -> Result<Option<Top>, MountError> {
        // The table is read only where statx cannot say (kernels before 5.8).
        let in_table = || Ok(MountTable::read()?.mounted_at(path).is_some());
        mountpoint::top_at(path, in_table).map_err(PathIoError::at("inspect mount point", path))
    }

    fn identity(&self, path: &Path) -> Result<Shown, MountError> {
        mountpoint::shown(path).map_err(PathIoError::at("inspect", path))
    }

    fn containing(&self, path: &Path) -> Result<Option<Containing>, MountError> {
        match statmount::containing(path).map_err(PathIoError::at("inspect the mount of", path))? {
            Some(found) => Ok(Some(found)),
            // Kernels before 6.8.
            None => Ok(self.mount_table()?.containing(path).and_then(table_line)),
        }
    }

    fn bind(&self, source: &Path, target: &Path, options: MountOptions) -> Result<(), MountError> {
        let from = open_dir(source).map_err(PathIoError::at("open bind source", source))?;
        let onto = open_dir(target).map_err(PathIoError::at("open mount target", target))?;
        bind_opened(&from, &onto, target)?;
        if !options.needs_remount() {
            return Ok(());
        }
        // A bind mount ignores flags given with it; they take effect only by remounting.
        let remount = || -> Result<(), MountError> {
            let mounted = open_dir(target).map_err(PathIoError::at("open new mount", target))?;
            // Flags the parent mount gave (say `nodev`) are not ours to clear.
            let st = nix::sys::statvfs::fstatvfs(&mounted)
                .map_err(PathIoError::errno_at("inspect new mount", target))?;
            let kept = kept_flags(st.flags());
            nix::mount::mount(
                None::<&str>,
                fd_path(&mounted).as_str(),
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | kept | options.ms_flags(),
                None::<&str>,
            )
            .map_err(PathIoError::errno_at("remount with flags", target))
        };
        self.undo_if_failed(target, remount())
    }

    fn bind_file(&self, source: &Path, target: &Path, readonly: bool) -> Result<(), MountError> {
        let from = open_file(source).map_err(PathIoError::at("open bind source", source))?;
        let onto = open_file(target).map_err(PathIoError::at("open mount target", target))?;
        bind_opened(&from, &onto, target)?;
        if !readonly {
            return Ok(());
        }
        let remount = || -> Result<(), MountError> {
            let mounted = open_file(target).map_err(PathIoError::at("open new mount", target))?;
            nix::mount::mount(
                None::<&str>,
                fd_path(&mounted).as_str(),
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
                None::<&str>,
            )
            .map_err(PathIoError::errno_at("remount read-only", target))
        };
        self.undo_if_failed(target, remount())
    }

    fn unmount(&self, target: &Path) -> Result<(), MountError> {
        nix::mount::umount2(target, MntFlags::UMOUNT_NOFOLLOW)
            .map_err(PathIoError::errno_at("unmount", target))
    }
}

/// A mount table line as [`Containing`] (`None` for a root that is not a path).
fn table_line(entry: &crate::linux::mountinfo::MountEntry) -> Option<Containing> {
    Some(Containing {
        dev: entry.dev,
        root: entry.root.clone()?,
        mount_point: entry.mount_point.clone(),
    })
}

/// A mounter that keeps its own mount table and records every call, for unit tests.
#[cfg(test)]
pub mod fake;
