//! "What is mounted at this path?", asked of one path in O(1), whatever the size of the mount
//! table: `statx(2)` says whether a path is the root of a mount (`STATX_ATTR_MOUNT_ROOT`) and
//! which mount (`STATX_MNT_ID_UNIQUE`, or `STATX_MNT_ID` before Linux 6.8), and gives the
//! device and inode of the mount's root; `fstatvfs(2)` gives that mount's per-mount flags.
//!
//! A mount *shows* a directory exactly when its root has the directory's device and inode
//! (a bind of a subdirectory or of a parent has another inode), which is what
//! [`Source`](crate::linux::mountinfo::Source) says from the mount table, without reading it.
//! Only the topmost of stacked mounts is visible at a path; unmounting it uncovers the next.
//!
//! Kernels before 5.8 report no `STATX_ATTR_MOUNT_ROOT`; there, and only there, whether the
//! path is a mount point is looked up in the mount table (the rest still comes from statx).
//! `statmount(2)`/`listmount(2)` (Linux 6.8) add nothing per path: they look a mount up by
//! its ID, and neither they nor anything else in the kernel answers "every mount of this
//! directory" without visiting every mount.

use std::ffi::OsStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use nix::fcntl::OFlag;

use crate::linux::mount_options::{self, ByOptionName};
use crate::linux::resolve::{open_no_symlinks, open_no_symlinks_in};

/// What a mount shows at its root: a directory's or a file's device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shown {
    pub dev: u64,
    pub ino: u64,
}

/// The topmost mount at a mount point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Top {
    /// The kernel's ID of the mount (unique for the boot where the kernel has such IDs).
    pub mnt_id: u64,
    /// What its root is.
    pub shows: Shown,
    /// The device number when its root is a block device node (a bind of `/dev/loopN`).
    pub block_rdev: Option<u64>,
    /// Per-mount flags by their option names (`ro` or `rw`, then those of
    /// [`FLAGS`](mount_options::FLAGS) set), as mountinfo would list them.
    pub options: Vec<&'static str>,
}

impl Top {
    pub fn has_option(&self, option: &str) -> bool {
        self.options.contains(&option)
    }

    pub fn is_readonly(&self) -> bool {
        self.has_option("ro")
    }
}

impl ByOptionName for Top {
    fn has_option(&self, option: &str) -> bool {
        Top::has_option(self, option)
    }
}

/// One `statx` of an open descriptor: what is there, and whether it is a mount's root
/// (`None`: this kernel cannot say).
struct Statx {
    shown: Shown,
    block_rdev: Option<u64>,
    mnt_id: u64,
    /// `mnt_id` is the unique 64-bit ID (Linux 6.8+), the one `statmount(2)` takes.
    unique_id: bool,
    mount_root: Option<bool>,
}

fn statx_fd(fd: &OwnedFd) -> std::io::Result<Statx> {
    use nix::libc;
    let mut buf = std::mem::MaybeUninit::<libc::statx>::zeroed();
    let mask = libc::STATX_TYPE | libc::STATX_INO | libc::STATX_MNT_ID | libc::STATX_MNT_ID_UNIQUE;
    // SAFETY: an empty path with AT_EMPTY_PATH names the descriptor; buf is statx-sized.
    let rc = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            mask,
            buf.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statx succeeded and filled the buffer.
    let stx = unsafe { buf.assume_init() };
    let root_bit = libc::STATX_ATTR_MOUNT_ROOT as u64;
    let is_block = u32::from(stx.stx_mode) & libc::S_IFMT == libc::S_IFBLK;
    Ok(Statx {
        shown: Shown {
            dev: libc::makedev(stx.stx_dev_major, stx.stx_dev_minor),
            ino: stx.stx_ino,
        },
        block_rdev: is_block.then(|| libc::makedev(stx.stx_rdev_major, stx.stx_rdev_minor)),
        mnt_id: stx.stx_mnt_id,
        unique_id: stx.stx_mask & libc::STATX_MNT_ID_UNIQUE != 0,
        mount_root: (stx.stx_attributes_mask & root_bit != 0)
            .then_some(stx.stx_attributes & root_bit != 0),
    })
}

