//! Mount syscalls behind a small trait: the real Linux implementation (every path opened once
//! through no symbolic link, then bind mounts made on those descriptors, by the new mount API
//! in [`detached`] where the kernel has it, else by `mount(2)` and a remount for the flags;
//! unmounts of the very mount that was checked; the flags read from
//! [`mount_options`](crate::linux::mount_options)), and a recording fake (`fake`) that lets the
//! publish logic be unit-tested without root.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use nix::fcntl::OFlag;
use nix::mount::{MntFlags, MsFlags};

use crate::linux::mount_options::kept_flags;
pub use crate::linux::mount_options::{MountOptions, OptionsError, SelinuxContext};
use crate::linux::mountinfo::MountTable;
use crate::linux::mountpoint::{self, Root, Shown, Top};
use crate::linux::resolve::open_no_symlinks;
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
    /// Mounts the `fstype` filesystem on the block device `device` onto the directory
    /// `target` (opened through no symbolic link), with `options`' flags and, if given, the
    /// SELinux `context`; `prepare` gets the filesystem's root, open and writable, before any
    /// path shows it. On failure (`prepare`'s too) nothing stays mounted.
    fn mount_device(
        &self,
        device: &Path,
        fstype: &CStr,
        target: &Path,
        options: MountOptions,
        context: Option<&SelinuxContext>,
        prepare: &mut dyn FnMut(&File) -> std::io::Result<()>,
    ) -> Result<(), MountError>;
    /// Unmounts the topmost mount at `target` if it is still the one `checked` there (by
    /// [`mount_at`](Mounter::mount_at)); a mount that changed in between is left alone and
    /// the call fails.
    fn unmount(&self, target: &Path, checked: &Top) -> Result<(), MountError>;
}

/// The real thing: the new mount API where the kernel has it, `mount(2)` before, and
/// `umount2(2)`; every path opened once without following a symbolic link in any component,
/// and the syscalls made on those descriptors.
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxMounter;

/// Opens a directory through no symbolic link (see [`open_no_symlinks`]): a path whose
/// component is swapped for a link after the caller's checks fails here (`ELOOP`) instead of
/// leading the mount elsewhere.
fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
    Ok(open_no_symlinks(path, OFlag::O_DIRECTORY)?)
}

/// Opens a file that is not a directory, as [`open_dir`] opens directories.
fn open_file(path: &Path) -> std::io::Result<OwnedFd> {
    let file = open_no_symlinks(path, OFlag::empty())?;
    if nix::sys::stat::fstat(&file)?.st_mode & nix::libc::S_IFMT == nix::libc::S_IFDIR {
        return Err(std::io::Error::from_raw_os_error(nix::libc::EISDIR));
    }
    Ok(file)
}

