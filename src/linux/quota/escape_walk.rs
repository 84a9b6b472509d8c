//! The walk that holds a directory tree to its project: every inode below a root visited, and
//! those whose project ID is not the root's, and the directories without PROJINHERIT, set back
//! ([`escape`](super::escape) says what is wrong with one inode and keeps the tally).
//!
//! The owner of a file may change its project ID with no capability (in the host's user
//! namespace), so a pod can take its files out of its volume's limit; this is how they are put
//! back after the fact. The walk reaches every entry relative to a directory it holds open,
//! never follows a symlink (`O_NOFOLLOW`, `AT_SYMLINK_NOFOLLOW`), never crosses into another
//! filesystem (`st_dev`) and opens a name for the ioctl only once it is known to be a regular
//! file or a directory (a device node's open has side effects). Only those two kinds carry an
//! ID the ioctl can reach: symlinks, device nodes, FIFOs and sockets are made again instead,
//! where they are in a directory found escaped ([`remake`](super::remake)), and elsewhere where
//! their own project is another (read on XFS, [`xfs_bulkstat`](super::xfs_bulkstat); asked by a
//! hard link on ext4). It goes as deep as the tree does, with a bounded number of descriptors ([`DirStack`]).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::ops::ControlFlow;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{FileStat, Mode, fstat, fstatat};

use super::escape::Tally;
use super::remakes::{Mark, Remaking};
pub use super::remakes::{Pending, Remakes, SortedSet};
use crate::linux::dir_stack::{DirId, DirStack, OpenDir};

/// A walk: what it found and did, and what it cost.
#[derive(Debug, Clone)]
pub struct Walk {
    pub tally: Tally,
    pub wall: Duration,
    /// CPU time of the walking thread (user and system).
    pub cpu: Duration,
    /// `tick` asked it to stop before the end.
    pub stopped: bool,
}

/// Checks only `root` itself, and sets it back into project `want` (with PROJINHERIT) if it
/// escaped: one open and one ioctl, cheap enough for every stats call.
pub fn check_root(root: &Path, want: u32) -> io::Result<Tally> {
    visit_root(root, want, None).map(|(_, _, tally)| tally)
}

/// `root` opened (never through a symlink), and itself checked against project `want` and set
/// back: the first inode of a walk, and all of a root check.
fn visit_root(
    root: &Path,
    want: u32,
    fence: Option<u32>,
) -> io::Result<(OwnedFd, FileStat, Tally)> {
    let dir = open_dir_at(nix::fcntl::AT_FDCWD, root.as_os_str())?;
    let stat = fstat(dir.as_fd())?;
    let mut tally = Tally {
        inodes: 1,
        ..Tally::default()
    };
    tally.visit(dir.as_fd(), &stat, true, want, fence);
    Ok((dir, stat, tally))
}

