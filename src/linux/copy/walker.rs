//! The walk: depth-first with an explicit stack (a deep tree cannot overflow ours), every entry
//! reached relative to its source and destination directories, which the deepest levels hold
//! open ([`DirStack`]: a tree of any depth is copied with a bounded number of descriptors). A
//! directory gets its owner, mode and times after its contents, so creating them does not
//! disturb its mtime.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, readlinkat};
use nix::libc;
use nix::sys::stat::{Mode, SFlag, mkdirat, mknodat};
use nix::unistd::{linkat, symlinkat};

use super::copy_error::CopyError;
use super::data::Engine;
use super::dir_entries::{Stat, open_dir, open_regular, read_names, statx};
use super::meta::{self, Node};
use super::{Options, Report, SkipReason, Skipped};
use crate::linux::dir_stack::{DirId, DirStack, Level, open_parent};
use crate::path_io::PathIoError;

/// How often an entry that changes type under its name is looked at again.
const RETRIES: usize = 3;

/// One directory level being copied.
struct Frame {
    src: Option<File>,
    dst: Option<File>,
    ids: (DirId, DirId),
    /// Its name in the level above (empty for the root).
    name: OsString,
    /// Still to copy, popped from the end.
    names: Vec<OsString>,
    stat: Stat,
    /// Its number in [`Walker::dirs`], once a hard-linked file in it needs one.
    node: Option<usize>,
}

impl Frame {
    fn src(&self) -> BorrowedFd<'_> {
        self.src
            .as_ref()
            .expect("the deepest level is open")
            .as_fd()
    }

    fn dst(&self) -> BorrowedFd<'_> {
        self.dst
            .as_ref()
            .expect("the deepest level is open")
            .as_fd()
    }
}

impl Level for Frame {
    fn name(&self) -> &OsStr {
        &self.name
    }

    fn close(&mut self) {
        (self.src, self.dst) = (None, None);
    }

    fn is_open(&self) -> bool {
        self.src.is_some()
    }

    fn reopen(&mut self, child: &Self) -> Result<(), Errno> {
        let src = open_parent(child.src(), self.ids.0)?;
        let dst = open_parent(child.dst(), self.ids.1)?;
        (self.src, self.dst) = (Some(src.into()), Some(dst.into()));
        Ok(())
    }
}

type Stack = DirStack<Frame>;

/// What became of one attempt at an entry.
enum Step {
    Done,
    Descend(Box<Frame>),
    /// It changed under its name; look again.
    Again,
}

pub struct Walker<'a> {
    data: Engine,
    report: Report,
    /// Inodes with more than one link, by (dev, ino) → where the first one went: a directory
    /// of [`Self::dirs`] (`None`: the root) and the name in it.
    links: HashMap<(u64, u64), (Option<usize>, OsString)>,
    /// The directories hard-linked files were copied into, as (parent, name): a path of any
    /// depth in memory proportional to the directories, not to their depth times their count.
    dirs: Vec<(Option<usize>, OsString)>,
    root: Stat,
    src_root: &'a Path,
    dst_root: PathBuf,
    dst_root_fd: File,
    /// The copy's own root, never copied into itself when the destination is inside the source.
    dst_root_inode: (u64, u64),
}

/// Paths up to this long are linked in one call from the destination root; longer ones are
/// reached a directory at a time (`PATH_MAX` is 4,096 bytes).
const ONE_CALL_PATH: usize = 3_072;

impl<'a> Walker<'a> {
    pub fn new(
        options: Options,
        src_root: &'a Path,
        root: Stat,
        dst_root: PathBuf,
        dst_root_fd: File,
    ) -> Result<Self, CopyError> {
        let dst_root_inode = statx(dst_root_fd.as_fd(), OsStr::new(""))
            .map_err(PathIoError::errno_at("stat", &dst_root))?
            .inode();
        Ok(Self {
            data: Engine::new(options.reflink),
            report: Report::default(),
            links: HashMap::new(),
            dirs: Vec::new(),
            root,
            src_root,
            dst_root,
            dst_root_fd,
            dst_root_inode,
        })
    }

