//! A file's extents as its filesystem maps them (`FS_IOC_FIEMAP`): where each run of the file's
//! bytes lies on the device and whether it holds data or only space reserved for it. Two files
//! whose extents at one offset start at the same device address share those blocks: a reflink
//! copy shares every extent its source has not rewritten since, so two snapshots cut by reflink
//! from one file can be compared without reading either where they share.
//!
//! The extents are read in batches as the caller walks them: a fragmented file of millions of
//! extents costs one batch of memory, not a list of them all.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// The kernel's `struct fiemap` header (`linux/fiemap.h`); the extents follow it.
#[repr(C)]
#[derive(Debug, Default)]
struct FiemapHeader {
    start: u64,
    length: u64,
    flags: u32,
    mapped_extents: u32,
    extent_count: u32,
    reserved: u32,
}

/// The kernel's `struct fiemap_extent`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct FiemapExtent {
    logical: u64,
    physical: u64,
    length: u64,
    reserved64: [u64; 2],
    flags: u32,
    reserved: [u32; 3],
}

/// Extents asked for per call: 56 bytes each, one call per 256 extents of the file.
const BATCH: usize = 256;

/// One call's buffer: the header and room for `BATCH` extents behind it, as the kernel reads
/// and writes it.
#[repr(C)]
struct Request {
    header: FiemapHeader,
    extents: [FiemapExtent; BATCH],
}

// FS_IOC_FIEMAP = _IOWR('f', 11, struct fiemap): the size in the number is the header's (the
// extents are a flexible array). libc and nix define neither the structures nor the number.
nix::ioctl_readwrite!(fs_ioc_fiemap, b'f', 11, FiemapHeader);

/// Flush dirty pages before mapping, so delayed allocations have their blocks.
const FIEMAP_FLAG_SYNC: u32 = 0x1;
/// The last extent of the file.
const FIEMAP_EXTENT_LAST: u32 = 0x1;
/// The device address is not known (or not meaningful): never taken as shared.
const FIEMAP_EXTENT_UNKNOWN: u32 = 0x2;
/// The data is encoded (compressed, encrypted): its address says nothing about its bytes.
const FIEMAP_EXTENT_ENCODED: u32 = 0x8;
/// Space reserved (fallocate) but never written: it reads as zeros.
const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x800;

/// One run of a file's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Where it starts in the file.
    pub logical: u64,
    /// Where it starts on the device.
    pub physical: u64,
    pub length: u64,
    pub flags: u32,
}

impl Extent {
    /// Whether it holds written data (an unwritten extent reads as zeros, like a hole).
    pub fn holds_data(&self) -> bool {
        self.flags & FIEMAP_EXTENT_UNWRITTEN == 0
    }

    /// Where it ends in the file.
    pub fn end(&self) -> u64 {
        self.logical.saturating_add(self.length)
    }

    /// The device address of the file's byte `at` (inside this extent), if that address says
    /// which bytes are there: two files whose byte maps to one such address hold the same byte.
    pub fn address_of(&self, at: u64) -> Option<u64> {
        if self.flags & (FIEMAP_EXTENT_UNKNOWN | FIEMAP_EXTENT_ENCODED) != 0 {
            return None;
        }
        Some(self.physical.saturating_add(at - self.logical))
    }
}

/// The extents of a file from one offset to another, fetched in batches as they are walked.
pub struct Extents<'a> {
    file: &'a File,
    next: u64,
    end: u64,
    batch: VecDeque<Extent>,
    done: bool,
    /// The call's buffer, reused for every batch (14 KiB).
    request: Box<Request>,
}

/// The extents of `file` that overlap `from..end`, in ascending order; holes are the gaps
/// between them.
pub fn extents(file: &File, from: u64, end: u64) -> Extents<'_> {
    Extents {
        file,
        next: from,
        end,
        batch: VecDeque::new(),
        done: from >= end,
        request: Box::new(Request {
            header: FiemapHeader::default(),
            extents: [FiemapExtent::default(); BATCH],
        }),
    }
}

impl Extents<'_> {
    fn fetch(&mut self) -> io::Result<()> {
        let request = &mut *self.request;
        request.header = FiemapHeader {
            start: self.next,
            length: self.end - self.next,
            flags: FIEMAP_FLAG_SYNC,
            extent_count: BATCH as u32,
            ..FiemapHeader::default()
        };
        let header: *mut FiemapHeader = &mut request.header;
        // SAFETY: `header` is the start of a `Request`, whose `extent_count` extents follow the
        // header in memory as the kernel expects; it stays alive and unaliased for the call.
        unsafe { fs_ioc_fiemap(self.file.as_raw_fd(), header) }.map_err(io::Error::from)?;
        let mapped = (request.header.mapped_extents as usize).min(BATCH);
        if mapped == 0 {
            self.done = true;
            return Ok(());
        }
        for raw in &request.extents[..mapped] {
            if raw.flags & FIEMAP_EXTENT_LAST != 0 {
                self.done = true;
            }
            self.batch.push_back(Extent {
                logical: raw.logical,
                physical: raw.physical,
                length: raw.length,
                flags: raw.flags,
            });
        }
        let last = request.extents[mapped - 1];
        let after = last.logical.saturating_add(last.length);
        // No progress (a filesystem answering past the asked range): stop rather than loop.
        if after <= self.next {
            self.done = true;
        }
        self.next = after;
        if self.next >= self.end {
            self.done = true;
        }
        Ok(())
    }
}

impl Iterator for Extents<'_> {
    type Item = io::Result<Extent>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.batch.is_empty() && !self.done {
            if let Err(e) = self.fetch() {
                self.done = true;
                return Some(Err(e));
            }
        }
        self.batch.pop_front().map(Ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn a_sparse_file_maps_its_written_blocks_and_leaves_its_holes_out() {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("sparse"))
            .unwrap();
        file.set_len(16 << 20).unwrap();
        file.write_all_at(&[1; 4096], 4 << 20).unwrap();
        file.write_all_at(&[2; 8192], 12 << 20).unwrap();
        let found: Vec<Extent> = extents(&file, 0, 16 << 20).map(Result::unwrap).collect();
        let data: Vec<(u64, u64)> = (found.iter())
            .filter(|e| e.holds_data())
            .map(|e| (e.logical, e.end()))
            .collect();
        assert!(
            data.iter()
                .any(|&(s, e)| s <= 4 << 20 && e >= (4 << 20) + 4096)
        );
        assert!(
            data.iter()
                .any(|&(s, e)| s <= 12 << 20 && e >= (12 << 20) + 8192)
        );
        assert!(data.iter().all(|&(s, _)| s >= 4 << 20), "{data:?}");
    }

    #[test]
    fn a_range_past_the_end_maps_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, [0u8; 100]).unwrap();
        let file = File::open(&path).unwrap();
        assert_eq!(extents(&file, 5, 5).count(), 0);
    }
}
