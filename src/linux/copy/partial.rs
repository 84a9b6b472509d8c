//! Temporary names. A copy is built under `.partial-<pid>-<n>-<name>` beside its destination
//! and renamed to `<name>` only once it is complete and on disk, so the final name never
//! shows an incomplete copy, even after a crash. A failed copy removes its partial tree; one
//! left by a crash is removed by [`remove_partials`](super::remove_partials).
//!
//! Removal never follows a symlink (it works through directory descriptors), never descends
//! into another mount, and goes as deep as the tree does ([`DirStack`]).

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::{OFlag, RenameFlags, openat, renameat2};
use nix::sys::stat::{Mode, mkdirat};
use nix::unistd::{UnlinkatFlags, fsync, unlinkat};

use super::copy_error::CopyError;
use super::dir_entries::{open_dir, read_names, statx};
use crate::linux::dir_stack::{DirId, DirStack, OpenDir};
use crate::path_io::PathIoError;

/// What every temporary name starts with.
pub const PREFIX: &str = ".partial-";

/// Temporary names this process is building now: [`remove_partials`](super::remove_partials)
/// leaves them alone, so it is safe to call at any time.
static ACTIVE: Mutex<BTreeSet<OsString>> = Mutex::new(BTreeSet::new());
static NEXT: AtomicU64 = AtomicU64::new(0);

fn active() -> std::sync::MutexGuard<'static, BTreeSet<OsString>> {
    crate::mutex::lock(&ACTIVE)
}

pub fn is_active(name: &OsStr) -> bool {
    active().contains(name)
}

/// A copy under construction; removed on drop unless committed.
pub struct Partial<'a> {
    parent: &'a File,
    parent_path: &'a Path,
    name: OsString,
    committed: bool,
}

impl<'a> Partial<'a> {
    fn reserve(parent: &'a File, parent_path: &'a Path, final_name: &OsStr) -> Self {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let mut name = format!("{PREFIX}{}-{n}-", std::process::id()).into_bytes();
        // NAME_MAX is 255 bytes; the final name only has to be recognisable here.
        let room = 255usize.saturating_sub(name.len());
        name.extend(final_name.as_bytes().iter().take(room));
        let name = OsStr::from_bytes(&name).to_owned();
        active().insert(name.clone());
        Self {
            parent,
            parent_path,
            name,
            committed: false,
        }
    }

    /// A new private (0700) directory under a temporary name, open.
    pub fn dir(
        parent: &'a File,
        parent_path: &'a Path,
        final_name: &OsStr,
    ) -> Result<(Self, File), CopyError> {
        let partial = Self::reserve(parent, parent_path, final_name);
        let path = partial.path();
        mkdirat(parent.as_fd(), partial.name.as_os_str(), Mode::S_IRWXU)
            .map_err(PathIoError::errno_at("create", &path))?;
        let fd = open_dir(parent.as_fd(), &partial.name)
            .map_err(PathIoError::errno_at("open", &path))?;
        Ok((partial, File::from(fd)))
    }

    /// A new private (0600) file under a temporary name, open for writing.
    pub fn file(
        parent: &'a File,
        parent_path: &'a Path,
        final_name: &OsStr,
    ) -> Result<(Self, File), CopyError> {
        let partial = Self::reserve(parent, parent_path, final_name);
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = openat(
            parent.as_fd(),
            partial.name.as_os_str(),
            flags,
            Mode::S_IRUSR | Mode::S_IWUSR,
        )
        .map_err(PathIoError::errno_at("create", &partial.path()))?;
        Ok((partial, File::from(fd)))
    }

    pub fn path(&self) -> PathBuf {
        self.parent_path.join(&self.name)
    }

    /// Renames the finished copy to `final_name`, never over an existing entry, and makes the
    /// rename durable. The caller has made the contents durable first.
    pub fn commit(mut self, final_name: &OsStr) -> Result<(), CopyError> {
        let dst = self.parent_path.join(final_name);
        let parent = self.parent.as_fd();
        match renameat2(
            parent,
            self.name.as_os_str(),
            parent,
            final_name,
            RenameFlags::RENAME_NOREPLACE,
        ) {
            Ok(()) => {}
            Err(Errno::EEXIST) => return Err(CopyError::DestinationExists(dst)),
            Err(e) => return Err(PathIoError::errno_at("rename into place", &dst)(e).into()),
        }
        self.committed = true;
        Ok(fsync(parent).map_err(PathIoError::errno_at("sync", self.parent_path))?)
    }
}

impl Drop for Partial<'_> {
    fn drop(&mut self) {
        if !self.committed
            && let Err(e) = remove_entry(self.parent.as_fd(), &self.name, &self.path())
        {
            log::warn!("leaving an incomplete copy behind: {e}");
        }
        active().remove(&self.name);
    }
}

