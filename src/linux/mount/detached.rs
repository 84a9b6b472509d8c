//! Bind mounts through the new mount API: the source cloned as a detached mount
//! (`open_tree`), given its flags while no path shows it (`mount_setattr`, Linux 5.12), then
//! attached onto the target's descriptor (`move_mount`). Nothing is looked up by path between
//! the caller's check and the mount, the mount never shows without its flags, and a failure
//! before the attach leaves nothing mounted: closing the detached mount dissolves it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nix::errno::Errno;

use crate::linux::mount_options::MountOptions;

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
