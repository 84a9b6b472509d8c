//! What the quota check's walk keeps while it makes the symlinks, FIFOs, sockets and device
//! nodes of escaped directories again ([`Aside::remake`]): where, which directories, what it
//! made already (so a walk cut short, or one that met churn, is finished by the next without
//! doing twice what it did), and the inode limit lifted when it stands in the way.

use std::ffi::OsStr;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;

use nix::sys::stat::FileStat;

use super::escape::Tally;
use super::remake::Aside;
use super::xfs_bulkstat;

/// Where a walk may make again the symlinks, FIFOs, sockets and device nodes of the directories
/// it finds escaped: without it they are only counted.
pub struct Remakes<'a> {
    /// A path for the private directory they are made in ([`Aside`]): on the volume's
    /// filesystem and mount, outside the volume, in a directory only root reaches. Made when
    /// first needed and removed at the end of the walk.
    pub aside: &'a Path,
    /// Called once the project's inode limit refuses a new inode (XFS holds root to it too,
    /// and answers ENOSPC):
    /// lifts the limit for the rest of the walk (its caller puts the limit back after). False
    /// if it could not.
    pub lift: &'a dyn Fn() -> bool,
    /// What one walk leaves the next.
    pub pending: Pending,
}

/// What a walk leaves the next of its remaking, per volume.
#[derive(Default)]
pub struct Pending {
    /// Directories (by inode) whose entries are to be made again though they are no longer
    /// found escaped: a walk that found one escaped but could not make every entry again (it
    /// changed meanwhile, failed, or the walk was cut short) leaves it here for the next.
    pub dirs: SortedSet,
    /// The entries made again while any directory is pending, by inode and ctime: the next
    /// walks skip them rather than make them again (an inode number the filesystem hands out
    /// again comes with another ctime).
    made: SortedSet,
}

/// A set of keys kept as a sorted vector: what a walk leaves pending needs no tree or hash
/// table code of its own in the binary, which is held to 5.5 MB.
#[derive(Default)]
pub struct SortedSet(Vec<u128>);

/// Counts only: printing 128-bit keys would bring their formatting code into the binary.
impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (dirs, made) = (self.dirs.0.len(), self.made.0.len());
        write!(f, "Pending {{ {dirs} directories, {made} made }}")
    }
}

impl SortedSet {
    pub fn contains(&self, key: u128) -> bool {
        self.0.binary_search(&key).is_ok()
    }

    pub fn insert(&mut self, key: u128) {
        if let Err(at) = self.0.binary_search(&key) {
            self.0.insert(at, key);
        }
    }

