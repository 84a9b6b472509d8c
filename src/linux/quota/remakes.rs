//! What the quota check's walk keeps while it makes the symlinks, FIFOs, sockets and device
//! nodes of escaped directories again ([`Aside::remake`]): where, which directories, what it
//! made already (so a walk cut short, or one that met churn, is finished by the next without
//! doing twice what it did), and the inode limit lifted when it stands in the way.
//!
//! Such an inode in a directory that is in the project may still be out of it: its pod moved
//! the directory out, made it, and moved the directory back before a walk came. XFS tells its
//! project ([`xfs_bulkstat`]); ext4 tells nothing, so there each is asked once by a hard link
//! ([`Aside::probe`]), when it is new: its ctime is after the start of the last whole walk
//! (its project cannot change after it is made, short of a rename, which sets the ctime too).

use std::ffi::OsStr;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;

use nix::sys::stat::FileStat;

use super::escape::Tally;
use super::remake::{Aside, Probe};
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
    /// Where the filesystem does not tell a special inode's project: the ctime (in seconds)
    /// from which such an inode is new to the walks and asked ([`Aside::probe`]); none before
    /// the first whole walk, which asks them all.
    since: Option<i64>,
    /// Those asked since `since`, by the ctime the probe left them with (which is after
    /// `since`) and inode ([`probed_key`]): not asked again.
    probed: SortedSet,
}

/// How far before a whole walk's start its successor still asks: ctime is the coarse clock,
/// and in whole seconds on an ext4 with 128-byte inodes.
const CTIME_SLACK_SECS: i64 = 2;

/// A set of keys kept as a sorted vector: what a walk leaves pending needs no tree or hash
/// table code of its own in the binary, which is held to 5.5 MB.
#[derive(Default)]
pub struct SortedSet(Vec<u128>);

/// Counts only: printing 128-bit keys would bring their formatting code into the binary.
impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (dirs, made, probed) = (self.dirs.0.len(), self.made.0.len(), self.probed.0.len());
        write!(
            f,
            "Pending {{ {dirs} directories, {made} made, {probed} probed }}"
        )
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

impl Pending {
    /// Nothing to keep for the next walk: no walk has been whole yet, and none left anything.
    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty()
            && self.made.is_empty()
            && self.since.is_none()
            && self.probed.is_empty()
    }
}

/// An inode's key among those made again or asked: its number, and its ctime in
/// nanoseconds as the low 64 bits.
fn made_key(stat: &FileStat) -> u128 {
    let ns = stat.st_ctime as u64 * 1_000_000_000 + stat.st_ctime_nsec as u64;
    u128::from(stat.st_ino) << 64 | u128::from(ns)
}

/// An inode's key among those asked: its ctime in nanoseconds as the high 64 bits, its
/// number as the low. A walk asks in the order of time, so each key goes at (or near) the end.
fn probed_key(stat: &FileStat) -> u128 {
    u128::from(made_key(stat) as u64) << 64 | u128::from(stat.st_ino)
}

/// The walk's state for [`Remakes`].
pub(super) struct Remaking<'a, 'b> {
    how: &'b mut Remakes<'a>,
    aside: Option<Aside>,
    lifted: bool,
    /// How a special inode's project is learnt here; unknown until first asked.
    tells: Option<Tells>,
    /// Entries not made again so far in this walk.
    left: u64,
    /// When this walk began (seconds of the realtime clock).
    started: i64,
}

