//! Figures for the SnapshotMetadata service, printed (not asserted): a raw block volume of
//! `MAPS_GIB` GiB (default 10) written in full, snapshotted, 1 % of it rewritten in 64 KiB
//! pieces at random places, snapshotted again; then, each from a cold page cache, through
//! node-server's gRPC (served in-process): GetMetadataDelta of the two, GetMetadataAllocated
//! of the first, and reading the second whole — what a backup without changed-block tracking
//! reads. On XFS and btrfs the snapshots share every unchanged extent, so the delta reads only
//! what changed; on ext4 (no reflinks) it reads and compares both snapshots whole.
//!
//! One scratch filesystem per kind (`BENCH_FS`, default XFS, btrfs and ext4) in `BENCH_DIR`,
//! sparse, up to three times the volume (ext4 holds two full copies). Needs root in a private
//! mount namespace: `scripts/bench-storage.sh maps`.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use csi_nodekit::proto::csi::controller_client::ControllerClient;
use csi_nodekit::proto::csi::snapshot_metadata_client::SnapshotMetadataClient;
use csi_nodekit::proto::csi::volume_capability::{AccessType, BlockVolume};
use csi_nodekit::proto::csi::*;

#[allow(dead_code)]
#[path = "support/bench.rs"]
mod bench;
use bench::scratch_fs::{Kind, ScratchFs};
use bench::{GIB, MIB, fill, selected};
#[allow(dead_code)]
#[path = "support/image_volumes.rs"]
mod image_volumes;

type Maps = SnapshotMetadataClient<tonic::transport::Channel>;

const PIECE: u64 = 64 << 10;
const CHUNK: usize = 4 << 20;

/// CreateVolume of a raw block volume of `bytes`.
fn block_volume(name: &str, bytes: u64) -> CreateVolumeRequest {
    let mut request = image_volumes::create_request(name, bytes, &[]);
    for capability in &mut request.volume_capabilities {
        capability.access_type = Some(AccessType::Block(BlockVolume {}));
    }
    request
}

/// Syncs and empties the page cache, so every read below comes from the disk.
fn cold() {
    nix::unistd::sync();
    std::fs::write("/proc/sys/vm/drop_caches", b"3").expect("drop caches (needs root)");
}

/// Writes the whole file with incompressible bytes.
fn write_whole(file: &File, bytes: u64) {
    let mut buf = vec![0u8; CHUNK];
    for (i, at) in (0..bytes).step_by(CHUNK).enumerate() {
        fill(&mut buf, i as u64 + 1);
        file.write_all_at(&buf, at).expect("write");
    }
    file.sync_all().expect("fsync");
}

/// Rewrites `share` of the file in 64 KiB pieces at random aligned places; the bytes rewritten.
fn rewrite(file: &File, bytes: u64, share: f64) -> u64 {
    let pieces = ((bytes as f64 * share) / PIECE as f64) as u64;
    let mut seed = 0x5eed_u64;
    let mut buf = vec![0u8; PIECE as usize];
    for i in 0..pieces {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        fill(&mut buf, seed ^ i);
        let at = (seed % (bytes / PIECE)) * PIECE;
        file.write_all_at(&buf, at).expect("rewrite");
    }
    file.sync_all().expect("fsync");
    pieces * PIECE
}

/// Reads the file whole, sequentially; the time it took.
fn read_whole(path: &Path) -> Duration {
    let file = File::open(path).expect("open");
    let mut buf = vec![0u8; CHUNK];
    let started = Instant::now();
    let mut at = 0;
    loop {
        let n = file.read_at(&mut buf, at).expect("read");
        if n == 0 {
            break;
        }
        at += n as u64;
    }
    started.elapsed()
}

/// Entries and bytes of a streamed map, and the time to the last message.
struct Streamed {
    entries: usize,
    bytes: u64,
    took: Duration,
}

