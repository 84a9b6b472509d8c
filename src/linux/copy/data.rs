//! File data. A reflink (`FICLONE`) first: on btrfs and XFS with reflink it shares every
//! extent, holes included, in one call. Elsewhere only the data extents are copied (found with
//! `SEEK_DATA`/`SEEK_HOLE`), by `copy_file_range` and else by `pread`/`pwrite`, and the size is
//! set with `ftruncate`, so holes stay holes. The extents are found by us because
//! `copy_file_range` falls back to an in-kernel splice on ext4 and tmpfs, which reads a hole
//! as zeros and writes them out as data.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::FileExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::copy_file_range;
use nix::unistd::{Whence, ftruncate, lseek};

use crate::path_io::PathIoError;

// FICLONE = _IOW(0x94, 9, int): the source descriptor is passed by value. nix has no wrapper
// for it (libc has only the number), and its ioctl macro gives a typed, checked call.
nix::ioctl_write_int!(ficlone, 0x94, 9);

/// The largest single `copy_file_range` request: big enough to amortise the call, small
/// enough that one call never holds a huge extent's locks for long.
const CHUNK: usize = 64 << 20;
/// The `pread`/`pwrite` buffer.
const BUFFER: usize = 1 << 20;

/// A failed step, for the caller to name the path.
#[derive(Debug)]
pub struct Failed {
    pub op: &'static str,
    pub source: io::Error,
}

impl Failed {
    /// The failure named with the path of the file being copied.
    pub fn on(self, path: &Path) -> PathIoError {
        PathIoError::new(self.op, path, self.source)
    }
}

fn failed(op: &'static str) -> impl FnOnce(Errno) -> Failed {
    move |errno| Failed {
        op,
        source: errno.into(),
    }
}

/// How one file's data went.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    /// Bytes shared with the source by a reflink (the whole size, or 0).
    pub reflinked: u64,
    /// Bytes of data extents written out.
    pub written: u64,
}

/// Copies file data, remembering across files what the filesystems refused, so a tree on ext4
/// does not try (and fail) a reflink per file.
pub struct Engine {
    try_reflink: bool,
    try_copy_range: bool,
    buffer: Vec<u8>,
}

impl Engine {
    /// `share_extents`: false makes every byte go through `pread`/`pwrite`, so the copy shares
    /// nothing with the source even where the filesystem could (`copy_file_range` reflinks on
    /// XFS and btrfs too, so it is skipped as well).
    pub fn new(share_extents: bool) -> Self {
        Self {
            try_reflink: share_extents,
            try_copy_range: share_extents,
            buffer: Vec::new(),
        }
    }

    /// Copies the first `size` bytes of `src` into the empty `dst` and makes `dst` exactly
    /// `size` long. Data the source gains past `size` meanwhile is not copied; if it shrinks,
    /// the missing tail reads as zeros.
    pub fn copy(&mut self, src: &File, dst: &File, size: u64) -> Result<Copied, Failed> {
        if size == 0 {
            return Ok(Copied::default());
        }
        if self.try_reflink && self.reflink(src, dst)? {
            return Ok(Copied {
                reflinked: size,
                written: 0,
            });
        }
        let mut written = 0;
        let mut pos = 0;
        while pos < size {
            let Some((start, end)) = next_extent(src, pos, size)? else {
                break;
            };
            written += self.range(src, dst, start, end - start)?;
            pos = end;
        }
        // A trailing hole (or a source that shrank) leaves the copy short. Only then truncate:
        // on XFS even a same-size ftruncate costs a transaction (measured: 0.5 ms per file).
        let copied_to = dst
            .metadata()
            .map_err(|source| Failed { op: "stat", source })?
            .len();
        if copied_to != size {
            let len = i64::try_from(size).map_err(|_| failed("truncate")(Errno::EFBIG))?;
            ftruncate(dst.as_fd(), len).map_err(failed("truncate"))?;
        }
        Ok(Copied {
            reflinked: 0,
            written,
        })
    }

