//! Figures for I/O inside an image volume (`layout: image`) against the same I/O on the state
//! directory's filesystem itself, what each call of a volume's life takes for directory and
//! image volumes, and how long a group snapshot of four holds their writers, printed (not
//! asserted). The I/O: 4 KiB direct I/O (`O_DIRECT`),
//! sequential and random, reads and writes, one thread at a time (and random ones by four
//! threads at once), on a file allocated in full beforehand in both
//! places, so that no write allocates. Inside the volume the path is the pod's: its ext4, its
//! loop device (direct I/O where the host filesystem allows it), the image file on the host
//! filesystem. Two image volumes: one on a loop device doing direct I/O (the default), one
//! with `directIO: "false"` (a buffered loop device: the host's page cache holds its blocks).
//! A directory volume's files are the host filesystem's: the host column is its figure too.
//!
//! First in `BENCH_DIR` itself (the machine's own filesystem: the figure that matters), then
//! on one scratch filesystem per kind (`BENCH_FS`, default XFS, btrfs and ext4) under it; node-server served in-process. The volume is 16 MiB (8 MiB file) where root
//! lacks CAP_SYS_RESOURCE (a larger one grows its ext4 at stage, which needs it), else
//! `IMAGE_MIB` (default 256, a file of half of it). `BENCH_SECONDS` per pattern (default 2).
//! Needs root in a private mount namespace: `scripts/bench-storage.sh io`.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use csi_nodekit::proto::csi::controller_client::ControllerClient;
use csi_nodekit::proto::csi::group_controller_client::GroupControllerClient;
use csi_nodekit::proto::csi::node_client::NodeClient;
use csi_nodekit::proto::csi::{CreateVolumeGroupSnapshotRequest, DeleteVolumeGroupSnapshotRequest};

#[allow(dead_code)]
#[path = "support/bench.rs"]
mod bench;
#[path = "support/call_times.rs"]
mod call_times;
#[path = "support/image_volumes.rs"]
mod image_volumes;
use bench::scratch_fs::{Kind, ScratchFs};
use bench::{GIB, MIB, selected};
use image_volumes::Volumes;

const BLOCK: usize = 4096;

#[derive(Clone, Copy, Debug)]
enum Pattern {
    SequentialWrite,
    SequentialRead,
    RandomWrite,
    RandomRead,
}

const PATTERNS: [Pattern; 4] = [
    Pattern::SequentialWrite,
    Pattern::SequentialRead,
    Pattern::RandomWrite,
    Pattern::RandomRead,
];

/// A 4 KiB buffer aligned for `O_DIRECT`.
struct Aligned(Box<[u8]>, usize);

impl Aligned {
    fn new() -> Self {
        let raw = vec![0x5a_u8; 2 * BLOCK].into_boxed_slice();
        let offset = raw.as_ptr().align_offset(BLOCK);
        Self(raw, offset)
    }

    fn get(&mut self) -> &mut [u8] {
        &mut self.0[self.1..self.1 + BLOCK]
    }
}

/// `path` made `bytes` long by writing it whole, synced: later writes overwrite.
fn allocated(path: &Path, bytes: u64) {
    let mut buf = vec![0u8; MIB as usize];
    let file = File::create(path).expect("create the test file");
    for at in (0..bytes).step_by(MIB as usize) {
        bench::fill(&mut buf, at);
        file.write_all_at(&buf, at).expect("write the test file");
    }
    file.sync_all().expect("sync");
}

/// Operations per second of `pattern` on `path` (`bytes` long) for `seconds`, by `jobs`
/// threads at once (each its own descriptor and random sequence).
fn rate(path: &Path, bytes: u64, pattern: Pattern, seconds: f64, jobs: u64) -> f64 {
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..jobs)
            .map(|job| scope.spawn(move || one_job(path, bytes, pattern, seconds, job)))
            .collect();
        threads.into_iter().map(|t| t.join().expect("job")).sum()
    })
}

