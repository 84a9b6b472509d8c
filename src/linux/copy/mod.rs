//! The copy engine behind snapshots, restores and clones: a directory tree or one file copied
//! to a new name, with reflinks where the filesystem shares extents (btrfs, XFS with reflink:
//! near-instant, no extra space) and a sparse-aware copy elsewhere.
//!
//! What a copy keeps: file data and holes, owners (symlinks included), modes with
//! setuid/setgid/sticky, atime and mtime to the nanosecond (directories after their contents,
//! symlinks themselves), symlinks as links, hard links as links, every extended attribute root
//! can read (user, trusted, security, POSIX ACLs), fifos and device nodes. What it leaves out,
//! and says so in the [`Report`]: sockets (endpoints of processes that are not copied) and
//! anything on another mount (a mount point is never copied through). Inode flags (`chattr`)
//! are not copied: an immutable flag would make the copy undeletable.
//!
//! How it stays safe on a tree its owner may change under it: every entry is reached relative
//! to an open directory with `O_NOFOLLOW`, so neither a symlink nor a concurrent rename can
//! lead it out of the tree; a regular file is opened `O_PATH` first and read only once known
//! to be regular (opening a device has side effects). An entry that vanishes mid-copy is
//! counted, not an error: a live tree is copied file by file, so the copy is each file as it
//! was when copied (with reflinks, an instant per file), not one instant for the whole tree.
//!
//! Durability: the copy is built under a temporary name beside the destination
//! ([`partial`]), flushed with one `syncfs` (one journal commit, where an `fsync` per file
//! would commit once per file), renamed into place with `RENAME_NOREPLACE`, and the rename
//! made durable with an `fsync` of the parent. A crash leaves at most a temporary name, which
//! [`remove_partials`] removes; the final name, once there, is complete.
//!
//! Syscalls: `nix` wrappers wherever nix has them; `libc` (through `nix::libc`) for `statx`,
//! which nix does not wrap and which gives the mount ID that tells a bind mount of the same
//! filesystem apart; nix's ioctl macro for `FICLONE`; the `xattr` crate for extended
//! attributes, which nix lacks (it sizes buffers and retries the `ERANGE` race).
//!
//! Files: `walker` (the depth-first walk of a tree copy), `data` (one file's data: reflink,
//! else the data extents), `meta` (owners, attributes, modes, times), `dir_entries` (`statx`
//! and opens relative to a directory, its names), [`partial`] (the temporary name), `usage`
//! (what a tree holds, as a quota charges it), `copy_error` ([`CopyError`]).

mod copy_error;
mod data;
mod dir_entries;
mod meta;
mod partial;
mod usage;
mod walker;

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::unistd::{fsync, syncfs};

use crate::path_io::PathIoError;
pub use copy_error::CopyError;
pub use dir_entries::read_names;
use partial::Partial;
pub use usage::{TreeUsage, tree_usage};

/// How data is copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Share extents with the source where the filesystem can (`FICLONE`, then
    /// `copy_file_range`). False: every byte is read and written, so the copy owns all its
    /// blocks (and costs their space and time).
    pub reflink: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self { reflink: true }
    }
}

/// What a copy did. Counts are of the copy, the root directory included.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Regular files, each inode once.
    pub files: u64,
    pub directories: u64,
    pub symlinks: u64,
    /// Fifos and device nodes.
    pub special_files: u64,
    /// Names linked to an inode copied under another name.
    pub hard_links: u64,
    /// The logical size of the regular files copied.
    pub bytes: u64,
    /// Of `bytes`, those shared with the source by a reflink.
    pub bytes_reflinked: u64,
    /// Data bytes written out (`copy_file_range`, or read and write); holes are not.
    pub bytes_written: u64,
    /// The blocks the source's regular files had allocated, in bytes: what the copy holds
    /// once nothing is shared with the source any more (holes excluded).
    pub bytes_allocated: u64,
    /// Regular files copied by a reflink.
    pub files_reflinked: u64,
    /// Entries listed but gone before they could be copied.
    pub vanished: u64,
    /// What was left out, and why.
    pub skipped: Vec<Skipped>,
}

impl Report {
    /// Entries left out because they vanished or changed type during the walk.
    pub fn churned(&self) -> u64 {
        let changing = self
            .skipped
            .iter()
            .filter(|s| s.reason == SkipReason::Changing);
        self.vanished + changing.count() as u64
    }

