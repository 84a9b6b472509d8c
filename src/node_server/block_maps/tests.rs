use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;

use super::*;

/// Collects batches; closes after `limit` batches when given.
#[derive(Default)]
struct Collect {
    batches: Vec<Vec<(u64, u64)>>,
    limit: Option<usize>,
}

impl Sink for Collect {
    fn send(&mut self, batch: Vec<(u64, u64)>) -> bool {
        self.batches.push(batch);
        self.limit.is_none_or(|limit| self.batches.len() < limit)
    }

    fn closed(&self) -> bool {
        self.limit.is_some_and(|limit| self.batches.len() >= limit)
    }
}

impl Collect {
    fn entries(&self) -> Vec<(u64, u64)> {
        self.batches.concat()
    }
}

fn shaped(shape: Shape, max: usize, ranges: &[(u64, u64)]) -> Collect {
    let mut sink = Collect::default();
    let mut out = Batcher::new(shape, max, &mut sink);
    for &(start, end) in ranges {
        out.push(start, end);
    }
    assert!(out.finish());
    sink
}

#[test]
fn adjacent_ranges_merge_into_one_extent_and_gaps_split_them() {
    let sink = shaped(
        Shape::Extents,
        100,
        &[(0, 4096), (4096, 8192), (16384, 20480)],
    );
    assert_eq!(sink.entries(), [(0, 8192), (16384, 4096)]);
}

#[test]
fn fixed_blocks_cover_each_range_once_aligned_to_the_block_size() {
    let ranges = [
        (100, 200),
        (300, 70_000),
        (70_000, 70_001),
        (200_000, 200_001),
    ];
    let sink = shaped(Shape::Blocks(65536), 100, &ranges);
    assert_eq!(
        sink.entries(),
        [(0, 65536), (65536, 65536), (196_608, 65536)]
    );
}

#[test]
fn batches_hold_at_most_max_entries_and_the_last_holds_the_rest() {
    let ranges: Vec<(u64, u64)> = (0..7).map(|i| (i * 8192, i * 8192 + 4096)).collect();
    let sink = shaped(Shape::Extents, 3, &ranges);
    let sizes: Vec<usize> = sink.batches.iter().map(Vec::len).collect();
    assert_eq!(sizes, [3, 3, 1]);
}

#[test]
fn a_reader_gone_stops_the_batches() {
    let mut sink = Collect {
        limit: Some(1),
        ..Collect::default()
    };
    let mut out = Batcher::new(Shape::Blocks(4096), 2, &mut sink);
    out.push(0, 1 << 20);
    assert!(!out.open());
    assert!(!out.finish());
    assert_eq!(sink.batches.len(), 1, "nothing sent after the reader left");
}

fn file_of(dir: &tempfile::TempDir, name: &str, size: u64, writes: &[(u64, u8, usize)]) -> File {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.path().join(name))
        .unwrap();
    file.set_len(size).unwrap();
    for &(at, byte, len) in writes {
        file.write_all_at(&vec![byte; len], at).unwrap();
    }
    file.sync_all().unwrap();
    file
}

#[test]
fn allocated_ranges_are_the_written_ones_from_the_starting_offset() {
    let dir = tempfile::tempdir().unwrap();
    let file = file_of(
        &dir,
        "a",
        8 << 20,
        &[(1 << 20, 7, 8192), (6 << 20, 7, 4096)],
    );
    let mut sink = Collect::default();
    let mut out = Batcher::new(Shape::Extents, 100, &mut sink);
    allocated(&file, 2 << 20, 8 << 20, &mut out).unwrap();
    assert!(out.finish());
    assert_eq!(sink.entries(), [(6 << 20, 4096)]);
}

#[test]
fn two_copies_differ_exactly_where_their_bytes_do() {
    // /tmp shares no extents between two files written apart: every range both hold is read
    // and compared, one hole against data is reported whole, equal rewrites are not reported.
    let dir = tempfile::tempdir().unwrap();
    let common = [(0, 1, 65536), (1 << 20, 2, 65536)];
    let base = file_of(&dir, "base", 4 << 20, &common);
    let mut changed = common.to_vec();
    changed.extend([(8192, 9, 10), (1 << 20, 2, 4096), (3 << 20, 5, 4096)]);
    let target = file_of(&dir, "target", 4 << 20, &changed);
    let mut sink = Collect::default();
    let mut out = Batcher::new(Shape::Extents, 100, &mut sink);
    delta(&base, &target, 0, 4 << 20, &mut out).unwrap();
    assert!(out.finish());
    assert_eq!(sink.entries(), [(8192, 4096), (3 << 20, 4096)]);
}
