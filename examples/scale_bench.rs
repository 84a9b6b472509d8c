//! Figures for the work that grows with a node's size, printed (not asserted), on the real
//! binary with its state directory on a scratch ext4 filesystem:
//! - start-up: from exec to the first GetPluginInfo answered, with no records, then with
//!   `VOLUMES` volume records and `SNAPSHOTS` snapshots made by real CreateVolume and
//!   CreateSnapshot calls, then with an orphan of `ORPHAN_FILES` files (an interrupted restore's
//!   directory) beside them, and when that orphan was gone;
//! - NodeGetVolumeStats for `STATS` staged volumes, one round as the kubelet asks every 60 s:
//!   the CPU time node-server spent on it (user + system, from `/proc/<pid>/task/*/schedstat`,
//!   and the kernel's clock ticks of `/proc/<pid>/stat` beside it) and the round's wall time;
//! - `IMAGES` image volumes of 16 MiB made and staged (a loop device and a mounted ext4 each),
//!   then each published and unpublished once:
//!   the memory each costs, a stats round, and the start-up with all of them attached.
//!
//! Runs the binary `benches/support` picks (static release build, else
//! `target/release/csi-nodekit`; `NODEKIT_BIN` overrides). Needs root in a private mount
//! namespace: `unshare --mount --propagation private target/release/examples/scale_bench`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi_nodekit::proto::csi::controller_client::ControllerClient;
use csi_nodekit::proto::csi::identity_client::IdentityClient;
use csi_nodekit::proto::csi::node_client::NodeClient;
use csi_nodekit::proto::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_nodekit::proto::csi::*;
use tonic::transport::Channel;

#[allow(dead_code)]
#[path = "support/bench.rs"]
mod bench;
#[path = "../benches/support/mod.rs"]
mod support;
use bench::scratch_fs::{Kind, ScratchFs};