    /// Copies the tree under `src` into the empty directory `dst` and returns the report.
    pub fn run(mut self, src: File, dst: File) -> Result<Report, CopyError> {
        let names = read_names(src.as_fd())
            .map_err(PathIoError::errno_at("read directory", self.src_root))?;
        let ids = (
            self.id(&src, self.src_root)?,
            self.id(&dst, &self.dst_root)?,
        );
        let mut stack = Stack::new(Frame {
            src: Some(src),
            dst: Some(dst),
            ids,
            name: OsString::new(),
            names: names.into_iter().rev().collect(),
            stat: self.root,
            node: None,
        });
        while let Some(top) = stack.last_mut() {
            let next = top.names.pop();
            let Some(name) = next else {
                let (src, dst) = (self.src_path(&stack, None), self.dst_path(&stack, None));
                let done = stack
                    .pop()
                    .map_err(PathIoError::errno_at("return to the parent of", &src))?
                    .expect("the loop saw a last frame");
                self.finish_dir(&done, &src, &dst)?;
                continue;
            };
            if let Some(child) = self.entry(&mut stack, &name)? {
                stack.push(child);
            }
        }
        Ok(self.report)
    }

    fn id(&self, dir: &File, path: &Path) -> Result<DirId, CopyError> {
        Ok(DirId::of(dir.as_fd()).map_err(PathIoError::errno_at("stat", path))?)
    }

    fn src_path(&self, stack: &Stack, name: Option<&OsStr>) -> PathBuf {
        stack.shown(self.src_root, name)
    }

    fn dst_path(&self, stack: &Stack, name: Option<&OsStr>) -> PathBuf {
        stack.shown(&self.dst_root, name)
    }

    /// Relative to the roots, as a report gives it.
    fn rel(stack: &Stack, name: &OsStr) -> PathBuf {
        stack.shown(Path::new(""), Some(name))
    }

    fn entry(&mut self, stack: &mut Stack, name: &OsStr) -> Result<Option<Frame>, CopyError> {
        for _ in 0..RETRIES {
            let parent = stack.last().expect("an entry has a parent");
            let stat = match statx(parent.src(), name) {
                Ok(stat) => stat,
                Err(Errno::ENOENT) => {
                    self.report.vanished += 1;
                    return Ok(None);
                }
                Err(e) => {
                    return Err(
                        PathIoError::errno_at("stat", &self.src_path(stack, Some(name)))(e).into(),
                    );
                }
            };
            if !stat.same_mount(&self.root) {
                self.skip(Self::rel(stack, name), SkipReason::MountPoint);
                return Ok(None);
            }
            let step = match stat.kind() {
                libc::S_IFDIR => self.dir(stack, name)?,
                libc::S_IFREG => self.regular(stack, name)?,
                libc::S_IFSOCK => {
                    // A socket is an endpoint of a process that is not in the copy.
                    self.skip(Self::rel(stack, name), SkipReason::Socket);
                    return Ok(None);
                }
                _ if self.linked(stack, name, &stat)? => Step::Done,
                libc::S_IFLNK => self.symlink(stack, name, &stat)?,
                _ => self.special(stack, name, &stat)?,
            };
            match step {
                Step::Done => return Ok(None),
                Step::Descend(frame) => return Ok(Some(*frame)),
                Step::Again => continue,
            }
        }
        // A live tree's owner may churn a name (symlink, fifo, file) faster than we look: what
        // is not there in one piece is left out, as a vanished entry is, and said.
        self.skip(Self::rel(stack, name), SkipReason::Changing);
        Ok(None)
    }

    fn skip(&mut self, path: PathBuf, reason: SkipReason) {
        self.report.skipped.push(Skipped { path, reason });
    }

    fn dir(&mut self, stack: &Stack, name: &OsStr) -> Result<Step, CopyError> {
        let parent = stack.last().expect("an entry has a parent");
        let src_path = self.src_path(stack, Some(name));
        let src = match open_dir(parent.src(), name) {
            Ok(fd) => File::from(fd),
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => return Ok(Step::Again),
            Err(e) => return Err(PathIoError::errno_at("open", &src_path)(e).into()),
        };
        let stat =
            statx(src.as_fd(), OsStr::new("")).map_err(PathIoError::errno_at("stat", &src_path))?;
        if !stat.same_mount(&self.root) {
            return Ok(Step::Again);
        }
        if stat.inode() == self.dst_root_inode {
            return Ok(Step::Done);
        }
        let names =
            read_names(src.as_fd()).map_err(PathIoError::errno_at("read directory", &src_path))?;
        let dst_path = self.dst_path(stack, Some(name));
        mkdirat(parent.dst(), name, Mode::S_IRWXU)
            .map_err(PathIoError::errno_at("create", &dst_path))?;
        let dst = File::from(
            open_dir(parent.dst(), name).map_err(PathIoError::errno_at("open", &dst_path))?,
        );
        let ids = (self.id(&src, &src_path)?, self.id(&dst, &dst_path)?);
        Ok(Step::Descend(Box::new(Frame {
            src: Some(src),
            dst: Some(dst),
            ids,
            name: name.to_owned(),
            names: names.into_iter().rev().collect(),
            stat,
            node: None,
        })))
    }