    /// Whether any file was copied by a reflink.
    pub fn used_reflinks(&self) -> bool {
        self.files_reflinked > 0
    }
}

/// An entry (relative to the source root) or attribute the copy left out.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Skipped {
    pub path: PathBuf,
    pub reason: SkipReason,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum SkipReason {
    Socket,
    /// Another filesystem or a bind mount is mounted here.
    MountPoint,
    /// A filesystem-specific extended attribute the destination refused.
    Xattr(OsString),
    /// It changed type (or vanished and came back as something else) each time it was looked
    /// at.
    Changing,
}

/// A path's directory and last component (`a` is `./a`); `None` for `/` or `..`.
fn split(path: &Path) -> Option<(&Path, &OsStr)> {
    let name = path.file_name()?;
    let parent = path.parent()?;
    Some((
        if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        },
        name,
    ))
}

/// The destination's parent, open, and its new name; the name must be free.
fn destination(dst: &Path) -> Result<(File, PathBuf, OsString), CopyError> {
    let (parent, name) = split(dst).ok_or_else(|| CopyError::BadDestination(dst.to_owned()))?;
    let dir = File::open(parent).map_err(PathIoError::at("open", parent))?;
    match dir_entries::statx(dir.as_fd(), name) {
        Ok(_) => Err(CopyError::DestinationExists(dst.to_owned())),
        Err(Errno::ENOENT) => Ok((dir, parent.to_owned(), name.to_owned())),
        Err(e) => Err(PathIoError::errno_at("stat", dst)(e).into()),
    }
}

/// The source root of a tree copy, open, with its `statx`.
fn open_source_dir(src: &Path) -> Result<(File, dir_entries::Stat), CopyError> {
    let src_dir = match dir_entries::open_dir(nix::fcntl::AT_FDCWD, src.as_os_str()) {
        Ok(fd) => File::from(fd),
        Err(Errno::ENOTDIR | Errno::ELOOP) => {
            return Err(CopyError::SourceNotADirectory(src.to_owned()));
        }
        Err(e) => return Err(PathIoError::errno_at("open", src)(e).into()),
    };
    let root = dir_entries::statx(src_dir.as_fd(), OsStr::new(""))
        .map_err(PathIoError::errno_at("stat", src))?;
    Ok((src_dir, root))
}

/// Walks `src` into the open directory `dst_dir` (shown as `dst`) and flushes the result.
fn walk_into(
    src: &Path,
    (src_dir, root): (File, dir_entries::Stat),
    dst: PathBuf,
    dst_dir: &File,
    options: Options,
) -> Result<Report, CopyError> {
    let clone = || dst_dir.try_clone().map_err(PathIoError::at("open", &dst));
    let walker = walker::Walker::new(options, src, root, dst.clone(), clone()?)?;
    let report = walker.run(src_dir, clone()?)?;
    syncfs(dst_dir.as_fd()).map_err(PathIoError::errno_at("sync", &dst))?;
    Ok(report)
}

/// Copies the directory tree `src` to the new directory `dst` (which must not exist; its
/// parent must). On success `dst` is complete and durable; on failure it does not exist and
/// the temporary tree is removed.
pub fn copy_tree(src: &Path, dst: &Path, options: Options) -> Result<Report, CopyError> {
    let source = open_source_dir(src)?;
    let (parent, parent_path, name) = destination(dst)?;
    let (partial, dst_dir) = Partial::dir(&parent, &parent_path, &name)?;
    let report = walk_into(src, source, partial.path(), &dst_dir, options)?;
    partial.commit(&name)?;
    Ok(report)
}

/// Copies the contents of the tree `src` into `dst`, an existing empty directory, which takes
/// `src`'s owner, mode, attributes and times as well. For restores and clones into a volume
/// directory prepared by the normal create path, so that whatever that directory passes on
/// (a quota project, a default ACL) reaches every file copied. There is no temporary name: the
/// caller's record is the commit, and on failure the caller removes `dst`. Durable on success.
pub fn copy_tree_into(src: &Path, dst: &Path, options: Options) -> Result<Report, CopyError> {
    let source = open_source_dir(src)?;
    let dst_dir = match dir_entries::open_dir(nix::fcntl::AT_FDCWD, dst.as_os_str()) {
        Ok(fd) => File::from(fd),
        Err(Errno::ENOTDIR | Errno::ELOOP) => {
            return Err(CopyError::BadDestination(dst.to_owned()));
        }
        Err(e) => return Err(PathIoError::errno_at("open", dst)(e).into()),
    };
    let names = dir_entries::read_names(dst_dir.as_fd())
        .map_err(PathIoError::errno_at("read directory", dst))?;
    if !names.is_empty() {
        return Err(CopyError::DestinationNotEmpty(dst.to_owned()));
    }
    walk_into(src, source, dst.to_owned(), &dst_dir, options)
}