/// Opens `path` itself, following no symbolic link in any component (`ELOOP`; see
/// [`open_no_symlinks`]): every answer about it then comes from the inode the link-free path
/// named, even if a component is swapped for a link meanwhile. Paths asked about here are
/// canonical, as mount points in mountinfo are.
fn open_path(path: &Path) -> std::io::Result<Option<OwnedFd>> {
    match open_no_symlinks(path, OFlag::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The device and inode of what is at `path` (not following a last symlink).
pub fn shown(path: &Path) -> std::io::Result<Shown> {
    let fd = open_path(path)?.ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
    Ok(statx_fd(&fd)?.shown)
}

/// The device and inode of what `fd` is open on.
pub fn shown_of(fd: &OwnedFd) -> std::io::Result<Shown> {
    Ok(statx_fd(fd)?.shown)
}

/// The unique ID of the mount `path` (which must exist) lies in; `None` where this kernel
/// gives only the reused IDs of mountinfo (before Linux 6.8).
pub fn unique_mount_id(path: &Path) -> std::io::Result<Option<u64>> {
    let fd = open_path(path)?.ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
    let stx = statx_fd(&fd)?;
    Ok(stx.unique_id.then_some(stx.mnt_id))
}

/// The topmost mount at `path` if `path` is a mount point; `None` when it is not, or is not
/// there. `is_mount_point` answers for kernels that cannot say (before 5.8).
pub fn top_at(
    path: &Path,
    is_mount_point: impl FnOnce() -> std::io::Result<bool>,
) -> std::io::Result<Option<Top>> {
    let Some(fd) = open_path(path)? else {
        return Ok(None);
    };
    top_of(&fd, is_mount_point)
}

/// A mount's identity at a mount point, without its flags: what an unmount checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Root {
    pub mnt_id: u64,
    pub shows: Shown,
}

impl Top {
    /// Whether `root` is this mount.
    pub fn is(&self, root: &Root) -> bool {
        self.mnt_id == root.mnt_id && self.shows == root.shows
    }
}

/// The mount at the entry `name` of the directory `dir` is open on (through no symbolic link),
/// if that entry is a mount point. The descriptor of the mount's root is closed again: held,
/// it would keep the mount busy for an unmount.
pub fn root_in(
    dir: &OwnedFd,
    name: &OsStr,
    is_mount_point: impl FnOnce() -> std::io::Result<bool>,
) -> std::io::Result<Option<Root>> {
    match open_no_symlinks_in(dir, name, OFlag::empty()) {
        Ok(fd) => root_of(&fd, is_mount_point),
        Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The mount whose root `fd` is open on, if it is one (one `statx`).
pub fn root_of(
    fd: &OwnedFd,
    is_mount_point: impl FnOnce() -> std::io::Result<bool>,
) -> std::io::Result<Option<Root>> {
    let stx = statx_fd(fd)?;
    let root = Root {
        mnt_id: stx.mnt_id,
        shows: stx.shown,
    };
    Ok(mounted(&stx, is_mount_point)?.then_some(root))
}

/// Whether what `stx` describes is a mount's root; `is_mount_point` answers where the kernel
/// cannot say (before 5.8).
fn mounted(
    stx: &Statx,
    is_mount_point: impl FnOnce() -> std::io::Result<bool>,
) -> std::io::Result<bool> {
    match stx.mount_root {
        Some(root) => Ok(root),
        None => is_mount_point(),
    }
}

/// The mount whose root `fd` is open on, if it is one, with its flags.
fn top_of(
    fd: &OwnedFd,
    is_mount_point: impl FnOnce() -> std::io::Result<bool>,
) -> std::io::Result<Option<Top>> {
    let stx = statx_fd(fd)?;
    if !mounted(&stx, is_mount_point)? {
        return Ok(None);
    }
    let flags = nix::sys::statvfs::fstatvfs(fd)?.flags();
    Ok(Some(Top {
        mnt_id: stx.mnt_id,
        shows: stx.shown,
        block_rdev: stx.block_rdev,
        options: mount_options::names_of(flags),
    }))
}

/// Whether this kernel marks mount roots in statx (Linux 5.8+), asked of `/`.
pub fn kernel_marks_mount_roots() -> bool {
    open_path(Path::new("/"))
        .ok()
        .flatten()
        .and_then(|fd| statx_fd(&fd).ok())
        .is_some_and(|s| s.mount_root == Some(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_directory_is_a_mount_root_and_a_directory_below_it_usually_is_not() {
        assert!(kernel_marks_mount_roots(), "Linux 5.8+ marks mount roots");
        let top = top_at(Path::new("/"), || Ok(true)).unwrap().unwrap();
        assert!(top.has_option("ro") || top.has_option("rw"));
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(top_at(dir.path(), || Ok(false)).unwrap(), None);
    }

    #[test]
    fn a_missing_path_holds_no_mount_and_has_no_identity() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        assert_eq!(top_at(&gone, || Ok(false)).unwrap(), None);
        assert_eq!(
            shown(&gone).unwrap_err().kind(),
            std::io::ErrorKind::NotFound
        );
    }

    #[test]
    fn two_names_of_one_directory_are_one_identity_and_a_sibling_is_another() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(dir.path().join("b")).unwrap();
        let again = dir.path().join("b/../a");
        assert_eq!(shown(&a).unwrap(), shown(&again).unwrap());
        assert_ne!(shown(&a).unwrap(), shown(&dir.path().join("b")).unwrap());
    }
}
