//! Figures for I/O inside an image volume (`layout: image`) against the same I/O on the state
//! directory's filesystem itself, printed (not asserted): 4 KiB direct I/O (`O_DIRECT`),
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
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi_nodekit::proto::csi::controller_client::ControllerClient;
use csi_nodekit::proto::csi::node_client::NodeClient;
use csi_nodekit::proto::csi::volume_capability::access_mode::Mode;
use csi_nodekit::proto::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_nodekit::proto::csi::*;

#[allow(dead_code)]
#[path = "support/bench.rs"]
mod bench;
use bench::scratch_fs::{Kind, ScratchFs};
use bench::{GIB, MIB, selected};

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

fn capability() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
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
    served.stop().await;
}

/// Image volumes made, staged and removed for the benchmark.
struct Volumes {
    controller: ControllerClient<tonic::transport::Channel>,
    node: NodeClient<tonic::transport::Channel>,
    dir: std::path::PathBuf,
}

impl Volumes {
    /// An image volume of `bytes` with `directIO` as given, staged: its ID and staging path.
    async fn staged(&mut self, name: &str, bytes: u64, direct_io: &str) -> (String, PathBuf) {
        let create = CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange {
                required_bytes: bytes as i64,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![capability()],
            parameters: [
                ("layout".into(), "image".into()),
                ("directIO".into(), direct_io.into()),
            ]
            .into(),
            ..Default::default()
        };
        let created = self.controller.create_volume(create).await.expect("create");
        let id = created.into_inner().volume.expect("volume").volume_id;
        let staging = self.dir.join(format!("staging-{name}"));
        std::fs::create_dir(&staging).expect("staging path");
        let stage = NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(capability()),
            ..Default::default()
        };
        self.node.node_stage_volume(stage).await.expect("stage");
        (id, staging)
    }

    async fn remove(&mut self, id: &str, staging: &Path) {
        std::fs::remove_file(staging.join("file")).expect("remove");
        let unstage = NodeUnstageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
        };
        self.node
            .node_unstage_volume(unstage)
            .await
            .expect("unstage");
        let delete = DeleteVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        };
        self.controller.delete_volume(delete).await.expect("delete");
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
