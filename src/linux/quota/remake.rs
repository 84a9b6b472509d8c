//! Symlinks, FIFOs, sockets and device nodes of an escaped directory, made again in the
//! volume's project. Before Linux 6.17 no descriptor of such an inode reaches the ioctl that
//! sets a project ID (a symlink cannot be opened; opening a FIFO or a device node acts on it),
//! so one made while its directory was in another project would stay outside every limit —
//! a pod could flood the node with them. A new inode takes its project from the directory it
//! is made in, so each is made anew with the same target or device, owner, mode and times, in
//! a private directory ([`Aside`]) in the volume's project, and exchanged with the old one
//! (`RENAME_EXCHANGE`); the old one, now in the private directory and checked by inode to be
//! the one looked at, is removed there. Nothing of the pod's can be swapped into what is
//! removed: only root reaches the private directory. What is lost is the inode number, ctime
//! and extended attributes (a security label is the new inode's by policy); a process holding
//! the old FIFO or socket open keeps the old one.
//!
//! Whether such an inode is in the project at all is asked the same way where nothing else
//! tells (ext4): [`Aside::probe`] links it into the private directory, which the kernel refuses
//! for an inode of another project.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, RenameFlags, open, readlinkat, renameat2};
use nix::sys::stat::{
    FchmodatFlags, FileStat, Mode, SFlag, UtimensatFlags, fchmodat, fstat, fstatat, mkdirat,
    mknodat, utimensat,
};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchownat, linkat, symlinkat, unlinkat};

use super::escape::{escape, put_back};
use super::sys::{self, FS_XFLAG_PROJINHERIT};

/// A root-only directory on the volume's filesystem and mount, outside the volume, where new
/// inodes are made in the volume's project before they take an old one's place.
pub struct Aside {
    dir: OwnedFd,
    want: u32,
    /// Directories found moved out of the project again while their entries were made again
    /// (their pod took them out after the walk set them back), since last taken.
    pub again: std::cell::Cell<u64>,
    /// Whether the directory has PROJINHERIT now, once set by [`Self::inherit`].
    inheriting: std::cell::Cell<Option<bool>>,
}

/// What [`Aside::probe`] learnt of an inode.
#[derive(Debug)]
pub enum Probe {
    /// In the volume's project; the inode as the probe left it (it changed its ctime).
    In(FileStat),
    /// In another project.
    Out,
    /// Gone, or another inode under its name meanwhile: left for the next walk.
    Gone,
}