/// Reads a map's stream to its end.
async fn drain<M>(
    started: Instant,
    mut stream: tonic::Streaming<M>,
    entries_of: fn(&M) -> &[BlockMetadata],
) -> Streamed {
    let (mut entries, mut bytes) = (0, 0);
    while let Some(message) = stream.message().await.expect("map stream") {
        let batch = entries_of(&message);
        entries += batch.len();
        bytes += batch.iter().map(|b| b.size_bytes as u64).sum::<u64>();
    }
    Streamed {
        entries,
        bytes,
        took: started.elapsed(),
    }
}

async fn delta(maps: &mut Maps, base: &str, target: &str) -> Streamed {
    let started = Instant::now();
    let request = GetMetadataDeltaRequest {
        base_snapshot_id: base.into(),
        target_snapshot_id: target.into(),
        ..Default::default()
    };
    let stream = maps.get_metadata_delta(request).await.expect("delta");
    drain(started, stream.into_inner(), |m| &m.block_metadata).await
}

async fn allocated(maps: &mut Maps, id: &str) -> Streamed {
    let started = Instant::now();
    let request = GetMetadataAllocatedRequest {
        snapshot_id: id.into(),
        ..Default::default()
    };
    let stream = maps
        .get_metadata_allocated(request)
        .await
        .expect("allocated");
    drain(started, stream.into_inner(), |m| &m.block_metadata).await
}

async fn measure(kind: Kind, bytes: u64) {
    let fs = ScratchFs::sized(kind, "", 3 * bytes + GIB);
    let state = fs.path().join("state");
    let served = bench::Served::start(fs.path(), &state).await;
    let mut controller = ControllerClient::new(served.channel.clone());
    let mut maps = SnapshotMetadataClient::new(served.channel.clone());
    let created = controller
        .create_volume(block_volume("maps", bytes))
        .await
        .expect("create");
    let id = created.into_inner().volume.expect("volume").volume_id;
    let image = state.join("volumes").join(&id).join("volume.img");
    let file = OpenOptions::new()
        .write(true)
        .open(&image)
        .expect("open the volume's file");
    let written = Instant::now();
    write_whole(&file, bytes);
    let written = written.elapsed();
    let snapshot = |name: &str| CreateSnapshotRequest {
        name: name.into(),
        source_volume_id: id.clone(),
        ..Default::default()
    };
    let first = controller
        .create_snapshot(snapshot("first"))
        .await
        .expect("snapshot");
    let first = first.into_inner().snapshot.expect("snapshot").snapshot_id;
    let changed = rewrite(&file, bytes, 0.01);
    drop(file);
    let second = controller
        .create_snapshot(snapshot("second"))
        .await
        .expect("snapshot");
    let second = second.into_inner().snapshot.expect("snapshot").snapshot_id;

    cold();
    let d = delta(&mut maps, &first, &second).await;
    cold();
    let a = allocated(&mut maps, &first).await;
    cold();
    let whole = read_whole(&state.join("snapshots").join(&second).join("volume.img"));
    println!(
        "{kind:?}: {} GiB volume (written in {:.1} s), {:.0} MiB rewritten; cold cache:",
        bytes / GIB,
        written.as_secs_f64(),
        changed as f64 / MIB as f64
    );
    println!(
        "  GetMetadataDelta      {:>8.3} s  {:>7} entries  {:>8.1} MiB reported",
        d.took.as_secs_f64(),
        d.entries,
        d.bytes as f64 / MIB as f64
    );
    println!(
        "  GetMetadataAllocated  {:>8.3} s  {:>7} entries  {:>8.1} MiB reported",
        a.took.as_secs_f64(),
        a.entries,
        a.bytes as f64 / MIB as f64
    );
    println!(
        "  reading it whole      {:>8.3} s  ({:.0} MiB/s); the delta call takes {:.1} % of that",
        whole.as_secs_f64(),
        bytes as f64 / MIB as f64 / whole.as_secs_f64(),
        100.0 * d.took.as_secs_f64() / whole.as_secs_f64()
    );
    served.stop().await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    bench::prepare("maps");
    let gib: u64 = std::env::var("MAPS_GIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    for kind in [Kind::Xfs, Kind::Btrfs, Kind::Ext4] {
        if selected(kind) {
            measure(kind, gib * GIB).await;
        }
    }
}
