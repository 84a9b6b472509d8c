//! The stack of directory levels a depth-first walk keeps, holding at most [`WINDOW`] levels
//! open. A pod can nest 100,000 directories (65,533 on ext4); a walk that held a descriptor per
//! level would run out of descriptors, and one that stopped at a depth would leave the rest
//! uncopied, undeleted or unchecked. Levels more than [`WINDOW`] above the one being walked are
//! closed, and reopened on the way back up through the child's `..`, checked by device and
//! inode: a directory moved meanwhile is never taken for the one that was left.
//!
//! Ordinary trees (less than [`WINDOW`] deep) never close a level, so they cost nothing more.
//! Positions are kept as names, not paths, and a path for a message is shortened
//! ([`DirStack::shown`]), so a deep tree costs memory in proportion to its depth, not its
//! depth squared.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, fstat};

/// Levels kept open below the one being walked.
pub const WINDOW: usize = 48;

/// Components shown at each end of a shortened path.
const SHOWN_ENDS: usize = 6;

/// One level of a walk: what the walker keeps, and the directories it holds open (one for a
/// removal or a check, a source and a destination for a copy).
pub trait Level {
    /// Its name in the level above (empty for the root).
    fn name(&self) -> &OsStr;
    /// Closes its directories; [`Level::reopen`] opens them again.
    fn close(&mut self);
    fn is_open(&self) -> bool;
    /// Opens its directories again through `child`'s `..` ([`open_parent`]).
    fn reopen(&mut self, child: &Self) -> Result<(), Errno>;
}

/// A directory's identity, to know it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirId {
    pub dev: u64,
    pub ino: u64,
}

impl DirId {
    pub fn of(dir: BorrowedFd<'_>) -> Result<Self, Errno> {
        let stat = fstat(dir)?;
        Ok(Self {
            dev: stat.st_dev,
            ino: stat.st_ino,
        })
    }
}

/// `child`'s parent directory, opened through `..`, if it is still `expected`; `ESTALE` if the
/// child was moved elsewhere meanwhile.
pub fn open_parent(child: BorrowedFd<'_>, expected: DirId) -> Result<OwnedFd, Errno> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let parent = openat(child, "..", flags, Mode::empty())?;
    if DirId::of(parent.as_fd())? != expected {
        return Err(Errno::ESTALE);
    }
    Ok(parent)
}

/// The levels of a walk, root first.
pub struct DirStack<L: Level> {
    levels: Vec<L>,
}

impl<L: Level> DirStack<L> {
    pub fn new(root: L) -> Self {
        Self { levels: vec![root] }
    }

    pub fn len(&self) -> usize {
        self.levels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.levels.is_empty()
    }

    pub fn last(&self) -> Option<&L> {
        self.levels.last()
    }

    pub fn last_mut(&mut self) -> Option<&mut L> {
        self.levels.last_mut()
    }

    /// The levels, root first.
    pub fn levels(&self) -> &[L] {
        &self.levels
    }

    /// Enters `level`, closing the one [`WINDOW`] levels above it.
    pub fn push(&mut self, level: L) {
        self.levels.push(level);
        if let Some(far) = self.levels.len().checked_sub(WINDOW + 2) {
            self.levels[far].close();
        }
    }

    /// Leaves the deepest level and returns it (still open), having reopened the level it
    /// returns to if that was closed. The error is [`open_parent`]'s: the level returned to
    /// cannot be reached any more, and the walk must end or start again.
    pub fn pop(&mut self) -> Result<Option<L>, Errno> {
        let Some(done) = self.levels.pop() else {
            return Ok(None);
        };
        if let Some(up) = self.levels.last_mut()
            && !up.is_open()
        {
            up.reopen(&done)?;
        }
        Ok(Some(done))
    }

    /// The path of `name` inside the deepest level, below `root`: whole for an ordinary tree,
    /// its middle left out (and counted) for a deep one, so a message or a report never holds
    /// a path of a hundred thousand components, and making one costs the same at any depth.
    pub fn shown(&self, root: &Path, name: Option<&OsStr>) -> PathBuf {
        let below = self.levels.get(1..).unwrap_or_default();
        let count = below.len() + usize::from(name.is_some());
        shorten_by(root, count, |i| {
            below
                .get(i)
                .map_or_else(|| name.unwrap_or_default(), Level::name)
        })
    }

    /// Every level, root first, for a walker that numbers them ([`Level`] keeps the rest).
    pub fn levels_mut(&mut self) -> &mut [L] {
        &mut self.levels
    }
}

