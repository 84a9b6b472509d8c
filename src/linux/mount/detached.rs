//! Bind mounts through the new mount API: the source cloned as a detached mount
//! (`open_tree`), given its flags while no path shows it (`mount_setattr`, Linux 5.12), then
//! attached onto the target's descriptor (`move_mount`). Nothing is looked up by path between
//! the caller's check and the mount, the mount never shows without its flags, and a failure
//! before the attach leaves nothing mounted: closing the detached mount dissolves it.
//!
//! A filesystem on a block device is mounted the same way ([`mount_device`]): created and
//! mounted detached (`fsopen`, `fsconfig`, `fsmount`), readied through its root while no path
//! shows it, given its flags, then attached onto the checked descriptor.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nix::errno::Errno;

use crate::linux::mount_options::{MountOptions, SelinuxContext};

/// Whether the kernel did the bind: `Ok(false)` when it lacks the calls (before 5.2, or
/// before 5.12 when flags are asked), and nothing was done.
pub fn bind(from: &OwnedFd, onto: &OwnedFd, options: MountOptions) -> Result<bool, Errno> {
    let Some(tree) = clone_tree(from)? else {
        return Ok(false);
    };
    let (set, clear) = options.mount_attr();
    if (set | clear) != 0 && !set_attr(&tree, set, clear)? {
        return Ok(false);
    }
    attach(&tree, onto)?;
    Ok(true)
}

/// `open_tree(OPEN_TREE_CLONE)` of what `from` is open on: a detached, non-recursive bind.
fn clone_tree(from: &OwnedFd) -> Result<Option<OwnedFd>, Errno> {
    let flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_EMPTY_PATH as u32;
    // SAFETY: an empty, NUL-terminated path with AT_EMPTY_PATH names the open descriptor;
    // the call reads nothing else.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, from.as_raw_fd(), c"".as_ptr(), flags) };
    match Errno::result(fd) {
        Err(Errno::ENOSYS) => Ok(None),
        Err(e) => Err(e),
        // SAFETY: open_tree returned a new descriptor, owned by nobody else.
        Ok(fd) => Ok(Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })),
    }
}

/// `mount_setattr` on the detached mount; `Ok(false)`: the kernel lacks it.
fn set_attr(tree: &OwnedFd, set: u64, clear: u64) -> Result<bool, Errno> {
    let attr = libc::mount_attr {
        attr_set: set,
        attr_clr: clear,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: attr is a valid mount_attr of the size passed; the empty path with
    // AT_EMPTY_PATH names the descriptor.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    match Errno::result(rc) {
        Err(Errno::ENOSYS) => Ok(false),
        Err(e) => Err(e),
        Ok(_) => Ok(true),
    }
}

/// `move_mount` of the detached mount onto what `onto` is open on.
fn attach(tree: &OwnedFd, onto: &OwnedFd) -> Result<(), Errno> {
    let flags = libc::MOVE_MOUNT_F_EMPTY_PATH | libc::MOVE_MOUNT_T_EMPTY_PATH;
    // SAFETY: both paths are empty and NUL-terminated, naming the two open descriptors.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            onto.as_raw_fd(),
            c"".as_ptr(),
            flags,
        )
    };
    Errno::result(rc).map(drop)
}

/// Mounts the `fstype` filesystem on the block device `device` onto what `onto` is open on:
/// `prepare` gets its root, open and writable, before any path shows it (a failure there, as
/// any before the attach, leaves nothing mounted), then `options`' flags are set and the mount
/// attached. A `context` is the superblock's SELinux label, set before it is created: a kernel
/// without SELinux (or without a policy loaded) refuses it, and the error says so. Needs Linux
/// 5.2 (5.12 for flags); an older kernel is ENOSYS.
pub fn mount_device(
    fstype: &CStr,
    device: &CStr,
    onto: &OwnedFd,
    options: MountOptions,
    context: Option<&SelinuxContext>,
    prepare: &mut dyn FnMut(&File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    // SAFETY: a NUL-terminated name and flags; the call reads nothing else.
    let fs = unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), libc::FSOPEN_CLOEXEC) };
    // SAFETY: fsopen returned a new descriptor, owned by nobody else.
    let fs = unsafe { OwnedFd::from_raw_fd(Errno::result(fs)? as i32) };
    fs_config(
        &fs,
        libc::FSCONFIG_SET_STRING,
        Some(c"source"),
        Some(device),
    )?;
    if fstype == c"ext4" {
        // The lazy inode-table init zeroes new block groups' tables through the device, and a
        // loop device turns that into holes punched in its file: a thick image would thin out
        // under its filesystem. Its unwritten blocks read as zeros already.
        fs_config(&fs, libc::FSCONFIG_SET_FLAG, Some(c"noinit_itable"), None)?;
    }
    if let Some(context) = context {
        let label = CString::new(context.label()).map_err(std::io::Error::other)?;
        fs_config(
            &fs,
            libc::FSCONFIG_SET_STRING,
            Some(c"context"),
            Some(&label),
        )
        .map_err(|errno| {
            std::io::Error::new(
                std::io::Error::from(errno).kind(),
                format!(
                    "the kernel refused the SELinux mount option context={:?} ({errno}): it \
                         takes one only where SELinux is enabled with a policy loaded",
                    context.label()
                ),
            )
        })?;
    }
    fs_config(&fs, libc::FSCONFIG_CMD_CREATE, None, None)?;
    // SAFETY: an open filesystem context and flags; no pointers.
    let mnt = unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), libc::FSMOUNT_CLOEXEC, 0) };
    // SAFETY: fsmount returned a new descriptor, owned by nobody else.
    let mnt = unsafe { OwnedFd::from_raw_fd(Errno::result(mnt)? as i32) };
    // The mount's descriptor is O_PATH, which ioctls and fchmod refuse: its root, opened.
    let root = nix::fcntl::openat(
        &mnt,
        ".",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    prepare(&File::from(root))?;
    let (set, clear) = options.mount_attr();
    if (set | clear) != 0 && !set_attr(&mnt, set, clear)? {
        return Err(Errno::ENOSYS.into());
    }
    attach(&mnt, onto)?;
    Ok(())
}

/// One `fsconfig` command on a filesystem context.
fn fs_config(
    fs: &OwnedFd,
    command: libc::c_uint,
    key: Option<&CStr>,
    value: Option<&CStr>,
) -> Result<(), Errno> {
    let ptr = |s: Option<&CStr>| s.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: the key and value are NUL-terminated strings (or null where the command takes
    // none) that outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            command,
            ptr(key),
            ptr(value),
            0,
        )
    };
    Errno::result(rc).map(drop)
}
