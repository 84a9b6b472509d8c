//! Owners, extended attributes, modes and timestamps, applied in the one order that keeps them
//! all: `chown` first (it clears setuid/setgid and drops `security.capability`), then the
//! attributes (an access ACL rewrites the group bits), then the mode, and the times last
//! (everything before changes only ctime, which nobody can set).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::fcntl::AtFlags;
use nix::sys::stat::{FchmodatFlags, Mode, UtimensatFlags, fchmod, fchmodat, futimens, utimensat};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, fchown, fchownat};
use xattr::FileExt;

use super::copy_error::CopyError;
use super::dir_entries::{Stat, proc_path};
use crate::path_io::PathIoError;

/// An inode to read attributes from or write them to: an open file or directory, or a name in
/// a directory for what cannot be opened (a symlink, a fifo, a device node).
pub enum Node<'a> {
    Open(&'a File),
    Entry {
        dir: BorrowedFd<'a>,
        name: &'a OsStr,
    },
}

impl Node<'_> {
    fn list(&self) -> io::Result<Vec<OsString>> {
        match self {
            Node::Open(file) => Ok(file.list_xattr()?.collect()),
            Node::Entry { dir, name } => Ok(xattr::list(proc_path(*dir, Some(name)))?.collect()),
        }
    }

    fn get(&self, attr: &OsStr) -> io::Result<Option<Vec<u8>>> {
        match self {
            Node::Open(file) => file.get_xattr(attr),
            Node::Entry { dir, name } => xattr::get(proc_path(*dir, Some(name)), attr),
        }
    }

    fn set(&self, attr: &OsStr, value: &[u8]) -> io::Result<()> {
        match self {
            Node::Open(file) => file.set_xattr(attr, value),
            Node::Entry { dir, name } => xattr::set(proc_path(*dir, Some(name)), attr, value),
        }
    }
}

/// Attributes whose loss would change what the data means, so failing to copy one fails the
/// copy: the user, trusted and security namespaces (SELinux labels, file capabilities, IMA)
/// and POSIX ACLs. Anything else (`system.nfs4_acl`, `btrfs.compression`, …) is
/// filesystem-specific and copied where the destination takes it.
fn must_keep(attr: &OsStr) -> bool {
    let name = attr.as_bytes();
    [b"user.".as_slice(), b"trusted.", b"security."]
        .iter()
        .any(|prefix| name.starts_with(prefix))
        || name == b"system.posix_acl_access"
        || name == b"system.posix_acl_default"
}

/// Copies every extended attribute of `src` to `dst`; returns the names of optional ones the
/// destination refused. `shown` names the source in errors.
fn copy_xattrs(src: &Node<'_>, dst: &Node<'_>, shown: &Path) -> Result<Vec<OsString>, CopyError> {
    let names = match src.list() {
        Ok(names) => names,
        // A fifo's or symlink's name, gone since it was looked at and copied: the copy keeps
        // what that look saw.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(PathIoError::at("list attributes of", shown)(e).into()),
    };
    let mut refused = Vec::new();
    for name in names {
        let xattr_error = |source| CopyError::Xattr {
            path: shown.to_owned(),
            name: name.clone(),
            source,
        };
        // None: removed since the listing; the copy reflects a moment after that.
        let value = match src.get(&name) {
            Ok(Some(value)) => value,
            Ok(None) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(refused),
            Err(e) => return Err(xattr_error(e)),
        };
        match dst.set(&name, &value) {
            Ok(()) => {}
            Err(_) if !must_keep(&name) => refused.push(name),
            Err(e) => return Err(xattr_error(e)),
        }
    }
    Ok(refused)
}

fn time(t: (i64, u32)) -> TimeSpec {
    TimeSpec::new(t.0, i64::from(t.1))
}

/// Gives `dst` the owner, attributes, mode and times `stat` describes (attributes read from
/// `src`). Returns the optional attributes that could not be kept. `shown` names the entry in
/// errors; `dst_shown` the destination.
pub fn apply(
    src: &Node<'_>,
    dst: &Node<'_>,
    stat: &Stat,
    shown: &Path,
    dst_shown: &Path,
) -> Result<Vec<OsString>, CopyError> {
    let owner = (Some(Uid::from_raw(stat.uid)), Some(Gid::from_raw(stat.gid)));
    let symlink = stat.kind() == nix::libc::S_IFLNK;
    let mode = Mode::from_bits_truncate(stat.perm());
    let (atime, mtime) = (time(stat.atime), time(stat.mtime));
    match dst {
        Node::Open(file) => fchown(file.as_fd(), owner.0, owner.1),
        Node::Entry { dir, name } => {
            fchownat(*dir, *name, owner.0, owner.1, AtFlags::AT_SYMLINK_NOFOLLOW)
        }
    }
    .map_err(PathIoError::errno_at("chown", dst_shown))?;
    let refused = copy_xattrs(src, dst, shown)?;
    match dst {
        Node::Open(file) => {
            fchmod(file.as_fd(), mode).map_err(PathIoError::errno_at("chmod", dst_shown))?;
            futimens(file.as_fd(), &atime, &mtime)
                .map_err(PathIoError::errno_at("set times of", dst_shown))?;
        }
        Node::Entry { dir, name } => {
            // Symlinks have no mode of their own on Linux. Anything else here is a node we
            // just made in our private tree, so following the (non-)link is safe.
            if !symlink {
                fchmodat(*dir, *name, mode, FchmodatFlags::FollowSymlink)
                    .map_err(PathIoError::errno_at("chmod", dst_shown))?;
            }
            utimensat(*dir, *name, &atime, &mtime, UtimensatFlags::NoFollowSymlink)
                .map_err(PathIoError::errno_at("set times of", dst_shown))?;
        }
    }
    Ok(refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_that_carry_meaning_must_be_kept_and_filesystem_specific_ones_may_go() {
        for name in [
            "user.a",
            "trusted.overlay.opaque",
            "security.capability",
            "security.selinux",
        ] {
            assert!(must_keep(OsStr::new(name)), "{name}");
        }
        for name in ["system.posix_acl_access", "system.posix_acl_default"] {
            assert!(must_keep(OsStr::new(name)), "{name}");
        }
        for name in [
            "system.nfs4_acl",
            "btrfs.compression",
            "system.posix_acl_accessx",
            "user",
        ] {
            assert!(!must_keep(OsStr::new(name)), "{name}");
        }
    }
}