/// `root` joined with `names`, the middle left out when there are many.
pub fn shorten(root: &Path, names: &[&OsStr]) -> PathBuf {
    shorten_by(root, names.len(), |i| names[i])
}

fn shorten_by<'a>(root: &Path, count: usize, name: impl Fn(usize) -> &'a OsStr) -> PathBuf {
    let mut path = root.to_owned();
    if count <= 2 * SHOWN_ENDS + 1 {
        path.extend((0..count).map(&name));
        return path;
    }
    let left_out = count - 2 * SHOWN_ENDS;
    path.extend((0..SHOWN_ENDS).map(&name));
    path.push(format!("…{left_out} directories…"));
    path.extend((count - SHOWN_ENDS..count).map(&name));
    path
}

/// The simplest level: one directory held open, its identity, and the names still to visit.
pub struct OpenDir {
    pub dir: Option<OwnedFd>,
    pub id: DirId,
    pub name: OsString,
    /// Still to visit, popped from the end.
    pub names: Vec<OsString>,
}

impl OpenDir {
    /// The directory, open: the deepest level always is.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.dir
            .as_ref()
            .expect("the deepest level of a walk is open")
            .as_fd()
    }
}

impl Level for OpenDir {
    fn name(&self) -> &OsStr {
        &self.name
    }

    fn close(&mut self) {
        self.dir = None;
    }

    fn is_open(&self) -> bool {
        self.dir.is_some()
    }

    fn reopen(&mut self, child: &Self) -> Result<(), Errno> {
        self.dir = Some(open_parent(child.fd(), self.id)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(path: &Path) -> OwnedFd {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        nix::fcntl::open(path, flags, Mode::empty()).expect("open")
    }

    fn level(dir: OwnedFd, name: &str) -> OpenDir {
        OpenDir {
            id: DirId::of(dir.as_fd()).expect("fstat"),
            dir: Some(dir),
            name: name.into(),
            names: Vec::new(),
        }
    }

    #[test]
    fn a_walk_deeper_than_the_window_holds_only_the_window_open_and_reopens_on_the_way_up() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let depth = WINDOW * 3;
        let mut path = tmp.path().to_owned();
        let mut stack = DirStack::new(level(open(&path), ""));
        for _ in 0..depth {
            path.push("d");
            std::fs::create_dir(&path).expect("mkdir");
            stack.push(level(open(&path), "d"));
        }
        let open_levels = stack.levels().iter().filter(|l| l.is_open()).count();
        assert_eq!(
            open_levels,
            WINDOW + 1,
            "the deepest level and WINDOW above it"
        );
        while stack.len() > 1 {
            stack.pop().expect("back up");
            assert!(stack.last().expect("a level").is_open());
        }
        let root = stack.last().expect("root");
        assert_eq!(
            DirId::of(root.fd()).expect("fstat"),
            DirId::of(open(tmp.path()).as_fd()).unwrap()
        );
    }

    #[test]
    fn a_level_moved_while_closed_is_not_taken_for_the_one_left() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut path = tmp.path().to_owned();
        let mut stack = DirStack::new(level(open(&path), ""));
        for i in 0..WINDOW + 3 {
            path.push(format!("d{i}"));
            std::fs::create_dir(&path).expect("mkdir");
            stack.push(level(open(&path), &format!("d{i}")));
        }
        // The deepest level's parent is open; the one whose child was moved is not.
        let moved = tmp.path().join("d0/d1");
        std::fs::rename(&moved, tmp.path().join("elsewhere")).expect("rename");
        let mut failed = None;
        while stack.len() > 1 {
            if let Err(e) = stack.pop() {
                failed = Some(e);
                break;
            }
        }
        assert_eq!(failed, Some(Errno::ESTALE));
    }

    #[test]
    fn a_deep_path_is_shown_with_its_middle_counted() {
        let names: Vec<OsString> = (0..1000).map(|i| OsString::from(format!("n{i}"))).collect();
        let refs: Vec<&OsStr> = names.iter().map(OsString::as_os_str).collect();
        let shown = shorten(Path::new("/v"), &refs);
        let text = shown.to_string_lossy();
        assert!(text.starts_with("/v/n0/n1/"), "{text}");
        assert!(text.contains("…988 directories…"), "{text}");
        assert!(text.ends_with("/n999"), "{text}");
        assert_eq!(
            shorten(Path::new("/v"), &refs[..3]),
            Path::new("/v/n0/n1/n2")
        );
    }
}