    fn finish_dir(&mut self, frame: &Frame, src: &Path, dst: &Path) -> Result<(), CopyError> {
        let (src_dir, dst_dir) = (frame.src.as_ref(), frame.dst.as_ref());
        let (Some(src_dir), Some(dst_dir)) = (src_dir, dst_dir) else {
            unreachable!("a level is open when it is finished");
        };
        let refused = meta::apply(
            &Node::Open(src_dir),
            &Node::Open(dst_dir),
            &frame.stat,
            src,
            dst,
        )?;
        let rel = src.strip_prefix(self.src_root).unwrap_or(src).to_owned();
        self.refused(&rel, refused);
        self.report.directories += 1;
        Ok(())
    }

    fn refused(&mut self, rel: &Path, names: Vec<OsString>) {
        for name in names {
            self.skip(rel.to_owned(), SkipReason::Xattr(name));
        }
    }

    fn regular(&mut self, stack: &mut Stack, name: &OsStr) -> Result<Step, CopyError> {
        let src_path = self.src_path(stack, Some(name));
        let parent = stack.last().expect("an entry has a parent");
        let (src, stat) = match open_regular(parent.src(), name) {
            Ok(Some(opened)) => opened,
            Ok(None) | Err(Errno::ENOENT | Errno::ELOOP) => return Ok(Step::Again),
            Err(e) => return Err(PathIoError::errno_at("open", &src_path)(e).into()),
        };
        if !stat.same_mount(&self.root) {
            return Ok(Step::Again);
        }
        if self.linked(stack, name, &stat)? {
            return Ok(Step::Done);
        }
        let parent = stack.last().expect("an entry has a parent");
        let dst_path = self.dst_path(stack, Some(name));
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let dst = openat(parent.dst(), name, flags, Mode::S_IRUSR | Mode::S_IWUSR)
            .map_err(PathIoError::errno_at("create", &dst_path))?;
        let dst = File::from(dst);
        let copied = self
            .data
            .copy(&src, &dst, stat.size)
            .map_err(|f| f.on(&src_path))?;
        let refused = meta::apply(
            &Node::Open(&src),
            &Node::Open(&dst),
            &stat,
            &src_path,
            &dst_path,
        )?;
        self.refused(&Self::rel(stack, name), refused);
        let report = &mut self.report;
        report.files += 1;
        report.bytes += stat.size;
        report.bytes_reflinked += copied.reflinked;
        report.bytes_written += copied.written;
        report.bytes_allocated += stat.blocks.saturating_mul(512);
        report.files_reflinked += u64::from(copied.reflinked > 0);
        self.remember(stack, name, &stat);
        Ok(Step::Done)
    }

    /// Links `name` to the copy of its inode if one was made already.
    fn linked(&mut self, stack: &Stack, name: &OsStr, stat: &Stat) -> Result<bool, CopyError> {
        if stat.nlink < 2 {
            return Ok(false);
        }
        let Some((dir, first)) = self.links.get(&stat.inode()) else {
            return Ok(false);
        };
        let parent = stack.last().expect("an entry has a parent");
        let dst_path = self.dst_path(stack, Some(name));
        let names = self.names_of(*dir);
        let joined_len: usize = names.iter().map(|n| n.len() + 1).sum::<usize>() + first.len();
        let linked = if joined_len <= ONE_CALL_PATH {
            let mut from = PathBuf::from_iter(&names);
            from.push(first);
            linkat(
                self.dst_root_fd.as_fd(),
                &from,
                parent.dst(),
                name,
                AtFlags::empty(),
            )
        } else {
            self.open_dst_dir(&names).and_then(|dir| {
                linkat(
                    dir.as_fd(),
                    first.as_os_str(),
                    parent.dst(),
                    name,
                    AtFlags::empty(),
                )
            })
        };
        linked.map_err(PathIoError::errno_at("link", &dst_path))?;
        self.report.hard_links += 1;
        Ok(true)
    }

