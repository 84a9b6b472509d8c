//! Block maps of raw block snapshots, for the SnapshotMetadata service: which byte ranges of a
//! snapshot hold data (GetMetadataAllocated) and which differ between two snapshots of one
//! volume (GetMetadataDelta), shaped as extents or fixed-size blocks and cut into batches.
//!
//! A snapshot is its volume's file copied by reflink, so two snapshots of one volume share
//! every extent the volume did not rewrite between them: where both map a byte to one device
//! address the byte is the same, and nothing is read. Where both hold data at different
//! addresses (a rewritten block, or a state directory without reflinks, where nothing is
//! shared) the two are read and compared in 4 KiB granules, so a block rewritten with the same
//! bytes, or every block of a copy, is reported only if its bytes differ. Where one holds data
//! and the other a hole (or unwritten space, which reads as zeros) the data side alone is read,
//! and its granules that are not all zeros are reported. The cost is therefore the extent maps
//! plus reading (at most twice) what changed — or, without reflinks, twice what both hold.

//!
//! - this file — the shapes, the batches, the walk over both extent maps.
//! - `compare` — the bytes of a range read and compared where the maps cannot tell.

mod compare;
#[cfg(test)]
mod tests;

use std::fs::File;
use std::io;

use crate::linux::extents::{Extent, Extents, extents};
pub use compare::GRANULE;

/// How ranges are reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// VARIABLE_LENGTH: ranges of any length, adjacent ones merged.
    Extents,
    /// FIXED_LENGTH: blocks of this many bytes, aligned to it.
    Blocks(u64),
}

impl Shape {
    /// What a starting offset is rounded down to.
    pub fn alignment(self) -> u64 {
        match self {
            Self::Extents => GRANULE,
            Self::Blocks(size) => size,
        }
    }
}

/// Where batches go; `send` answers false once nobody reads them any more.
pub trait Sink {
    fn send(&mut self, batch: Vec<(u64, u64)>) -> bool;
    /// Whether the reader is gone (checked between reads, so a long comparison stops).
    fn closed(&self) -> bool;
}

/// Shapes ascending, non-overlapping ranges into entries and hands them to a sink in batches
/// of at most `max`.
pub struct Batcher<'a, S: Sink> {
    shape: Shape,
    max: usize,
    /// An extent still growing (Extents), or the last block sent (Blocks).
    pending: Option<(u64, u64)>,
    batch: Vec<(u64, u64)>,
    sink: &'a mut S,
    open: bool,
}

impl<'a, S: Sink> Batcher<'a, S> {
    pub fn new(shape: Shape, max: usize, sink: &'a mut S) -> Self {
        Self {
            shape,
            max: max.max(1),
            pending: None,
            batch: Vec::new(),
            sink,
            open: true,
        }
    }

    /// Whether the reader still reads.
    pub fn open(&self) -> bool {
        self.open && !self.sink.closed()
    }

    fn emit(&mut self, entry: (u64, u64)) {
        self.batch.push(entry);
        if self.batch.len() >= self.max {
            let full = std::mem::take(&mut self.batch);
            self.open = self.open && self.sink.send(full);
        }
    }

    /// Adds the range `start..end`.
    pub fn push(&mut self, start: u64, end: u64) {
        if start >= end || !self.open {
            return;
        }
        match self.shape {
            Shape::Extents => match self.pending {
                Some((s, e)) if e == start => self.pending = Some((s, end)),
                Some((s, e)) => {
                    self.emit((s, e - s));
                    self.pending = Some((start, end));
                }
                None => self.pending = Some((start, end)),
            },
            Shape::Blocks(size) => {
                let mut block = start / size * size;
                if let Some((last, _)) = self.pending
                    && last >= block
                {
                    block = last + size;
                }
                while block < end && self.open {
                    self.emit((block, size));
                    self.pending = Some((block, size));
                    block += size;
                }
            }
        }
    }

    /// Sends what is left; false if the reader went away.
    pub fn finish(mut self) -> bool {
        if let (Shape::Extents, Some((s, e))) = (self.shape, self.pending.take()) {
            self.emit((s, e - s));
        }
        if !self.batch.is_empty() && self.open {
            let rest = std::mem::take(&mut self.batch);
            self.open = self.sink.send(rest);
        }
        self.open
    }
}

