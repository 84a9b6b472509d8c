//! The one syscall the copy engine needs that `nix` does not wrap, `statx` (FICLONE is in
//! `data.rs`, beside the data copy that tries it first), and descriptor-relative opens that
//! never follow a symlink and never open a device by accident.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::libc;
use nix::sys::stat::Mode;

/// What the copy needs to know of an inode, from one `statx`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// The whole `st_mode`: type and permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub ino: u64,
    pub dev: u64,
    pub rdev: u64,
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    /// The mount the inode was reached through; `None` on kernels before 5.8.
    pub mnt_id: Option<u64>,
}

impl Stat {
    pub fn kind(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    pub fn is_dir(&self) -> bool {
        self.kind() == libc::S_IFDIR
    }

    pub fn is_regular(&self) -> bool {
        self.kind() == libc::S_IFREG
    }

    /// Permission bits including setuid, setgid and sticky.
    pub fn perm(&self) -> u32 {
        self.mode & 0o7777
    }

    /// The identity hard links share.
    pub fn inode(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }

    /// Whether `other` is on the same mount as this: a bind mount of the same filesystem
    /// shares `st_dev`, so the mount ID decides where the kernel gives one.
    pub fn same_mount(&self, other: &Stat) -> bool {
        match (self.mnt_id, other.mnt_id) {
            (Some(a), Some(b)) => a == b && self.dev == other.dev,
            _ => self.dev == other.dev,
        }
    }
}

/// A path component as the C string syscalls take (names from `readdir` never hold NUL).
pub fn c_name(name: &OsStr) -> Result<CString, Errno> {
    CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)
}

/// `statx(dirfd, name)` without following a final symlink or triggering an automount; an
/// empty `name` stats `dirfd` itself.
pub fn statx(dirfd: BorrowedFd<'_>, name: &OsStr) -> Result<Stat, Errno> {
    let name = c_name(name)?;
    let mut flags = libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT;
    if name.is_empty() {
        flags |= libc::AT_EMPTY_PATH;
    }
    let mask = libc::STATX_BASIC_STATS | libc::STATX_MNT_ID;
    let mut buf = MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: `name` is a valid C string and `buf` a writable statx buffer of the right size.
    let rc = unsafe {
        libc::statx(
            dirfd.as_raw_fd(),
            name.as_ptr(),
            flags,
            mask,
            buf.as_mut_ptr(),
        )
    };
    Errno::result(rc)?;
    // SAFETY: statx returned 0, so it filled the buffer (and it was zeroed before).
    let x = unsafe { buf.assume_init() };
    Ok(Stat {
        mode: u32::from(x.stx_mode),
        uid: x.stx_uid,
        gid: x.stx_gid,
        nlink: x.stx_nlink,
        ino: x.stx_ino,
        dev: libc::makedev(x.stx_dev_major, x.stx_dev_minor),
        rdev: libc::makedev(x.stx_rdev_major, x.stx_rdev_minor),
        size: x.stx_size,
        blocks: x.stx_blocks,
        atime: (x.stx_atime.tv_sec, x.stx_atime.tv_nsec),
        mtime: (x.stx_mtime.tv_sec, x.stx_mtime.tv_nsec),
        mnt_id: (x.stx_mask & libc::STATX_MNT_ID != 0).then_some(x.stx_mnt_id),
    })
}

/// `openat` that retries without `O_NOATIME` where the kernel refuses it (not the owner and no
/// CAP_FOWNER, as in a user namespace): reading the source must not disturb its atimes, but
/// being unable to promise that is no reason to fail the copy.
fn open_noatime(dirfd: BorrowedFd<'_>, name: &OsStr, flags: OFlag) -> Result<OwnedFd, Errno> {
    let flags = flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
    match openat(dirfd, name, flags | OFlag::O_NOATIME, Mode::empty()) {
        Err(Errno::EPERM) => openat(dirfd, name, flags, Mode::empty()),
        other => other,
    }
}

/// Opens a directory entry for reading the directory; `O_DIRECTORY | O_NOFOLLOW` refuse a
/// symlink or anything else swapped in under the name.
pub fn open_dir(dirfd: BorrowedFd<'_>, name: &OsStr) -> Result<OwnedFd, Errno> {
    open_noatime(dirfd, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY)
}

/// Opens a regular file for reading, with its `statx`; `None` if the name no longer holds a
/// regular file. The name is first opened `O_PATH` and reopened for reading only once it is
/// known to be a regular file: opening a device node has side effects (a watchdog arms, a tape
/// rewinds), and a hostile volume owner could swap one in between our `statx` and the open.
pub fn open_regular(dirfd: BorrowedFd<'_>, name: &OsStr) -> Result<Option<(File, Stat)>, Errno> {
    let path_fd = openat(
        dirfd,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let stat = statx(path_fd.as_fd(), OsStr::new(""))?;
    if !stat.is_regular() {
        return Ok(None);
    }
    // The magic link `/proc/self/fd/<fd>` names the very inode the O_PATH descriptor holds.
    let path = proc_path(path_fd.as_fd(), None);
    let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC;
    let fd = match nix::fcntl::open(&path, flags | OFlag::O_NOATIME, Mode::empty()) {
        Err(Errno::EPERM) => nix::fcntl::open(&path, flags, Mode::empty()),
        other => other,
    }?;
    Ok(Some((File::from(fd), stat)))
}

/// `/proc/self/fd/<dirfd>[/<name>]`: a path that reaches `name` inside the directory `dirfd`
/// holds, for the calls that have no descriptor-relative form (`lgetxattr` and friends on a
/// symlink or a device node, which cannot be opened). Only the final component is looked up,
/// so a rename elsewhere cannot redirect it.
pub fn proc_path(dirfd: BorrowedFd<'_>, name: Option<&OsStr>) -> PathBuf {
    let mut path = PathBuf::from(format!("/proc/self/fd/{}", dirfd.as_raw_fd()));
    if let Some(name) = name {
        path.push(name);
    }
    path
}

/// The names in a directory, without `.` and `..`, sorted (so a copy visits a tree in the
/// same order every time, and the first name of a hard-linked inode is predictable).
pub fn read_names(dir: BorrowedFd<'_>) -> Result<Vec<std::ffi::OsString>, Errno> {
    // A fresh open of "." has its own offset, so the caller's descriptor is left alone.
    let mut stream = nix::dir::Dir::from_fd(open_dir(dir, OsStr::new("."))?)?;
    let mut names = Vec::new();
    for entry in stream.iter() {
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name != "." && name != ".." {
            names.push(name.to_owned());
        }
    }
    names.sort_unstable();
    Ok(names)
}
