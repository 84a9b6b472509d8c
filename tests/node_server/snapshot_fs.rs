//! Snapshots on real filesystems as the state directory: XFS with reflink and btrfs (shared
//! extents: near-instant, almost no space) and ext4 (a plain copy), each on a loop device: a
//! snapshot and its restore, and a snapshot of a volume that is being written. (A node-server
//! killed in the middle of a snapshot or a restore is in `snapshot_crash`.)

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::common::csi_node::*;
use crate::common::csi_snapshots::*;
use crate::common::scratch_fs::{Kind, ScratchFs};
use crate::common::tree_fixture;

const MIB: i64 = 1 << 20;

async fn reflinks_or_copies_on(kind: Kind) {
    let sandbox = MountSandbox::new();
    let fs = ScratchFs::new(kind);
    let state = fs.path().join("state");
    let server = start_at(&sandbox, &state, None).await;
    let mut csi = server.client().await;
    let id = create(&mut csi, "data", 64 * MIB).await;
    let data = state.join("volumes").join(&id).join("data");
    let bytes = tree_fixture::data_tree(&data);
    let sums = checksums(&data);

    let before = fs.free_bytes();
    let snapshot = csi.snapshot("snap", &id).await;
    let snapshot_cost = before.saturating_sub(fs.free_bytes());
    let before = fs.free_bytes();
    let restored = csi
        .create_from(from_snapshot("restored", 0, &snapshot.snapshot_id))
        .await;
    let restore_cost = before.saturating_sub(fs.free_bytes());
    let restored_data = state.join("volumes").join(&restored.volume_id).join("data");
    assert_eq!(checksums(&restored_data), sums);
    let snapshot_data = state
        .join("snapshots")
        .join(&snapshot.snapshot_id)
        .join("data");
    assert_eq!(checksums(&snapshot_data), sums);
    for (what, cost) in [("snapshot", snapshot_cost), ("restore", restore_cost)] {
        if kind.reflinks() {
            assert!(
                cost < bytes / 8,
                "a {what} of {bytes} bytes cost {cost} on {kind:?}"
            );
        } else {
            assert!(
                cost >= bytes,
                "a {what} of {bytes} bytes cost only {cost} on {kind:?}"
            );
        }
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: mounts XFS, btrfs and ext4 scratch filesystems on loop devices"]
async fn on_xfs_a_snapshot_and_its_restore_share_extents_and_cost_almost_no_space() {
    reflinks_or_copies_on(Kind::Xfs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: mounts XFS, btrfs and ext4 scratch filesystems on loop devices"]
async fn on_btrfs_a_snapshot_and_its_restore_share_extents_and_cost_almost_no_space() {
    reflinks_or_copies_on(Kind::Btrfs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: mounts XFS, btrfs and ext4 scratch filesystems on loop devices"]
async fn on_ext4_a_snapshot_and_its_restore_copy_the_data() {
    reflinks_or_copies_on(Kind::Ext4).await;
}

/// A self-checking record: sequence number, length, a checksum of the payload, the payload
/// (derived from the sequence number). A file caught half-rewritten fails the check.
fn record(seq: u64, len: usize) -> Vec<u8> {
    let payload = tree_fixture::noise(len - 24, seq);
    let mut out = Vec::with_capacity(len);
    out.extend(seq.to_le_bytes());
    out.extend((len as u64).to_le_bytes());
    out.extend(sum(&payload).to_le_bytes());
    out.extend(payload);
    out
}

fn sum(bytes: &[u8]) -> u64 {
    use std::hash::{DefaultHasher, Hasher};
    let mut hasher = DefaultHasher::new();
    hasher.write(bytes);
    hasher.finish()
}

/// Whether `bytes` is one whole record.
fn intact(bytes: &[u8]) -> bool {
    let word = |at: usize| {
        bytes
            .get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    };
    match (word(8), word(16)) {
        (Some(len), Some(checksum)) => len as usize == bytes.len() && sum(&bytes[24..]) == checksum,
        _ => false,
    }
}

const RECORD: usize = 256 << 10;
const LOG_RECORD: usize = 4096;

/// Rewrites files in place (one `pwrite` each), appends to a log (one `write` each) and
/// renames new files into place, until told to stop; counts what it did.
fn writer(dir: PathBuf, stop: Arc<AtomicBool>, done: Arc<AtomicU64>) {
    use std::io::Write;
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.join("log"))
        .unwrap();
    let mut seq = 1_000;
    while !stop.load(Ordering::Relaxed) {
        seq += 1;
        let file = File::options()
            .write(true)
            .open(dir.join(format!("r{}", seq % 16)))
            .unwrap();
        file.write_all_at(&record(seq, RECORD), 0).unwrap();
        log.write_all(&record(seq, LOG_RECORD)).unwrap();
        let temp = dir.join(format!(".new-{seq}"));
        std::fs::write(&temp, record(seq, LOG_RECORD)).unwrap();
        std::fs::rename(&temp, dir.join(format!("new-{seq}"))).unwrap();
        done.fetch_add(1, Ordering::Relaxed);
    }
}

/// Torn files in a copy of the writer's directory; panics on a file that is missing or that
/// no writer could have left (a record file lost, a log not made of whole records).
fn torn_files(dir: &Path) -> usize {
    let mut torn = 0;
    for i in 0..16 {
        let bytes =
            std::fs::read(dir.join(format!("r{i}"))).expect("every rewritten file is there");
        torn += usize::from(!intact(&bytes));
    }
    let log = std::fs::read(dir.join("log")).unwrap();
    torn += usize::from(!log.len().is_multiple_of(LOG_RECORD));
    torn += log.chunks(LOG_RECORD).filter(|r| !intact(r)).count();
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.starts_with("new-") {
            torn += usize::from(!intact(&std::fs::read(dir.join(&name)).unwrap()));
        }
    }
    torn
}

/// With reflinks every file is as of one instant (FICLONE holds the file's I/O lock against
/// writes); without, a file being written may be copied mid-write, which ext4 allows.
async fn snapshot_while_writing_on(kind: Kind) -> usize {
    let sandbox = MountSandbox::new();
    let fs = ScratchFs::sized(kind, "noatime", 1 << 30);
    let state = fs.path().join("state");
    let server = start_at(&sandbox, &state, None).await;
    let mut csi = server.client().await;
    let id = create(&mut csi, "busy", 256 * MIB).await;
    let dir = state.join("volumes").join(&id);
    for i in 0..16 {
        std::fs::write(dir.join(format!("r{i}")), record(i, RECORD)).unwrap();
    }
    // Files to walk past while the writer works: the copy takes a while.
    for d in 0..20 {
        std::fs::create_dir(dir.join(format!("d{d}"))).unwrap();
        for f in 0..200 {
            std::fs::write(dir.join(format!("d{d}/f{f}")), b"still").unwrap();
        }
    }
    let (stop, done) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let thread = std::thread::spawn({
        let (dir, stop, done) = (dir.clone(), stop.clone(), done.clone());
        move || writer(dir, stop, done)
    });
    while done.load(Ordering::Relaxed) < 10 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let before = done.load(Ordering::Relaxed);
    let snapshot = csi.snapshot("while-writing", &id).await;
    let during = done.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    thread.join().unwrap();
    assert!(snapshot.ready_to_use);
    assert!(during > 0, "the writer wrote while the snapshot was cut");
    let restored = csi
        .create_from(from_snapshot("restored", 0, &snapshot.snapshot_id))
        .await;
    let torn = torn_files(&state.join("volumes").join(&restored.volume_id));
    server.stop().await;
    torn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: mounts XFS, btrfs and ext4 scratch filesystems on loop devices"]
async fn on_xfs_a_snapshot_of_a_volume_being_written_holds_no_torn_file() {
    assert_eq!(snapshot_while_writing_on(Kind::Xfs).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: mounts XFS, btrfs and ext4 scratch filesystems on loop devices"]
async fn on_btrfs_a_snapshot_of_a_volume_being_written_holds_no_torn_file() {
    assert_eq!(snapshot_while_writing_on(Kind::Btrfs).await, 0);
}

/// ext4 promises less (see docs/node-server.md): the snapshot completes, is ready and restores, every
/// file is there, and a file caught mid-write is possible (and detectable by its writer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: mounts XFS, btrfs and ext4 scratch filesystems on loop devices"]
async fn on_ext4_a_snapshot_of_a_volume_being_written_completes_with_every_file() {
    let torn = snapshot_while_writing_on(Kind::Ext4).await;
    eprintln!("ext4: {torn} torn file(s) or log record(s) in the snapshot");
}