fn one_job(path: &Path, bytes: u64, pattern: Pattern, seconds: f64, job: u64) -> f64 {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nix::fcntl::OFlag::O_DIRECT.bits())
        .open(path)
        .expect("open with O_DIRECT");
    let blocks = bytes / BLOCK as u64;
    let mut buf = Aligned::new();
    let mut rng = 0x9E37_79B9_7F4A_7C15_u64 ^ (job + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
    let (mut done, start) = (0u64, Instant::now());
    let until = Duration::from_secs_f64(seconds);
    while start.elapsed() < until {
        for _ in 0..64 {
            let block = match pattern {
                Pattern::SequentialWrite | Pattern::SequentialRead => {
                    (done + job * blocks / 4) % blocks
                }
                Pattern::RandomWrite | Pattern::RandomRead => {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng % blocks
                }
            };
            let at = block * BLOCK as u64;
            match pattern {
                Pattern::SequentialWrite | Pattern::RandomWrite => {
                    file.write_all_at(buf.get(), at).expect("write")
                }
                Pattern::SequentialRead | Pattern::RandomRead => {
                    file.read_exact_at(buf.get(), at).expect("read")
                }
            }
            done += 1;
        }
    }
    done as f64 / start.elapsed().as_secs_f64()
}

/// The loop device on `image`, with whether it does direct I/O and its block size.
fn loop_device_of(image: &Path) -> String {
    let blocks = std::fs::read_dir("/sys/block")
        .expect("/sys/block")
        .flatten();
    for entry in blocks {
        let sys = entry.path();
        let backing = std::fs::read_to_string(sys.join("loop/backing_file"));
        if backing.is_ok_and(|b| b.trim() == image.to_string_lossy()) {
            let read = |file: &str| std::fs::read_to_string(sys.join(file)).unwrap_or_default();
            return format!(
                "{} (direct I/O {}, {}-byte blocks)",
                entry.file_name().to_string_lossy(),
                read("loop/dio").trim(),
                read("queue/logical_block_size").trim()
            );
        }
    }
    "loop device (not found)".to_owned()
}

/// On a scratch filesystem of `kind` (itself on a buffered loop device, so its own figures
/// are the page cache's as much as the disk's).
async fn on_scratch(kind: Kind, image_bytes: u64, seconds: f64) {
    let fs = ScratchFs::sized(kind, "noatime", 2 * GIB);
    run(&format!("{kind:?}"), fs.path(), image_bytes, seconds).await;
}

/// In `dir` (a directory of ours) on the machine's own filesystem, the one `BENCH_DIR` is on.
async fn run(label: &str, dir: &Path, image_bytes: u64, seconds: f64) {
    let state = dir.join("state");
    let served = bench::Served::start(dir, &state).await;
    let mut volumes = Volumes {
        controller: ControllerClient::new(served.channel.clone()),
        node: NodeClient::new(served.channel.clone()),
        dir: dir.to_owned(),
    };
    let bytes = image_bytes / 2;
    let direct = volumes.staged("direct", image_bytes, "true").await;
    let buffered = volumes.staged("buffered", image_bytes, "false").await;
    let host = dir.join("host-file");
    allocated(&host, bytes);
    for (_, staging) in [&direct, &buffered] {
        allocated(&staging.join("file"), bytes);
    }
    let device = |id: &str| loop_device_of(&state.join("volumes").join(id).join("volume.img"));
    println!(
        "{label}: 4 KiB O_DIRECT, a {} MiB file, {seconds} s each (MB/s, IOPS); image \
         volumes on {} and (`directIO: \"false\"`) {}",
        bytes / MIB,
        device(&direct.0),
        device(&buffered.0)
    );
    println!(
        "  {:<18} {:>20} {:>26} {:>26}",
        "pattern", "host filesystem", "image", "image, buffered loop"
    );
    for (pattern, jobs) in PATTERNS
        .map(|p| (p, 1))
        .into_iter()
        .chain([(Pattern::RandomWrite, 4), (Pattern::RandomRead, 4)])
    {
        let mb = |iops: f64| iops * BLOCK as f64 / 1e6;
        let on_host = rate(&host, bytes, pattern, seconds, jobs);
        let mut line = format!(
            "  {:<18} {:>7.1} ({:>9.0}) ",
            format!("{pattern:?} x{jobs}"),
            mb(on_host),
            on_host
        );
        for (_, staging) in [&direct, &buffered] {
            let inside = rate(&staging.join("file"), bytes, pattern, seconds, jobs);
            let ratio = 100.0 * inside / on_host;
            line += &format!(" {:>7.1} ({:>9.0}) {ratio:>4.0}%", mb(inside), inside);
        }
        println!("{line}");
    }
    for (id, staging) in [direct, buffered] {
        volumes.remove(&id, &staging).await;
    }
    call_times::print(&served.channel, dir, image_bytes, CALL_ROUNDS).await;
    for pace in [None, Some(1_000)] {
        writers_held(&mut volumes, &served.channel, image_bytes, pace).await;
    }
    served.stop().await;
}