/// Reports the ranges of `file` holding data from `start` to `end`.
pub fn allocated<S: Sink>(
    file: &File,
    start: u64,
    end: u64,
    out: &mut Batcher<'_, S>,
) -> io::Result<()> {
    for extent in extents(file, start, end) {
        let extent = extent?;
        if !out.open() {
            break;
        }
        if extent.holds_data() {
            out.push(extent.logical.max(start), extent.end().min(end));
        }
    }
    Ok(())
}

/// Reports the ranges from `start` to `end` whose bytes differ between `base` and `target`.
pub fn delta<S: Sink>(
    base: &File,
    target: &File,
    start: u64,
    end: u64,
    out: &mut Batcher<'_, S>,
) -> io::Result<()> {
    let mut walk = Walk {
        base: Cursor::new(extents(base, start, end)),
        target: Cursor::new(extents(target, start, end)),
        at: start,
        end,
    };
    let mut buffers = compare::Buffers::default();
    while let Some((from, to, verdict)) = walk.next_segment()? {
        if !out.open() {
            break;
        }
        let (base, target) = match verdict {
            Verdict::Same => continue,
            Verdict::BaseOnly => (Some(base), None),
            Verdict::TargetOnly => (None, Some(target)),
            Verdict::Compare => (Some(base), Some(target)),
        };
        compare::differing(base, target, (from, to), &mut buffers, out)?;
    }
    Ok(())
}

/// What a stretch of both files is, as far as their extent maps tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Both holes (or unwritten), or both mapped to the same device addresses.
    Same,
    /// Data on the base's side only, the target's a hole (a discard): the base's non-zero
    /// granules differ.
    BaseOnly,
    /// Data on the target's side only: its non-zero granules differ.
    TargetOnly,
    /// Data on both sides at different addresses: only reading tells.
    Compare,
}

/// The extents of one file, walked forward.
struct Cursor<'a> {
    extents: Extents<'a>,
    current: Option<Extent>,
}

impl<'a> Cursor<'a> {
    fn new(extents: Extents<'a>) -> Self {
        Self {
            extents,
            current: None,
        }
    }

    /// The first extent ending after `at` (it may start after `at`), if any.
    fn from(&mut self, at: u64) -> io::Result<Option<Extent>> {
        loop {
            if let Some(extent) = self.current
                && extent.end() > at
            {
                return Ok(Some(extent));
            }
            match self.extents.next() {
                Some(next) => self.current = Some(next?),
                None => {
                    self.current = None;
                    return Ok(None);
                }
            }
        }
    }
}

/// Both files' extents walked side by side, cut at every extent's start and end.
struct Walk<'a> {
    base: Cursor<'a>,
    target: Cursor<'a>,
    at: u64,
    end: u64,
}

impl Walk<'_> {
    fn next_segment(&mut self) -> io::Result<Option<(u64, u64, Verdict)>> {
        if self.at >= self.end {
            return Ok(None);
        }
        let at = self.at;
        let (base, target) = (self.base.from(at)?, self.target.from(at)?);
        let covering = |e: Option<Extent>| e.filter(|e| e.logical <= at);
        let mut boundary = self.end;
        for extent in [base, target].into_iter().flatten() {
            boundary = boundary.min(if extent.logical <= at {
                extent.end()
            } else {
                extent.logical
            });
        }
        let (b, t) = (covering(base), covering(target));
        let data = |e: Option<Extent>| e.filter(Extent::holds_data);
        let verdict = match (data(b), data(t)) {
            (None, None) => Verdict::Same,
            (Some(b), Some(t)) => match (b.address_of(at), t.address_of(at)) {
                (Some(x), Some(y)) if x == y => Verdict::Same,
                _ => Verdict::Compare,
            },
            (Some(_), None) => Verdict::BaseOnly,
            (None, Some(_)) => Verdict::TargetOnly,
        };
        self.at = boundary;
        Ok(Some((at, boundary, verdict)))
    }
}