fn count(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn capability() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeMultiWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

struct Server {
    proc: support::Proc,
    channel: Channel,
    /// From exec to the first GetPluginInfo answered.
    first_answer: Duration,
}

/// Starts node-server on `dir/csi.sock` with its state in `state`, and times its first answer.
async fn start(dir: &Path, state: &Path) -> Server {
    let socket = dir.join("csi.sock");
    let _ = std::fs::remove_file(&socket);
    let started = Instant::now();
    let proc = support::spawn(&[
        "node-server".to_owned(),
        format!("--endpoint={}", socket.display()),
        format!("--state-dir={}", state.display()),
        "--node-id=bench".to_owned(),
        // Directory volumes on whatever filesystem the bench runs on: sizes not meant to hold.
        "--quota=off".to_owned(),
    ]);
    loop {
        assert!(started.elapsed() < Duration::from_secs(60), "never served");
        if let Ok(channel) = csi_nodekit::socket::connect(&socket).await {
            let mut identity = IdentityClient::new(channel.clone());
            if identity
                .get_plugin_info(GetPluginInfoRequest {})
                .await
                .is_ok()
            {
                let first_answer = started.elapsed();
                return Server {
                    proc,
                    channel,
                    first_answer,
                };
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Stops a server and times `runs` starts on `state`; the first answers, sorted.
async fn restarts(dir: &Path, state: &Path, server: Server, runs: usize) -> Vec<Duration> {
    drop(server);
    let mut times = Vec::new();
    for _ in 0..runs {
        let server = start(dir, state).await;
        times.push(server.first_answer);
        drop(server);
    }
    times.sort();
    times
}

fn spread(times: &[Duration]) -> String {
    format!(
        "min {:.1?}, median {:.1?}, max {:.1?} ({} runs)",
        times[0],
        times[times.len() / 2],
        times[times.len() - 1],
        times.len()
    )
}

async fn create(controller: &mut ControllerClient<Channel>, name: &str) -> String {
    let request = CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 1 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability()],
        ..Default::default()
    };
    let response = controller.create_volume(request).await.expect("create");
    response.into_inner().volume.expect("volume").volume_id
}

/// CPU time of every thread of `pid` so far, in nanoseconds (schedstat's first field), and
/// user + system clock ticks from its stat.
fn cpu(pid: u32) -> (u64, u64) {
    let mut ns = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("tasks") {
        let path = task.expect("task").path().join("schedstat");
        let text = std::fs::read_to_string(path).unwrap_or_default();
        ns += text
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let fields: Vec<&str> = stat[stat.rfind(')').expect("comm") + 2..]
        .split(' ')
        .collect();
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the command name.
    let ticks = fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
    (ns, ticks)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_owned()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let volumes = count("VOLUMES", 1000);
    let snapshot_count = count("SNAPSHOTS", 200);
    let stats_volumes = count("STATS", 500).min(volumes);
    let orphan_files = count("ORPHAN_FILES", 86_000);
    let runs = count("RUNS", 5);
    // Each 1 MiB volume is promised 1,024 inodes, and ext4 makes one per 16 KiB: 1,000
    // volumes need 16 GiB of (sparse) filesystem, with room for the snapshots and the orphan.
    let fs = ScratchFs::sized(Kind::Ext4, "noatime", 24 << 30);
    let sandbox = tempfile::tempdir().expect("temp dir");
    let dir = sandbox.path().canonicalize().expect("resolve");
    let state = fs.path().join("state");
    println!("scale benchmark: {}", support::binary().display());
    println!("load before: {}", loadavg());

    let empty = start(&dir, &state).await;
    let times = restarts(&dir, &state, empty, runs).await;
    println!(
        "start-up, no records: first GetPluginInfo {}",
        spread(&times)
    );

    let server = start(&dir, &state).await;
    let mut controller = ControllerClient::new(server.channel.clone());
    let made = Instant::now();
    let mut ids = Vec::new();
    for i in 0..volumes {
        ids.push(create(&mut controller, &format!("v{i}")).await);
    }
    for (i, id) in ids.iter().take(snapshot_count).enumerate() {
        let request = CreateSnapshotRequest {
            source_volume_id: id.clone(),
            name: format!("s{i}"),
            ..Default::default()
        };
        controller.create_snapshot(request).await.expect("snapshot");
    }
    println!(
        "made {volumes} volumes and {snapshot_count} snapshots in {:.1?}",
        made.elapsed()
    );
    let times = restarts(&dir, &state, server, runs).await;
    println!(
        "start-up, {volumes} volumes and {snapshot_count} snapshots: first GetPluginInfo {}",
        spread(&times)
    );

    // An interrupted restore's directory: no record, many files.
    let orphan = state.join("volumes").join("vol-interrupted-restore");
    bench::volume(&orphan, orphan_files as u64, orphan_files as u64 * 64);
    nix::unistd::sync();
    let server = start(&dir, &state).await;
    let with_orphan = server.first_answer;
    let gone_at = Instant::now();
    let volumes_dir = state.join("volumes");
    let orphans_left = || {
        std::fs::read_dir(&volumes_dir)
            .expect("volumes")
            .any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with(".orphan-")))
    };
    while orphans_left() {
        assert!(gone_at.elapsed() < Duration::from_secs(600), "orphan stays");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "start-up with an orphan of {orphan_files} files: first GetPluginInfo {with_orphan:.1?}; \
         orphan gone {:.1?} later (in the background)",
        gone_at.elapsed()
    );

    // NodeGetVolumeStats: one round over staged volumes.
    let mut node = NodeClient::new(server.channel.clone());
    let mut staged = Vec::new();
    for (i, id) in ids.iter().take(stats_volumes).enumerate() {
        let staging: PathBuf = dir.join(format!("staging-{i}"));
        std::fs::create_dir_all(&staging).expect("staging dir");
        let request = NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(capability()),
            ..Default::default()
        };
        node.node_stage_volume(request).await.expect("stage");
        staged.push((id.clone(), staging));
    }
    let pid = server.proc.0.id();
    let rounds = count("STATS_ROUNDS", 5);
    let mut figures = Vec::new();
    for _ in 0..rounds {
        let (ns, ticks) = cpu(pid);
        let started = Instant::now();
        for (id, staging) in &staged {
            let request = NodeGetVolumeStatsRequest {
                volume_id: id.clone(),
                volume_path: staging.display().to_string(),
                ..Default::default()
            };
            node.node_get_volume_stats(request).await.expect("stats");
        }
        let wall = started.elapsed();
        let (ns_after, ticks_after) = cpu(pid);
        figures.push((ns_after - ns, ticks_after - ticks, wall));
    }
    figures.sort();
    let (ns, ticks, wall) = figures[figures.len() / 2];
    println!(
        "NodeGetVolumeStats, one round of {stats_volumes} volumes (median of {rounds}): \
         node-server CPU {:.1} ms (schedstat; {} clock ticks of user+sys), wall {wall:.1?}, \
         {:.1} µs CPU per call",
        ns as f64 / 1e6,
        ticks,
        ns as f64 / 1e3 / stats_volumes as f64
    );
    unstage_all(&mut node, &staged).await;
    let images = count("IMAGES", 500);
    if images > 0 {
        attached_images(&dir, &state, server, images, runs).await;
    } else {
        drop(server);
    }
    println!("load after: {}", loadavg());
}

/// Unstages each of `staged` (its ID and staging path).
async fn unstage_all(node: &mut NodeClient<Channel>, staged: &[(String, PathBuf)]) {
    for (id, staging) in staged {
        let request = NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
        };
        node.node_unstage_volume(request).await.expect("unstage");
    }
}