    /// Notes where a hard-linked inode's first name was copied.
    fn remember(&mut self, stack: &mut Stack, name: &OsStr, stat: &Stat) {
        if stat.nlink > 1 {
            let dir = self.number(stack);
            self.links.insert(stat.inode(), (dir, name.to_owned()));
        }
    }

    /// The deepest level's number in [`Self::dirs`] (numbering its ancestors as needed).
    fn number(&mut self, stack: &mut Stack) -> Option<usize> {
        let levels = stack.levels_mut();
        let mut above = None;
        for level in levels.iter_mut().skip(1) {
            above = Some(*level.node.get_or_insert_with(|| {
                self.dirs.push((above, level.name.clone()));
                self.dirs.len() - 1
            }));
        }
        above
    }

    /// The names from the destination root down to directory `dir`.
    fn names_of(&self, mut dir: Option<usize>) -> Vec<&OsStr> {
        let mut names = Vec::new();
        while let Some(at) = dir {
            let (above, name) = &self.dirs[at];
            names.push(name.as_os_str());
            dir = *above;
        }
        names.reverse();
        names
    }

    /// A destination directory too deep for one path, reached a component at a time (our own
    /// copy: nothing else writes there).
    fn open_dst_dir(&self, names: &[&OsStr]) -> Result<OwnedFd, Errno> {
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let mut dir = openat(self.dst_root_fd.as_fd(), ".", flags, Mode::empty())?;
        for name in names {
            dir = openat(dir.as_fd(), *name, flags, Mode::empty())?;
        }
        Ok(dir)
    }

    fn symlink(&mut self, stack: &mut Stack, name: &OsStr, stat: &Stat) -> Result<Step, CopyError> {
        let parent = stack.last().expect("an entry has a parent");
        let target = match readlinkat(parent.src(), name) {
            Ok(target) => target,
            // No longer a symlink (EINVAL) or gone.
            Err(Errno::EINVAL | Errno::ENOENT) => return Ok(Step::Again),
            Err(e) => {
                return Err(
                    PathIoError::errno_at("read link", &self.src_path(stack, Some(name)))(e).into(),
                );
            }
        };
        symlinkat(target.as_os_str(), parent.dst(), name).map_err(PathIoError::errno_at(
            "create",
            &self.dst_path(stack, Some(name)),
        ))?;
        self.entry_meta(stack, name, stat)?;
        self.report.symlinks += 1;
        Ok(Step::Done)
    }

    /// Fifos and device nodes, made anew with `mknod`, never opened.
    fn special(&mut self, stack: &mut Stack, name: &OsStr, stat: &Stat) -> Result<Step, CopyError> {
        let parent = stack.last().expect("an entry has a parent");
        let kind = SFlag::from_bits_truncate(stat.kind());
        mknodat(
            parent.dst(),
            name,
            kind,
            Mode::S_IRUSR | Mode::S_IWUSR,
            stat.rdev,
        )
        .map_err(PathIoError::errno_at(
            "create",
            &self.dst_path(stack, Some(name)),
        ))?;
        self.entry_meta(stack, name, stat)?;
        self.report.special_files += 1;
        Ok(Step::Done)
    }

    fn entry_meta(
        &mut self,
        stack: &mut Stack,
        name: &OsStr,
        stat: &Stat,
    ) -> Result<(), CopyError> {
        let parent = stack.last().expect("an entry has a parent");
        let src = Node::Entry {
            dir: parent.src(),
            name,
        };
        let dst = Node::Entry {
            dir: parent.dst(),
            name,
        };
        let (src_path, dst_path) = (
            self.src_path(stack, Some(name)),
            self.dst_path(stack, Some(name)),
        );
        let refused = meta::apply(&src, &dst, stat, &src_path, &dst_path)?;
        self.refused(&Self::rel(stack, name), refused);
        self.remember(stack, name, stat);
        Ok(())
    }
}