/// Volumes made, staged, published and removed again per layout for [`call_times`].
const CALL_ROUNDS: usize = 20;

/// Group snapshots per run of [`writers_held`].
const GROUPS: usize = 20;

/// How long writers wait for a group snapshot, seen by the writers: four image volumes, a
/// thread writing 4 KiB at a time into each (buffered, as most programs write) as fast as it
/// can or `pace` times a second, and the longest single write of any of them while each of
/// [`GROUPS`] group snapshots of the four is cut. A freeze writes back what its filesystem
/// got since node-server's sync just before: writers at full speed give it the most to write.
async fn writers_held(
    volumes: &mut Volumes,
    channel: &tonic::transport::Channel,
    bytes: u64,
    pace: Option<u64>,
) {
    let mut staged = Vec::new();
    for n in 0..4 {
        staged.push(volumes.staged(&format!("member-{n}"), bytes, "true").await);
    }
    let (stop, longest) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let writers: Vec<_> = (staged.iter())
        .map(|(_, staging)| {
            let file = File::create(staging.join("file")).expect("a member's file");
            let (stop, longest) = (stop.clone(), longest.clone());
            let span = bytes / 2 / BLOCK as u64;
            std::thread::spawn(move || {
                let buf = [0x5a_u8; BLOCK];
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    file.write_all_at(&buf, (n % span) * BLOCK as u64)
                        .expect("write");
                    let took = started.elapsed().as_micros() as u64;
                    longest.fetch_max(took, Ordering::Relaxed);
                    n += 1;
                    if let Some(per_second) = pace {
                        std::thread::sleep(Duration::from_micros(1_000_000 / per_second));
                    }
                }
            })
        })
        .collect();
    let mut group = GroupControllerClient::new(channel.clone());
    let ids: Vec<String> = staged.iter().map(|(id, _)| id.clone()).collect();
    let (mut held, mut calls) = (Vec::new(), Vec::new());
    for round in 0..GROUPS {
        tokio::time::sleep(Duration::from_millis(50)).await;
        longest.store(0, Ordering::Relaxed);
        let started = Instant::now();
        let request = CreateVolumeGroupSnapshotRequest {
            name: format!("group-{round}"),
            source_volume_ids: ids.clone(),
            ..Default::default()
        };
        let made = group.create_volume_group_snapshot(request).await;
        let made = made.expect("group snapshot").into_inner().group_snapshot;
        calls.push(started.elapsed().as_secs_f64() * 1e3);
        held.push(longest.load(Ordering::Relaxed) as f64 / 1e3);
        let made = made.expect("a group");
        let delete = DeleteVolumeGroupSnapshotRequest {
            group_snapshot_id: made.group_snapshot_id,
            snapshot_ids: made.snapshots.into_iter().map(|s| s.snapshot_id).collect(),
            ..Default::default()
        };
        group
            .delete_volume_group_snapshot(delete)
            .await
            .expect("delete the group");
    }
    stop.store(true, Ordering::Relaxed);
    writers.into_iter().for_each(|w| w.join().expect("writer"));
    let spread = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        format!("median {:.1}, most {:.1}", v[v.len() / 2], v[v.len() - 1])
    };
    let pace = pace.map_or("as fast as it can".to_owned(), |p| {
        format!("{p} times a second")
    });
    println!(
        "  a group of 4 image volumes, {GROUPS} group snapshots while a writer writes 4 KiB \
         {pace} into each: longest write per group (ms) {}; the call (ms) {}",
        spread(held),
        spread(calls)
    );
    for (id, staging) in staged {
        volumes.remove(&id, &staging).await;
    }
}

fn main() {
    bench::prepare("io");
    let seconds = std::env::var("BENCH_SECONDS").map_or(2.0, |s| s.parse().expect("seconds"));
    let image_bytes = match csi_nodekit::linux::privilege::holds_quota_override() {
        false => 16 * MIB,
        true => std::env::var("IMAGE_MIB").map_or(256, |m| m.parse().expect("MiB")) * MIB,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let own = tempfile::tempdir().expect("a directory under BENCH_DIR");
    let label = format!("{} (BENCH_DIR's own filesystem)", own.path().display());
    runtime.block_on(run(&label, own.path(), image_bytes, seconds));
    for kind in [Kind::Xfs, Kind::Btrfs, Kind::Ext4] {
        if selected(kind) {
            runtime.block_on(on_scratch(kind, image_bytes, seconds));
        }
    }
}