/// How a special inode's project is learnt on a filesystem.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tells {
    /// XFS: read by its number ([`xfs_bulkstat`]).
    Bulkstat,
    /// Not an XFS: asked by a hard link ([`Aside::probe`]). Not on XFS, which lets a special
    /// inode of project 0 be linked into any project (so that such inodes, which quota
    /// set-up tools skip, can still be linked).
    Link,
    /// Nothing tells it (XFS without CAP_SYS_ADMIN).
    Nothing,
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
            started: nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME)
                .map_or(0, |now| now.tv_sec()),
        }
    }

    /// A symlink, FIFO, socket or device node of a directory that did not escape: made again
    /// if it is out of project `want` (its pod moved the directory out, made it, and moved the
    /// directory back before a walk saw it): an escape, found. Whether it was made again.
    pub(super) fn remake_if_out(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        stat: &FileStat,
        want: u32,
        owner: u32,
        tally: &mut Tally,
    ) -> bool {
        let told = matches!(self.tells, None | Some(Tells::Bulkstat))
            .then(|| xfs_bulkstat::project_of(dir, stat.st_ino));
        if self.tells.is_none() {
            self.tells = match told
                .as_ref()
                .map(|told| told.as_ref().map_err(|e| e.raw_os_error()))
            {
                Some(Ok(_)) => Some(Tells::Bulkstat),
                // Gone: churn; the next entry asks.
                Some(Err(Some(libc::ENOENT))) => None,
                Some(Err(Some(libc::ENOTTY))) => Some(Tells::Link),
                _ => Some(Tells::Nothing),
            };
        }
        let project = match (self.tells, told) {
            (Some(Tells::Bulkstat), Some(Ok(project))) => Some(project),
            (Some(Tells::Link), _) => None,
            _ => return false,
        };
        match project {
            Some(project) if project == want => return false,
            Some(project) => tally.name_project(project),
            None if !self.is_new(stat) => return false,
            None => match self.probe(dir, name, stat, want, tally) {
                Some(Probe::Out) => {}
                Some(Probe::In(now)) => {
                    self.how.pending.probed.insert(probed_key(&now));
                    return false;
                }
                Some(Probe::Gone) | None => return false,
            },
        }
        tally.other_project += 1;
        let remade = self.remake(dir, name, stat, want, owner, tally);
        if remade {
            tally.repaired += 1;
        } else {
            tally.unrepaired += 1;
        }
        remade
    }

    /// Whether a special inode whose project nothing tells is to be asked: made (or moved)
    /// since the last whole walk began, and not asked since.
    fn is_new(&self, stat: &FileStat) -> bool {
        let pending = &self.how.pending;
        pending.since.is_none_or(|since| stat.st_ctime >= since)
            && !pending.probed.contains(probed_key(stat))
    }

    /// [`Aside::probe`] of one entry; `None` (noted) if it could not be asked.
    fn probe(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        stat: &FileStat,
        want: u32,
        tally: &mut Tally,
    ) -> Option<Probe> {
        let aside = self.open_aside(want, tally)?;
        match aside.probe(dir, name, stat) {
            Ok(Probe::Gone) => {
                tally.skipped += 1;
                Some(Probe::Gone)
            }
            Ok(probe) => Some(probe),
            Err(e) => {
                let name = name.to_string_lossy();
                tally.unreached(|| format!("tell the project of {name}: {e}"));
                None
            }
        }
    }

    /// The private directory, made when first needed; `None` (noted) if it cannot be.
    fn open_aside(&mut self, want: u32, tally: &mut Tally) -> Option<&Aside> {
        if self.aside.is_none() {
            match Aside::open(self.how.aside, want) {
                Ok(aside) => self.aside = Some(aside),
                Err(e) => {
                    tally.unreached(|| format!("make {}: {e}", aside_name(self)));
                    return None;
                }
            }
        }
        self.aside.as_ref()
    }

    /// The end of a walk: the directories it did not finish (stopped, or lost on the way up)
    /// stay pending; once none is, what was made is forgotten.
    /// A `whole` walk went everywhere: the entries made since it began are the next walk's
    /// to ask.
    pub(super) fn finish(&mut self, unfinished: Vec<Mark>, whole: bool) {
        for left in unfinished {
            self.done(left, false);
        }
        let pending = &mut self.how.pending;
        if pending.dirs.is_empty() {
            pending.made = SortedSet::default();
        }
        if whole {
            // Those asked before the new `since` are no longer new anyway.
            let since = self.started - CTIME_SLACK_SECS;
            pending.since = Some(since);
            let from = u128::from(since.max(0) as u64 * 1_000_000_000) << 64;
            let old = pending.probed.0.partition_point(|key| *key < from);
            pending.probed.0 = pending.probed.0.split_off(old);
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
        if self.open_aside(want, tally).is_none() {
            return false;
        }
        let Some(aside) = &self.aside else {
            return false;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn special(ino: u64, ctime: i64) -> FileStat {
        // SAFETY: `stat` is plain data; all zeroes is a valid value.
        let mut stat: FileStat = unsafe { std::mem::zeroed() };
        stat.st_ino = ino;
        stat.st_ctime = ctime;
        stat
    }

    #[test]
    fn a_special_inode_is_asked_once_new_and_not_again_after_whole_walks_until_it_changes() {
        let lift = || false;
        let mut how = Remakes {
            aside: Path::new("/nonexistent"),
            lift: &lift,
            pending: Pending::default(),
        };
        let old = special(1, 1_000);
        // The first walk asks every one: nothing is known yet.
        let mut first = Remaking::new(&mut how);
        assert!(first.is_new(&old));
        first.started = 2_000;
        // Asked: the probe left it with a ctime during this walk.
        let asked = special(1, 2_001);
        first.how.pending.probed.insert(probed_key(&asked));
        first.finish(Vec::new(), true);
        drop(first);
        assert_eq!(how.pending.since, Some(2_000 - CTIME_SLACK_SECS));
        assert!(!how.pending.is_empty(), "kept for the next walk");

        // The next walk, within the slack: the asked one is known by its key.
        let mut second = Remaking::new(&mut how);
        assert!(!second.is_new(&asked), "asked once");
        assert!(
            !second.is_new(&special(2, 1_500)),
            "older than the last whole walk"
        );
        assert!(second.is_new(&special(3, 2_500)), "made since");
        assert!(
            second.is_new(&special(1, 2_600)),
            "changed since it was asked"
        );
        second.started = 2_003;
        second.finish(Vec::new(), true);
        drop(second);
        assert!(
            how.pending.probed.contains(probed_key(&asked)),
            "still within the slack"
        );

        // A walk cut short keeps what is known; a later whole one forgets what is old.
        let mut cut = Remaking::new(&mut how);
        cut.started = 2_010;
        cut.finish(Vec::new(), false);
        drop(cut);
        assert_eq!(how.pending.since, Some(2_003 - CTIME_SLACK_SECS));
        let mut whole = Remaking::new(&mut how);
        whole.started = 2_020;
        whole.finish(Vec::new(), true);
        drop(whole);
        assert!(how.pending.probed.is_empty(), "{:?}", how.pending);
        assert!(!Remaking::new(&mut how).is_new(&asked));
    }
}