/// The kernel's own memory (slab, kernel stacks, page tables), in bytes: what a loop device
/// and a mounted filesystem add, without the page cache's coming and going.
fn memory_in_use() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").expect("meminfo");
    let field = |name: &str| -> u64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .expect("meminfo field");
        let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kib << 10
    };
    field("Slab:") + field("KernelStack:") + field("PageTables:")
}

/// node-server's resident memory, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS");
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        << 10
}

/// `count` image volumes of 16 MiB (`layout: image`) made and staged — each its own loop
/// device and mounted ext4 — then: the memory each one costs (the kernel's, and
/// node-server's), a stats round over them, and node-server's start-up with all of them
/// attached (it looks for freezes a crash left: one `stat` each).
async fn attached_images(dir: &Path, state: &Path, server: Server, count: usize, runs: usize) {
    let mut controller = ControllerClient::new(server.channel.clone());
    let mut node = NodeClient::new(server.channel.clone());
    let pid = server.proc.0.id();
    let (memory_before, rss_before) = (memory_in_use(), rss(pid));
    let made = Instant::now();
    let mut staged = Vec::new();
    for i in 0..count {
        let request = CreateVolumeRequest {
            name: format!("image-{i}"),
            capacity_range: Some(CapacityRange {
                required_bytes: 16 << 20,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![capability()],
            parameters: [("layout".into(), "image".into())].into(),
            ..Default::default()
        };
        let response = controller
            .create_volume(request)
            .await
            .expect("create image");
        let id = response.into_inner().volume.expect("volume").volume_id;
        let staging: PathBuf = dir.join(format!("image-staging-{i}"));
        std::fs::create_dir_all(&staging).expect("staging dir");
        let request = NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(capability()),
            ..Default::default()
        };
        node.node_stage_volume(request).await.expect("stage image");
        staged.push((id, staging));
    }
    let took = made.elapsed();
    let (memory_after, rss_after) = (memory_in_use(), rss(pid));
    println!(
        "{count} image volumes of 16 MiB made and staged (a loop device and an ext4 mount \
         each) in {took:.1?}: {:.0} KiB of the kernel's memory each (slab, kernel stacks and \
         page tables, the whole machine's), node-server's RSS {:.1} -> {:.1} MB",
        (memory_after.saturating_sub(memory_before)) as f64 / 1024.0 / count as f64,
        rss_before as f64 / 1e6,
        rss_after as f64 / 1e6
    );
    let started = Instant::now();
    for (id, staging) in &staged {
        let request = NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: staging.display().to_string(),
            ..Default::default()
        };
        node.node_get_volume_stats(request).await.expect("stats");
    }
    println!(
        "NodeGetVolumeStats of {count} staged image volumes: {:.1?} in all",
        started.elapsed()
    );
    let started = Instant::now();
    for (id, staging) in &staged {
        let target = staging.with_extension("target");
        let request = NodePublishVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(capability()),
            ..Default::default()
        };
        node.node_publish_volume(request)
            .await
            .expect("publish image");
        let request = NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.display().to_string(),
        };
        (node.node_unpublish_volume(request).await).expect("unpublish image");
    }
    let took = started.elapsed();
    println!(
        "NodePublishVolume + NodeUnpublishVolume of each of {count} staged image volumes: \
         {took:.1?} in all, {:.2?} a pair",
        took / count as u32
    );
    drop((controller, node));
    let times = restarts(dir, state, server, runs).await;
    println!(
        "start-up with {count} image volumes attached and mounted: first GetPluginInfo {}",
        spread(&times)
    );
    let server = start(dir, state).await;
    let mut node = NodeClient::new(server.channel.clone());
    let mut controller = ControllerClient::new(server.channel.clone());
    for (id, staging) in &staged {
        let request = NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
        };
        node.node_unstage_volume(request)
            .await
            .expect("unstage image");
        let request = DeleteVolumeRequest {
            volume_id: id.clone(),
            ..Default::default()
        };
        controller
            .delete_volume(request)
            .await
            .expect("delete image");
    }
}