/// Walks `root`'s tree, setting every escaped inode back into project `want` (the root
/// included). `tick` runs after each inode with the tally so far (where the caller paces the
/// walk and stops it: `Break` ends it there). An entry that vanishes under the walk is
/// skipped; only the root failing to open is an error. A directory moved out from under a deep
/// walk (its way back up is gone) ends the walk there, noted. With `fence`, every inode, the
/// root included, is also handed to that owner ([`Tally::visit`]). With `remakes`, the
/// symlinks, FIFOs, sockets and device nodes of every directory found escaped are made again
/// in the project.
pub fn walk(
    root: &Path,
    want: u32,
    fence: Option<u32>,
    remakes: Option<&mut Remakes<'_>>,
    tick: &mut dyn FnMut(&Tally) -> ControlFlow<()>,
) -> io::Result<Walk> {
    let started = Instant::now();
    let cpu_started = thread_cpu();
    let (root_dir, root_stat, mut tally) = visit_root(root, want, fence)?;
    let mut remaking = remakes.map(Remaking::new);
    // Whether each directory on the stack is to have its entries made again: what was made
    // in it while it was out of the project took another project.
    let mark = |remaking: &Option<Remaking<'_, '_>>, ino, found| match remaking {
        Some(remaking) => remaking.mark(ino, found),
        None => Mark::plain(ino),
    };
    let mut marks = vec![mark(&remaking, root_stat.st_ino, tally.found())];
    let mut stopped = tick(&tally).is_break();
    let mut stack = DirStack::new(OpenDir {
        names: names_or_note(root_dir.as_fd(), &mut tally),
        id: DirId {
            dev: root_stat.st_dev,
            ino: root_stat.st_ino,
        },
        dir: Some(root_dir),
        name: OsString::new(),
    });
    while !stopped && let Some(level) = stack.last_mut() {
        let Some(name) = level.names.pop() else {
            if let Err(e) = stack.pop() {
                tally.unreached(|| format!("return to a directory: {e}"));
                break;
            }
            if let (Some(remaking), Some(left)) = (remaking.as_mut(), marks.pop()) {
                remaking.done(left, true);
            }
            continue;
        };
        let dev = root_stat.st_dev;
        let repair = Repair {
            want,
            fence,
            remake_all: marks.last().is_some_and(|m| m.remake),
            remaking: remaking.as_mut(),
        };
        if let Some((below, id, found)) = entry(level.fd(), &name, dev, repair, &mut tally) {
            marks.push(mark(&remaking, id.ino, found));
            let names = names_or_note(below.as_fd(), &mut tally);
            stack.push(OpenDir {
                dir: Some(below),
                id,
                name,
                names,
            });
        }
        stopped = tick(&tally).is_break();
    }
    if let Some(remaking) = remaking.as_mut() {
        remaking.finish(marks, !stopped && tally.unreached == 0);
    }
    Ok(Walk {
        tally,
        wall: started.elapsed(),
        cpu: thread_cpu().saturating_sub(cpu_started),
        stopped,
    })
}

/// What is done to one entry beside checking it.
struct Repair<'r, 'a, 'b> {
    want: u32,
    fence: Option<u32>,
    /// The entry's directory is to have its entries made again.
    remake_all: bool,
    remaking: Option<&'r mut Remaking<'a, 'b>>,
}

/// Visits one entry of `dir`; a directory to descend into comes back open, with its identity
/// and whether it had escaped.
fn entry(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    dev: u64,
    repair: Repair<'_, '_, '_>,
    tally: &mut Tally,
) -> Option<(OwnedFd, DirId, bool)> {
    let Repair {
        want,
        fence,
        remake_all,
        remaking,
    } = repair;
    tally.inodes += 1;
    let stat = match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(Errno::ENOENT) => {
            tally.skipped += 1;
            return None;
        }
        Err(e) => {
            tally.unreached(|| format!("stat {}: {e}", name.to_string_lossy()));
            return None;
        }
    };
    if stat.st_dev != dev {
        // A mount point: what is under it cannot be checked (nor is it this project's).
        tally.unreached(|| format!("{} is a mount point", name.to_string_lossy()));
        return None;
    }
    let opened = match stat.st_mode & libc::S_IFMT {
        libc::S_IFDIR => open_dir_at(dir, name).map(|fd| (fd, true)),
        libc::S_IFREG => open_regular_at(dir, name).map(|fd| (fd, false)),
        // No descriptor of these reaches the filesystem's ioctl: in an escaped directory they
        // are made again; a fence hands them over by name.
        _ => {
            let owner = fence.unwrap_or(stat.st_uid);
            let remade = remaking.is_some_and(|r| match remake_all {
                true => r.remake(dir, name, &stat, want, owner, tally),
                false => r.remake_if_out(dir, name, &stat, want, owner, tally),
            });
            if let Some(uid) = fence.filter(|_| !remade) {
                tally.hand_over_entry(dir, name, &stat, uid);
            }
            return None;
        }
    };
    let (fd, is_dir) = match opened {
        Ok(opened) => opened,
        // Gone, or swapped for another kind meanwhile: churn, left for the next walk.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOENT | libc::ELOOP | libc::ENOTDIR)
            ) =>
        {
            tally.skipped += 1;
            return None;
        }
        Err(e) => {
            tally.unreached(|| format!("open {}: {e}", name.to_string_lossy()));
            return None;
        }
    };
    // What was opened must be what was looked at: a name swapped meanwhile is left for the
    // next walk.
    match fstat(fd.as_fd()) {
        Ok(now) if now.st_ino == stat.st_ino && now.st_dev == stat.st_dev => {
            let found = tally.visit(fd.as_fd(), &now, is_dir, want, fence);
            let id = DirId {
                dev: now.st_dev,
                ino: now.st_ino,
            };
            is_dir.then_some((fd, id, found))
        }
        _ => {
            tally.skipped += 1;
            None
        }
    }
}