/// Copies the regular file `src` to the new file `dst` (which must not exist): data with
/// reflinks or holes kept, owner, mode, times and extended attributes. For block volumes.
pub fn copy_file(src: &Path, dst: &Path, options: Options) -> Result<Report, CopyError> {
    let (src_parent, src_name) =
        split(src).ok_or_else(|| CopyError::SourceNotARegularFile(src.to_owned()))?;
    let src_dir = File::open(src_parent).map_err(PathIoError::at("open", src_parent))?;
    let (src_file, stat) = match dir_entries::open_regular(src_dir.as_fd(), src_name) {
        Ok(Some(opened)) => opened,
        Ok(None) | Err(Errno::ELOOP) => {
            return Err(CopyError::SourceNotARegularFile(src.to_owned()));
        }
        Err(e) => return Err(PathIoError::errno_at("open", src)(e).into()),
    };
    let (parent, parent_path, name) = destination(dst)?;
    let (partial, dst_file) = Partial::file(&parent, &parent_path, &name)?;
    let copied = data::Engine::new(options.reflink)
        .copy(&src_file, &dst_file, stat.size)
        .map_err(|f| f.on(src))?;
    let refused = meta::apply(
        &meta::Node::Open(&src_file),
        &meta::Node::Open(&dst_file),
        &stat,
        src,
        &partial.path(),
    )?;
    fsync(dst_file.as_fd()).map_err(PathIoError::errno_at("sync", &partial.path()))?;
    partial.commit(&name)?;
    Ok(Report {
        files: 1,
        bytes: stat.size,
        bytes_reflinked: copied.reflinked,
        bytes_written: copied.written,
        bytes_allocated: stat.blocks.saturating_mul(512),
        files_reflinked: u64::from(copied.reflinked > 0),
        skipped: refused
            .into_iter()
            .map(|name| Skipped {
                path: PathBuf::new(),
                reason: SkipReason::Xattr(name),
            })
            .collect(),
        ..Report::default()
    })
}

/// Removes what interrupted copies left in `dir` (temporary names), except copies this process
/// is making now; returns the names removed. Meant for start-up and for sweeps of directories
/// copies are made into.
pub fn remove_partials(dir: &Path) -> Result<Vec<OsString>, CopyError> {
    let parent = File::open(dir).map_err(PathIoError::at("open", dir))?;
    let names = dir_entries::read_names(parent.as_fd())
        .map_err(PathIoError::errno_at("read directory", dir))?;
    let mut removed = Vec::new();
    for name in names {
        if name
            .as_encoded_bytes()
            .starts_with(partial::PREFIX.as_bytes())
            && !partial::is_active(&name)
        {
            partial::remove_entry(parent.as_fd(), &name, &dir.join(&name))?;
            removed.push(name);
        }
    }
    Ok(removed)
}

/// The temporary names in `dir` that interrupted copies left (not those of copies this
/// process is making now), for a caller that removes them later.
pub fn partials(dir: &Path) -> Result<Vec<OsString>, CopyError> {
    let parent = File::open(dir).map_err(PathIoError::at("open", dir))?;
    let names = dir_entries::read_names(parent.as_fd())
        .map_err(PathIoError::errno_at("read directory", dir))?;
    Ok(names
        .into_iter()
        .filter(|name| {
            name.as_encoded_bytes()
                .starts_with(partial::PREFIX.as_bytes())
                && !partial::is_active(name)
        })
        .collect())
}

/// Removes `path` and everything under it without following symlinks; refuses to descend into
/// another mount (`CopyError::MountPoint`). For deleting snapshots. A missing path is success.
pub fn remove_tree(path: &Path) -> Result<(), CopyError> {
    let (parent, name) = split(path).ok_or_else(|| CopyError::BadDestination(path.to_owned()))?;
    let dir = File::open(parent).map_err(PathIoError::at("open", parent))?;
    partial::remove_entry(dir.as_fd(), name, path)
}
