//! The walk: depth-first with an explicit stack (a deep tree cannot overflow ours), each
//! level holding its source and destination directories open, every entry reached relative to
//! them. A directory gets its owner, mode and times after its contents, so creating them does
//! not disturb its mtime.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::AsFd;
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
use super::{MAX_DEPTH, Options, Report, SkipReason, Skipped};
use crate::path_io::PathIoError;

/// How often an entry that changes type under its name is looked at again.
const RETRIES: usize = 3;

/// One directory level being copied.
struct Frame {
    src: File,
    dst: File,
    /// Relative to the roots.
    rel: PathBuf,
    /// Still to copy, popped from the end.
    names: Vec<OsString>,
    stat: Stat,
}

/// What became of one attempt at an entry.
enum Step {
    Done,
    Descend(Frame),
    /// It changed under its name; look again.
    Again,
}

pub struct Walker<'a> {
    data: Engine,
    report: Report,
    /// Inodes with more than one link, by (dev, ino) → where the first one went (relative).
    links: HashMap<(u64, u64), PathBuf>,
    root: Stat,
    src_root: &'a Path,
    dst_root: PathBuf,
    dst_root_fd: File,
    /// The copy's own root, never copied into itself when the destination is inside the source.
    dst_root_inode: (u64, u64),
}

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
        let mut stack = vec![Frame {
            src,
            dst,
            rel: PathBuf::new(),
            names: names.into_iter().rev().collect(),
            stat: self.root,
        }];
        while let Some(top) = stack.last_mut() {
            let Some(name) = top.names.pop() else {
                let done = stack.pop().expect("the loop saw a last frame");
                self.finish_dir(&done)?;
                continue;
            };
            if let Some(child) = self.entry(top, &name)? {
                stack.push(child);
            }
        }
        Ok(self.report)
    }

    fn entry(&mut self, parent: &Frame, name: &OsStr) -> Result<Option<Frame>, CopyError> {
        let rel = parent.rel.join(name);
        for _ in 0..RETRIES {
            let stat = match statx(parent.src.as_fd(), name) {
                Ok(stat) => stat,
                Err(Errno::ENOENT) => {
                    self.report.vanished += 1;
                    return Ok(None);
                }
                Err(e) => {
                    return Err(PathIoError::errno_at("stat", &self.src_root.join(&rel))(e).into());
                }
            };
            if !stat.same_mount(&self.root) {
                self.skip(rel, SkipReason::MountPoint);
                return Ok(None);
            }
            let step = match stat.kind() {
                libc::S_IFDIR => self.dir(parent, name, &rel)?,
                libc::S_IFREG => self.regular(parent, name, &rel)?,
                libc::S_IFSOCK => {
                    // A socket is an endpoint of a process that is not in the copy.
                    self.skip(rel, SkipReason::Socket);
                    return Ok(None);
                }
                _ if self.linked(parent, name, &rel, &stat)? => Step::Done,
                libc::S_IFLNK => self.symlink(parent, name, &rel, &stat)?,
                _ => self.special(parent, name, &rel, &stat)?,
            };
            match step {
                Step::Done => return Ok(None),
                Step::Descend(frame) => return Ok(Some(frame)),
                Step::Again => continue,
            }
        }
        // A live tree's owner may churn a name (symlink, fifo, file) faster than we look: what
        // is not there in one piece is left out, as a vanished entry is, and said.
        self.skip(rel, SkipReason::Changing);
        Ok(None)
    }

    fn skip(&mut self, path: PathBuf, reason: SkipReason) {
        self.report.skipped.push(Skipped { path, reason });
    }

    fn dst_path(&self, rel: &Path) -> PathBuf {
        self.dst_root.join(rel)
    }

    fn dir(&mut self, parent: &Frame, name: &OsStr, rel: &Path) -> Result<Step, CopyError> {
        let src_path = self.src_root.join(rel);
        // The stack holds the root and one frame per component of `rel`.
        if rel.components().count() >= MAX_DEPTH {
            return Err(CopyError::TooDeep {
                path: src_path,
                max: MAX_DEPTH,
            });
        }
        let src = match open_dir(parent.src.as_fd(), name) {
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
        let dst_path = self.dst_path(rel);
        mkdirat(parent.dst.as_fd(), name, Mode::S_IRWXU)
            .map_err(PathIoError::errno_at("create", &dst_path))?;
        let dst = File::from(
            open_dir(parent.dst.as_fd(), name).map_err(PathIoError::errno_at("open", &dst_path))?,
        );
        Ok(Step::Descend(Frame {
            src,
            dst,
            rel: rel.to_owned(),
            names: names.into_iter().rev().collect(),
            stat,
        }))
    }

    fn finish_dir(&mut self, frame: &Frame) -> Result<(), CopyError> {
        let (src, dst) = (self.src_root.join(&frame.rel), self.dst_path(&frame.rel));
        let refused = meta::apply(
            &Node::Open(&frame.src),
            &Node::Open(&frame.dst),
            &frame.stat,
            &src,
            &dst,
        )?;
        self.refused(&frame.rel, refused);
        self.report.directories += 1;
        Ok(())
    }

    fn refused(&mut self, rel: &Path, names: Vec<OsString>) {
        for name in names {
            self.skip(rel.to_owned(), SkipReason::Xattr(name));
        }
    }

    fn regular(&mut self, parent: &Frame, name: &OsStr, rel: &Path) -> Result<Step, CopyError> {
        let src_path = self.src_root.join(rel);
        let (src, stat) = match open_regular(parent.src.as_fd(), name) {
            Ok(Some(opened)) => opened,
            Ok(None) | Err(Errno::ENOENT | Errno::ELOOP) => return Ok(Step::Again),
            Err(e) => return Err(PathIoError::errno_at("open", &src_path)(e).into()),
        };
        if !stat.same_mount(&self.root) {
            return Ok(Step::Again);
        }
        if self.linked(parent, name, rel, &stat)? {
            return Ok(Step::Done);
        }
        let dst_path = self.dst_path(rel);
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let dst = openat(
            parent.dst.as_fd(),
            name,
            flags,
            Mode::S_IRUSR | Mode::S_IWUSR,
        )
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
        self.refused(rel, refused);
        let report = &mut self.report;
        report.files += 1;
        report.bytes += stat.size;
        report.bytes_reflinked += copied.reflinked;
        report.bytes_written += copied.written;
        report.bytes_allocated += stat.blocks.saturating_mul(512);
        report.files_reflinked += u64::from(copied.reflinked > 0);
        self.remember(&stat, rel);
        Ok(Step::Done)
    }

    /// Links `name` to the copy of its inode if one was made already.
    fn linked(
        &mut self,
        parent: &Frame,
        name: &OsStr,
        rel: &Path,
        stat: &Stat,
    ) -> Result<bool, CopyError> {
        if stat.nlink < 2 {
            return Ok(false);
        }
        let Some(first) = self.links.get(&stat.inode()) else {
            return Ok(false);
        };
        linkat(
            self.dst_root_fd.as_fd(),
            first,
            parent.dst.as_fd(),
            name,
            AtFlags::empty(),
        )
        .map_err(PathIoError::errno_at("link", &self.dst_path(rel)))?;
        self.report.hard_links += 1;
        Ok(true)
    }

    fn remember(&mut self, stat: &Stat, rel: &Path) {
        if stat.nlink > 1 {
            self.links.insert(stat.inode(), rel.to_owned());
        }
    }

    fn symlink(
        &mut self,
        parent: &Frame,
        name: &OsStr,
        rel: &Path,
        stat: &Stat,
    ) -> Result<Step, CopyError> {
        let target = match readlinkat(parent.src.as_fd(), name) {
            Ok(target) => target,
            // No longer a symlink (EINVAL) or gone.
            Err(Errno::EINVAL | Errno::ENOENT) => return Ok(Step::Again),
            Err(e) => {
                return Err(PathIoError::errno_at("read link", &self.src_root.join(rel))(e).into());
            }
        };
        symlinkat(target.as_os_str(), parent.dst.as_fd(), name)
            .map_err(PathIoError::errno_at("create", &self.dst_path(rel)))?;
        self.entry_meta(parent, name, rel, stat)?;
        self.report.symlinks += 1;
        Ok(Step::Done)
    }

    /// Fifos and device nodes, made anew with `mknod`, never opened.
    fn special(
        &mut self,
        parent: &Frame,
        name: &OsStr,
        rel: &Path,
        stat: &Stat,
    ) -> Result<Step, CopyError> {
        let kind = SFlag::from_bits_truncate(stat.kind());
        mknodat(
            parent.dst.as_fd(),
            name,
            kind,
            Mode::S_IRUSR | Mode::S_IWUSR,
            stat.rdev,
        )
        .map_err(PathIoError::errno_at("create", &self.dst_path(rel)))?;
        self.entry_meta(parent, name, rel, stat)?;
        self.report.special_files += 1;
        Ok(Step::Done)
    }

    fn entry_meta(
        &mut self,
        parent: &Frame,
        name: &OsStr,
        rel: &Path,
        stat: &Stat,
    ) -> Result<(), CopyError> {
        let src = Node::Entry {
            dir: parent.src.as_fd(),
            name,
        };
        let dst = Node::Entry {
            dir: parent.dst.as_fd(),
            name,
        };
        let refused = meta::apply(
            &src,
            &dst,
            stat,
            &self.src_root.join(rel),
            &self.dst_path(rel),
        )?;
        self.refused(rel, refused);
        self.remember(stat, rel);
        Ok(())
    }
}