impl Aside {
    /// Makes (if missing) and opens `path`, never through a symlink; it must be root's and
    /// reachable by no one else (its parent keeps others out too).
    pub fn open(path: &Path, want: u32) -> io::Result<Self> {
        match mkdirat(nix::fcntl::AT_FDCWD, path, Mode::S_IRWXU) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(e.into()),
        }
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let dir = open(path, flags, Mode::empty())?;
        let stat = fstat(dir.as_fd())?;
        if stat.st_uid != 0 || stat.st_mode & 0o077 != 0 {
            return Err(io::Error::other(format!(
                "{} is not root's alone",
                path.display()
            )));
        }
        Ok(Self {
            dir,
            want,
            again: std::cell::Cell::new(0),
            inheriting: std::cell::Cell::new(None),
        })
    }

    /// Whether `name` of `dir` (looked at as `stat`) is in the volume's project, asked of the
    /// kernel: ext4 and XFS refuse (EXDEV) a hard link into a PROJINHERIT directory to an
    /// inode of another project. The one way to tell a symlink's, FIFO's, socket's or device
    /// node's project on ext4, which no ioctl or syscall reads. The link, made here where
    /// only root reaches, is removed at once; the inode keeps everything but its ctime.
    pub fn probe(&self, dir: BorrowedFd<'_>, name: &OsStr, stat: &FileStat) -> io::Result<Probe> {
        let tmp = OsString::from(format!("probe-{}", stat.st_ino));
        let tmp = tmp.as_os_str();
        self.inherit(true)?;
        // Without AT_SYMLINK_FOLLOW: a symlink is linked itself.
        match linkat(dir, name, self.dir.as_fd(), tmp, AtFlags::empty()) {
            Ok(()) => {}
            Err(Errno::EXDEV) => return Ok(Probe::Out),
            Err(Errno::ENOENT) => return Ok(Probe::Gone),
            Err(e) => return Err(e.into()),
        }
        let linked = fstatat(self.dir.as_fd(), tmp, AtFlags::AT_SYMLINK_NOFOLLOW);
        self.unlink(tmp)?;
        if linked?.st_ino != stat.st_ino {
            return Ok(Probe::Gone);
        }
        match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(now) if now.st_ino == stat.st_ino => Ok(Probe::In(now)),
            Ok(_) | Err(Errno::ENOENT) => Ok(Probe::Gone),
            Err(e) => Err(e.into()),
        }
    }

    /// Its project and, while new inodes are made, PROJINHERIT. Without it while exchanging:
    /// ext4 refuses to move an inode into a PROJINHERIT directory of another project, and the
    /// old inode comes here.
    fn inherit(&self, on: bool) -> io::Result<()> {
        if self.inheriting.get() == Some(on) {
            return Ok(());
        }
        self.inheriting.set(None);
        let fd = self.dir.as_fd();
        let mut attr = sys::get_fsxattr(fd)?;
        attr.projid = self.want;
        attr.xflags = match on {
            true => attr.xflags | FS_XFLAG_PROJINHERIT,
            false => attr.xflags & !FS_XFLAG_PROJINHERIT,
        };
        sys::set_fsxattr(fd, &attr)?;
        self.inheriting.set(Some(on));
        Ok(())
    }

    /// Makes `name` of `dir` (looked at as `stat`, a symlink, FIFO, socket or device node)
    /// again in the volume's project, owned by `owner`; the new inode as it is then.
    /// `Ok(None)`: it changed or went meanwhile, left as it is for the next walk.
    pub fn remake(
        &self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        stat: &FileStat,
        owner: u32,
    ) -> io::Result<Option<FileStat>> {
        if stat.st_nlink != 1 {
            // Made again, its other names would keep the old inode.
            return Err(io::Error::other("hard-linked"));
        }
        let tmp = OsString::from(stat.st_ino.to_string());
        let tmp = tmp.as_os_str();
        self.inherit(true)?;
        let kind = stat.st_mode & libc::S_IFMT;
        let made = match kind {
            libc::S_IFLNK => match readlinkat(dir, name) {
                Ok(target) => symlinkat(target.as_os_str(), self.dir.as_fd(), tmp),
                // No longer a symlink, or gone.
                Err(Errno::EINVAL | Errno::ENOENT) => return Ok(None),
                Err(e) => return Err(e.into()),
            },
            _ => mknodat(
                self.dir.as_fd(),
                tmp,
                SFlag::from_bits_truncate(kind),
                Mode::S_IRUSR,
                stat.st_rdev,
            ),
        };
        made?;
        let ours = fstatat(self.dir.as_fd(), tmp, AtFlags::AT_SYMLINK_NOFOLLOW)?;
        let placed = self.place(dir, name, tmp, stat, owner);
        let left = fstatat(self.dir.as_fd(), tmp, AtFlags::AT_SYMLINK_NOFOLLOW);
        let old =
            matches!(&left, Ok(left) if left.st_ino == stat.st_ino && left.st_dev == stat.st_dev);
        match placed {
            Ok(()) if old => {
                self.unlink(tmp)?;
                // As the exchange left it (it changed its ctime), if still there.
                let now = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
                Ok((now.st_ino == ours.st_ino).then_some(now))
            }
            // Swapped for another entry since it was looked at: given back as it was. Swapped
            // again meanwhile, what came back is not ours: kept here, not removed.
            Ok(()) => {
                if self.exchange(dir, name, tmp) == Err(Errno::EXDEV) {
                    // In another project, which the kernel will not let into the directory:
                    // set into the volume's first, as the walk would (a regular file or a
                    // directory; anything else stays here, and the next start removes it).
                    self.adopt(tmp)?;
                    self.exchange(dir, name, tmp)?;
                }
                let back = fstatat(self.dir.as_fd(), tmp, AtFlags::AT_SYMLINK_NOFOLLOW);
                if matches!(back, Ok(back) if back.st_ino == ours.st_ino) {
                    self.unlink(tmp)?;
                }
                Ok(None)
            }
            // Gone, or its directory moved to another project again: the next walk's.
            Err(Errno::ENOENT | Errno::EXDEV) => {
                self.unlink(tmp)?;
                Ok(None)
            }
            Err(e) => {
                let _ = self.unlink(tmp);
                Err(e.into())
            }
        }
    }

    /// The new inode given `stat`'s owner (or `owner`), mode and times — in the order that
    /// keeps them all, times last — and exchanged with `name`.
    fn place(
        &self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        tmp: &OsStr,
        stat: &FileStat,
        owner: u32,
    ) -> Result<(), Errno> {
        let at = self.dir.as_fd();
        let (uid, gid) = (Uid::from_raw(owner), Gid::from_raw(stat.st_gid));
        fchownat(at, tmp, Some(uid), Some(gid), AtFlags::AT_SYMLINK_NOFOLLOW)?;
        if stat.st_mode & libc::S_IFMT != libc::S_IFLNK {
            // Made here, where only root reaches: it is no symlink.
            let mode = Mode::from_bits_truncate(stat.st_mode & 0o7777);
            fchmodat(at, tmp, mode, FchmodatFlags::FollowSymlink)?;
        }
        let atime = TimeSpec::new(stat.st_atime, stat.st_atime_nsec);
        let mtime = TimeSpec::new(stat.st_mtime, stat.st_mtime_nsec);
        utimensat(at, tmp, &atime, &mtime, UtimensatFlags::NoFollowSymlink)?;
        self.inherit(false).map_err(|e| errno_of(&e))?;
        self.hold(dir).map_err(|e| errno_of(&e))?;
        self.exchange(dir, name, tmp)
    }

    /// `dir` set back into the project if its pod moved it out again since the walk looked
    /// (a flood does so every few hundred entries): the kernel refuses to move an inode into a
    /// PROJINHERIT directory of another project.
    fn hold(&self, dir: BorrowedFd<'_>) -> io::Result<()> {
        let attr = sys::get_fsxattr(dir)?;
        if escape(&attr, true, self.want).is_none() {
            return Ok(());
        }
        self.again.set(self.again.get() + 1);
        sys::set_fsxattr(dir, &put_back(&attr, true, self.want))
    }

    /// A regular file or directory a pod swapped in, found here, set into the volume's
    /// project (opened here, where only root reaches, never through a symlink).
    fn adopt(&self, tmp: &OsStr) -> io::Result<()> {
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let kind = fstatat(self.dir.as_fd(), tmp, AtFlags::AT_SYMLINK_NOFOLLOW)?.st_mode;
        if !matches!(kind & libc::S_IFMT, libc::S_IFREG | libc::S_IFDIR) {
            return Err(Errno::EXDEV.into());
        }
        let fd = nix::fcntl::openat(self.dir.as_fd(), tmp, flags, Mode::empty())?;
        let attr = sys::get_fsxattr(fd.as_fd())?;
        let dir = kind & libc::S_IFMT == libc::S_IFDIR;
        sys::set_fsxattr(fd.as_fd(), &put_back(&attr, dir, self.want))
    }

    fn exchange(&self, dir: BorrowedFd<'_>, name: &OsStr, tmp: &OsStr) -> Result<(), Errno> {
        let at = self.dir.as_fd();
        renameat2(at, tmp, dir, name, RenameFlags::RENAME_EXCHANGE)
    }

    fn unlink(&self, tmp: &OsStr) -> Result<(), Errno> {
        unlinkat(self.dir.as_fd(), tmp, UnlinkatFlags::NoRemoveDir)
    }
}

fn errno_of(e: &io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}