/// A directory's names (without `.` and `..`); a directory that cannot be read is noted and
/// has none.
fn names_or_note(dir: BorrowedFd<'_>, tally: &mut Tally) -> Vec<OsString> {
    crate::linux::copy::read_names(dir).unwrap_or_else(|e| {
        match e {
            Errno::ENOENT => tally.skipped += 1,
            e => tally.unreached(|| format!("read directory: {e}")),
        }
        Vec::new()
    })
}

/// Opens a directory entry as a directory, never through a symlink.
fn open_dir_at<Fd: AsFd>(dir: Fd, name: &OsStr) -> io::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    Ok(openat(dir, name, flags, Mode::empty())?)
}

/// Opens a regular file for the ioctl: first `O_PATH` (which opens nothing), then, once it is
/// known to be a regular file, that very inode again read-only through `/proc/self/fd`, so a
/// device node swapped in under the name is never opened.
fn open_regular_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let path_fd = openat(dir, name, flags, Mode::empty())?;
    reopen_regular(path_fd.as_fd())
}

/// Checks one regular file, known by an `O_PATH` descriptor (a file just written), against
/// project `want` and sets it back, as a walk would (with `fence`, handed over too).
pub fn check_file(path_fd: BorrowedFd<'_>, want: u32, fence: Option<u32>) -> io::Result<Tally> {
    let fd = reopen_regular(path_fd)?;
    let stat = fstat(fd.as_fd())?;
    let mut tally = Tally {
        inodes: 1,
        ..Tally::default()
    };
    tally.visit(fd.as_fd(), &stat, false, want, fence);
    Ok(tally)
}

/// That very inode opened read-only, once it is known to be a regular file (never a device
/// node swapped in under a name).
fn reopen_regular(path_fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let stat = fstat(path_fd)?;
    if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    let path = format!("/proc/self/fd/{}", path_fd.as_raw_fd());
    let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    // O_NOATIME: looking must not touch the pod's atimes (root may always ask for it).
    let fd = match nix::fcntl::open(path.as_str(), flags | OFlag::O_NOATIME, Mode::empty()) {
        Err(Errno::EPERM) => nix::fcntl::open(path.as_str(), flags, Mode::empty()),
        other => other,
    }?;
    Ok(File::from(fd).into())
}

/// The calling thread's CPU time so far.
fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    // The build machines' filesystems may have no project IDs (tmpfs answers ENOTTY): the
    // walk's reach is checked here, what it finds and repairs in the quota VM.
    #[test]
    fn the_walk_counts_every_entry_follows_no_symlink_and_notes_what_it_cannot_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("outside");
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/f"), b"x").unwrap();
        std::fs::write(outside.path().join("o1"), b"x").unwrap();
        std::fs::write(outside.path().join("o2"), b"x").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
        let mut ticks = 0;
        let walk = walk(dir.path(), 0, None, None, &mut |_| {
            ticks += 1;
            ControlFlow::Continue(())
        })
        .expect("walk");
        // root, a, a/b, a/b/f, link: the link's target is not entered.
        assert_eq!(walk.tally.inodes, 5, "{:?}", walk.tally);
        assert_eq!(ticks, 5);
        assert!(!walk.stopped);
    }

    #[test]
    fn a_tick_that_breaks_stops_the_walk_there() {
        let dir = tempfile::tempdir().expect("tempdir");
        for i in 0..10 {
            std::fs::write(dir.path().join(format!("f{i}")), b"x").unwrap();
        }
        let walk = walk(dir.path(), 7, None, None, &mut |t| {
            if t.inodes >= 3 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .expect("walk");
        assert!(walk.stopped);
        assert_eq!(walk.tally.inodes, 3);
    }

    #[test]
    fn a_symlink_as_the_root_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        let err =
            walk(&link, 7, None, None, &mut |_| ControlFlow::Continue(())).expect_err("symlink");
        // O_DIRECTORY | O_NOFOLLOW on a symlink: "not a directory".
        assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR), "{err}");
        assert!(check_root(&link, 7).is_err());
    }
}