    /// Whether a reflink of the whole file was made. Refusals that mean "this filesystem (or
    /// pair of them) cannot" turn reflinks off for the rest of the copy; per-file ones (EINVAL:
    /// a btrfs NOCOW file, an XFS realtime file; ETXTBSY: an active swap file) fall back for
    /// this file only.
    fn reflink(&mut self, src: &File, dst: &File) -> Result<bool, Failed> {
        loop {
            // SAFETY: both descriptors are open for the duration of the call; FICLONE reads
            // its argument as a descriptor number and writes nothing back.
            let result = unsafe { ficlone(dst.as_raw_fd(), src.as_raw_fd() as u64) };
            match result {
                Ok(_) => return Ok(true),
                Err(Errno::EINTR) => continue,
                Err(Errno::EOPNOTSUPP | Errno::ENOTTY | Errno::ENOSYS | Errno::EXDEV) => {
                    self.try_reflink = false;
                    return Ok(false);
                }
                Err(Errno::EINVAL | Errno::ETXTBSY | Errno::EPERM) => return Ok(false),
                Err(e) => return Err(failed("clone (FICLONE)")(e)),
            }
        }
    }

    /// Copies `len` bytes at `offset` (same offset in both files); returns the bytes written,
    /// fewer if the source ended early.
    fn range(&mut self, src: &File, dst: &File, offset: u64, len: u64) -> Result<u64, Failed> {
        let mut done = 0;
        while done < len {
            let want = usize::try_from(len - done).unwrap_or(usize::MAX);
            let at = offset + done;
            let n = if self.try_copy_range {
                match self.copy_range(src, dst, at, want.min(CHUNK))? {
                    Some(n) => n,
                    None => continue,
                }
            } else {
                self.read_write(src, dst, at, want.min(BUFFER))?
            };
            if n == 0 {
                break;
            }
            done += n as u64;
        }
        Ok(done)
    }

    /// One `copy_file_range`; `None` when it is not possible here (across filesystems on
    /// kernels that refuse it, or a filesystem without it), after which read/write is used.
    fn copy_range(
        &mut self,
        src: &File,
        dst: &File,
        at: u64,
        len: usize,
    ) -> Result<Option<usize>, Failed> {
        let start = i64::try_from(at).map_err(|_| failed("copy data")(Errno::EFBIG))?;
        loop {
            let (mut off_in, mut off_out) = (start, start);
            match copy_file_range(src, Some(&mut off_in), dst, Some(&mut off_out), len) {
                Ok(n) => return Ok(Some(n)),
                Err(Errno::EINTR) => continue,
                Err(Errno::EXDEV | Errno::EOPNOTSUPP | Errno::ENOSYS | Errno::EINVAL) => {
                    self.try_copy_range = false;
                    return Ok(None);
                }
                Err(e) => return Err(failed("copy data (copy_file_range)")(e)),
            }
        }
    }

    fn read_write(&mut self, src: &File, dst: &File, at: u64, len: usize) -> Result<usize, Failed> {
        if self.buffer.is_empty() {
            self.buffer = vec![0; BUFFER];
        }
        let buf = &mut self.buffer[..len];
        let n = loop {
            match src.read_at(buf, at) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => {
                    break other.map_err(|source| Failed { op: "read", source })?;
                }
            }
        };
        dst.write_all_at(&buf[..n], at).map_err(|source| Failed {
            op: "write",
            source,
        })?;
        Ok(n)
    }
}

/// The next data extent at or after `pos`, clipped to `size`; `None` past the last one. A
/// filesystem without `SEEK_DATA` support reports everything as data, which is still correct.
fn next_extent(src: &File, pos: u64, size: u64) -> Result<Option<(u64, u64)>, Failed> {
    let seek = |offset: u64, whence| {
        let offset = i64::try_from(offset).map_err(|_| Errno::EFBIG)?;
        lseek(src.as_fd(), offset, whence).map(|o| o as u64)
    };
    let start = match seek(pos, Whence::SeekData) {
        Ok(start) => start,
        Err(Errno::ENXIO) => return Ok(None),
        Err(e) => return Err(failed("find data in")(e)),
    };
    if start >= size {
        return Ok(None);
    }
    let end = match seek(start, Whence::SeekHole) {
        Ok(end) => end.min(size),
        // The file shrank to `start` between the two calls.
        Err(Errno::ENXIO) => return Ok(None),
        Err(e) => return Err(failed("find holes in")(e)),
    };
    Ok(Some((start, end)))
}