    pub fn remove(&mut self, key: u128) {
        if let Ok(at) = self.0.binary_search(&key) {
            self.0.remove(at);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// An inode's key among those made again: its number and ctime.
fn made_key(stat: &FileStat) -> u128 {
    let ns = stat.st_ctime as u64 * 1_000_000_000 + stat.st_ctime_nsec as u64;
    u128::from(stat.st_ino) << 64 | u128::from(ns)
}

/// The walk's state for [`Remakes`].
pub(super) struct Remaking<'a, 'b> {
    how: &'b mut Remakes<'a>,
    aside: Option<Aside>,
    lifted: bool,
    /// Whether the filesystem tells a special inode's project ([`xfs_bulkstat`]); unknown
    /// until first asked.
    tells: Option<bool>,
    /// Entries not made again so far in this walk.
    left: u64,
}

/// What the walk keeps of a directory on its stack for [`Remakes`].
#[derive(Clone, Copy)]
pub(super) struct Mark {
    /// Its entries are to be made again.
    pub(super) remake: bool,
    ino: u64,
    /// [`Remaking::left`] when it was entered.
    left: u64,
}

impl Mark {
    /// A directory whose entries are not made again.
    pub(super) fn plain(ino: u64) -> Self {
        Self {
            remake: false,
            ino,
            left: 0,
        }
    }
}

impl<'a, 'b> Remaking<'a, 'b> {
    pub(super) fn new(how: &'b mut Remakes<'a>) -> Self {
        Self {
            how,
            aside: None,
            lifted: false,
            tells: None,
            left: 0,
        }
    }

    /// A symlink, FIFO, socket or device node of a directory that did not escape: made again
    /// if the filesystem tells its project and that is not `want` (its pod moved the
    /// directory out, made it, and moved the directory back before a walk saw it): an
    /// escape, found. Whether it was made again.
    pub(super) fn remake_if_out(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        stat: &FileStat,
        want: u32,
        owner: u32,
        tally: &mut Tally,
    ) -> bool {
        if self.tells == Some(false) {
            return false;
        }
        let project = match xfs_bulkstat::project_of(dir, stat.st_ino) {
            Ok(project) => project,
            Err(e) => {
                // Not an XFS, or not allowed: asked no more this walk. Gone: churn.
                if e.raw_os_error() != Some(libc::ENOENT) {
                    self.tells = Some(false);
                }
                return false;
            }
        };
        self.tells = Some(true);
        if project == want {
            return false;
        }
        tally.other_project += 1;
        tally.name_project(project);
        let remade = self.remake(dir, name, stat, want, owner, tally);
        if remade {
            tally.repaired += 1;
        } else {
            tally.unrepaired += 1;
        }
        remade
    }

    /// The end of a walk: the directories it did not finish (stopped, or lost on the way up)
    /// stay pending; once none is, what was made is forgotten.
    pub(super) fn finish(&mut self, unfinished: Vec<Mark>) {
        for left in unfinished {
            self.done(left, false);
        }
        let pending = &mut self.how.pending;
        if pending.dirs.is_empty() {
            pending.made = SortedSet::default();
        }
    }
    /// The mark of a directory just entered: to be made again if it was found escaped, or
    /// left so by an earlier walk.
    pub(super) fn mark(&self, ino: u64, found: bool) -> Mark {
        Mark {
            remake: found || self.how.pending.dirs.contains(u128::from(ino)),
            ino,
            left: self.left,
        }
    }

    /// A directory left: still pending if anything below it was not made again.
    pub(super) fn done(&mut self, mark: Mark, whole: bool) {
        if !mark.remake {
            return;
        }
        match whole && self.left == mark.left {
            true => self.how.pending.dirs.remove(u128::from(mark.ino)),
            false => self.how.pending.dirs.insert(u128::from(mark.ino)),
        }
    }

    /// Makes `name` of `dir` again in project `want` (see [`Aside::remake`]), noting it;
    /// whether it was (and so has `owner` now).
    pub(super) fn remake(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        stat: &FileStat,
        want: u32,
        owner: u32,
        tally: &mut Tally,
    ) -> bool {
        if self.how.pending.made.contains(made_key(stat)) {
            return false;
        }
        let aside = match &self.aside {
            Some(aside) => aside,
            None => match Aside::open(self.how.aside, want) {
                Ok(aside) => self.aside.insert(aside),
                Err(e) => {
                    tally.unreached(|| format!("make {}: {e}", aside_name(self)));
                    return false;
                }
            },
        };
        let mut result = aside.remake(dir, name, stat, owner);
        // XFS answers a full project with ENOSPC, ext4 with EDQUOT.
        let full = |e: &io::Error| matches!(e.raw_os_error(), Some(libc::EDQUOT | libc::ENOSPC));
        if matches!(&result, Err(e) if full(e)) && !self.lifted && (self.how.lift)() {
            self.lifted = true;
            result = aside.remake(dir, name, stat, owner);
        }
        tally.again += aside.again.take();
        match result {
            Ok(Some(made)) => {
                tally.remade += 1;
                self.how.pending.made.insert(made_key(&made));
                return true;
            }
            Ok(None) => tally.skipped += 1,
            Err(e) => {
                tally.unreached(|| format!("make {} again: {e}", name.to_string_lossy()));
            }
        }
        self.left += 1;
        false
    }
}

fn aside_name(r: &Remaking<'_, '_>) -> String {
    r.how.aside.display().to_string()
}

impl Drop for Remaking<'_, '_> {
    fn drop(&mut self) {
        if self.aside.take().is_some() {
            // Left only if it keeps something a pod swapped in at the last moment.
            let _ = nix::unistd::unlinkat(
                nix::fcntl::AT_FDCWD,
                self.how.aside,
                nix::unistd::UnlinkatFlags::RemoveDir,
            );
        }
    }
}