/// How often a removal starts again from the top after a directory it had closed was moved
/// (only trees deeper than [`WINDOW`](crate::linux::dir_stack::WINDOW) close any).
const RESTARTS: usize = 3;

/// Removes `name` in `parent` and, if it is a directory, everything under it, however deep.
/// Refuses (with nothing under the mount point removed) to cross into another mount.
pub fn remove_entry(parent: BorrowedFd<'_>, name: &OsStr, path: &Path) -> Result<(), CopyError> {
    let mut tries = 0;
    loop {
        match remove_once(parent, name, path) {
            Err(Restart::Moved(e)) if tries < RESTARTS => {
                log::info!("starting the removal of {} again: {e}", path.display());
                tries += 1;
            }
            Err(Restart::Moved(e)) => return Err(e),
            Err(Restart::Failed(e)) => return Err(e),
            Ok(()) => return Ok(()),
        }
    }
}

/// Why one pass of a removal ended early.
enum Restart {
    /// A closed level could not be reopened: something was moved; start again.
    Moved(CopyError),
    Failed(CopyError),
}

impl<E: Into<CopyError>> From<E> for Restart {
    fn from(e: E) -> Self {
        Restart::Failed(e.into())
    }
}

fn remove_once(parent: BorrowedFd<'_>, name: &OsStr, path: &Path) -> Result<(), Restart> {
    let base = statx(parent, OsStr::new("")).map_err(PathIoError::errno_at("stat", path))?;
    let stat = match statx(parent, name) {
        Ok(stat) => stat,
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(PathIoError::errno_at("stat", path)(e).into()),
    };
    if !stat.same_mount(&base) {
        return Err(CopyError::MountPoint(path.to_owned()).into());
    }
    if !stat.is_dir() {
        return Ok(unlink(parent, name, path, UnlinkatFlags::NoRemoveDir)?);
    }
    let mut stack = DirStack::new(open_level(parent, name, path)?);
    while let Some(top) = stack.last_mut() {
        let next = top.names.pop();
        let Some(child) = next else {
            let shown = stack.shown(path, None);
            let done = stack
                .pop()
                .map_err(|e| {
                    Restart::Moved(
                        PathIoError::errno_at("return to the parent of", &shown)(e).into(),
                    )
                })?
                .expect("the loop saw a last level");
            let above = stack.last().map_or(parent, OpenDir::fd);
            drop(done.dir);
            unlink(above, &done.name, &shown, UnlinkatFlags::RemoveDir)?;
            continue;
        };
        let dir = stack.last().expect("a level was just looked at").fd();
        let child_path = || stack.shown(path, Some(&child));
        let stat = match statx(dir, &child) {
            Ok(stat) => stat,
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(PathIoError::errno_at("stat", &child_path())(e).into()),
        };
        if !stat.same_mount(&base) {
            return Err(CopyError::MountPoint(child_path()).into());
        }
        if stat.is_dir() {
            let level = open_level(dir, &child, &child_path())?;
            stack.push(level);
        } else {
            unlink(dir, &child, &child_path(), UnlinkatFlags::NoRemoveDir)?;
        }
    }
    Ok(())
}

fn open_level(parent: BorrowedFd<'_>, name: &OsStr, path: &Path) -> Result<OpenDir, CopyError> {
    let dir = open_dir(parent, name).map_err(PathIoError::errno_at("open", path))?;
    let id = DirId::of(dir.as_fd()).map_err(PathIoError::errno_at("stat", path))?;
    let names = read_names(dir.as_fd()).map_err(PathIoError::errno_at("read directory", path))?;
    Ok(OpenDir {
        dir: Some(dir),
        id,
        name: name.to_owned(),
        names,
    })
}

fn unlink(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    path: &Path,
    how: UnlinkatFlags,
) -> Result<(), CopyError> {
    match unlinkat(dir, name, how) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(PathIoError::errno_at("remove", path)(e).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporary_names_are_marked_unique_registered_and_fit_name_max() {
        let dir = tempfile::tempdir().expect("temp dir");
        let parent = File::open(dir.path()).expect("open");
        let long = OsString::from("v".repeat(255));
        let (a, b) = (
            Partial::reserve(&parent, dir.path(), &long),
            Partial::reserve(&parent, dir.path(), OsStr::new("snap")),
        );
        assert!(a.name.len() <= 255, "{}", a.name.len());
        assert!(a.name.as_bytes().starts_with(PREFIX.as_bytes()));
        assert!(b.name.as_bytes().ends_with(b"-snap"));
        assert_ne!(a.name, b.name);
        assert!(is_active(&a.name) && is_active(&b.name));
        let name = a.name.clone();
        drop(a);
        assert!(!is_active(&name), "dropping a partial unregisters it");
    }
}