fn fd_path(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Bind-mounts what `from` is open on onto what `onto` is open on, with `options`: by the new
/// mount API where the kernel has it, else by `mount(2)` on their `/proc/self/fd` paths and a
/// remount for the flags.
fn bind_opened(
    from: &OwnedFd,
    onto: &OwnedFd,
    target: &Path,
    options: MountOptions,
) -> Result<(), MountError> {
    let bound = detached::bind(from, onto, options);
    if bound.map_err(PathIoError::errno_at("bind-mount onto", target))? {
        return Ok(());
    }
    nix::mount::mount(
        Some(fd_path(from).as_str()),
        fd_path(onto).as_str(),
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(PathIoError::errno_at("bind-mount onto", target))?;
    if !options.needs_remount() {
        return Ok(());
    }
    remount(from, target, options).inspect_err(|_| {
        if let Err(e) = unmount_new(from, target) {
            log::error!("could not undo the bind mount after a failed remount: {e}");
        }
    })
}

/// Opens the mount just made at `target` (kernels before 5.12), checked to be a mount whose
/// root is what `from` is open on: never a mount a swap put there instead.
fn open_new_mount(from: &OwnedFd, target: &Path) -> Result<OwnedFd, MountError> {
    let at = |e| PathIoError::new("open new mount", target, e);
    let mounted = open_no_symlinks(target, OFlag::empty()).map_err(|e| at(e.into()))?;
    let source = mountpoint::shown_of(from).map_err(at)?;
    match mountpoint::root_of(&mounted, || Ok(true)).map_err(at)? {
        Some(root) if root.shows == source => Ok(mounted),
        _ => Err(at(changed())),
    }
}

/// A bind mount ignores flags given with it; before 5.12 they take effect only by remounting.
fn remount(from: &OwnedFd, target: &Path, options: MountOptions) -> Result<(), MountError> {
    let mounted = open_new_mount(from, target)?;
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
}

/// Undoes the bind just made at `target` (kernels before 5.12).
fn unmount_new(from: &OwnedFd, target: &Path) -> Result<(), MountError> {
    let source = mountpoint::shown_of(from).map_err(|e| PathIoError::new("unmount", target, e))?;
    unmount_if(target, |root| root.shows == source)
}

/// Unmounts the topmost mount at `target` if `wanted` holds for it. Both the check and the
/// unmount find it from its parent, opened once through no symbolic link, by the one name
/// (not followed if a link): what is unmounted is in the directory that was checked. The
/// descriptor held is the parent's, which does not keep the mount itself busy.
fn unmount_if(target: &Path, wanted: impl FnOnce(&Root) -> bool) -> Result<(), MountError> {
    let at = |e| PathIoError::new("unmount", target, e);
    let (Some(parent), Some(name)) = (target.parent(), target.file_name()) else {
        return Err(at(std::io::ErrorKind::InvalidInput.into()));
    };
    let dir = open_no_symlinks(parent, OFlag::O_DIRECTORY).map_err(|e| at(e.into()))?;
    match mountpoint::root_in(&dir, name, in_table(target)).map_err(at)? {
        Some(root) if wanted(&root) => {}
        _ => return Err(at(changed())),
    }
    let in_dir = Path::new(&fd_path(&dir)).join(name);
    nix::mount::umount2(&in_dir, MntFlags::UMOUNT_NOFOLLOW)
        .map_err(PathIoError::errno_at("unmount", target))
}

/// The mount at a path is not the one that was checked there.
fn changed() -> std::io::Error {
    std::io::Error::other("the mount there changed since it was checked")
}

impl Mounter for LinuxMounter {
    fn mount_table(&self) -> Result<MountTable, MountError> {
        MountTable::read().map_err(PathIoError::at(
            "read mount table",
            Path::new("/proc/self/mountinfo"),
        ))
    }

    fn mount_at(&self, path: &Path) -> Result<Option<Top>, MountError> {
        (mountpoint::top_at(path, in_table(path)))
            .map_err(PathIoError::at("inspect mount point", path))
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
        bind_opened(&from, &onto, target, options)
    }

    fn bind_file(&self, source: &Path, target: &Path, readonly: bool) -> Result<(), MountError> {
        let from = open_file(source).map_err(PathIoError::at("open bind source", source))?;
        let onto = open_file(target).map_err(PathIoError::at("open mount target", target))?;
        let options = MountOptions {
            readonly,
            ..MountOptions::default()
        };
        bind_opened(&from, &onto, target, options)
    }

    fn mount_device(
        &self,
        device: &Path,
        fstype: &CStr,
        target: &Path,
        options: MountOptions,
        context: Option<&SelinuxContext>,
        prepare: &mut dyn FnMut(&File) -> std::io::Result<()>,
    ) -> Result<(), MountError> {
        let onto = open_dir(target).map_err(PathIoError::at("open mount target", target))?;
        let source = CString::new(device.as_os_str().as_encoded_bytes())
            .map_err(|e| PathIoError::new("mount", device, std::io::Error::other(e)))?;
        detached::mount_device(fstype, &source, &onto, options, context, prepare)
            .map_err(PathIoError::at("mount a filesystem onto", target))
    }

    fn unmount(&self, target: &Path, checked: &Top) -> Result<(), MountError> {
        unmount_if(target, |root| checked.is(root))
    }
}

/// Whether `path` is a mount point by the mount table: asked only where statx cannot say
/// (kernels before 5.8).
fn in_table(path: &Path) -> impl FnOnce() -> std::io::Result<bool> + '_ {
    move || Ok(MountTable::read()?.mounted_at(path).is_some())
}

/// A mount table line as [`Containing`] (`None` for a root that is not a path).
fn table_line(entry: &crate::linux::mountinfo::MountEntry) -> Option<Containing> {
    Some(Containing {
        dev: entry.dev,
        root: entry.root.clone()?,
        mount_point: entry.mount_point.clone(),
    })
}

mod detached;

/// A mounter that keeps its own mount table and records every call, for unit tests.
#[cfg(test)]
pub mod fake;
