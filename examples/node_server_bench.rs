//! Figures for `node-server`, printed (not asserted): resident memory idle, after a volume
//! lifecycle, after a handful of hostile requests (1–4 MB names and contexts) and after load;
//! and NodePublish+NodeUnpublish pairs per second with real bind
//! mounts at concurrency 1, 8 and 32 (each worker on its own staged volume).
//!
//! Runs the real binary: the static release build if present (`scripts/build-static.sh`),
//! else `target/release/csi-nodekit`; `NODEKIT_BIN` overrides. Needs root in a private mount
//! namespace; `scripts/bench-node-server.sh` sets that up. `BENCH_SECONDS` sets the time per
//! concurrency level (default 3).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi_nodekit::proto::csi::controller_client::ControllerClient;
use csi_nodekit::proto::csi::node_client::NodeClient;
use csi_nodekit::proto::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_nodekit::proto::csi::*;
use tonic::transport::Channel;

#[path = "../benches/support/mod.rs"]
mod support;
use support::{binary, mb, memory_kib, threads};

fn capability() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeMultiWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

#[derive(Clone)]
struct Clients {
    node: NodeClient<Channel>,
    controller: ControllerClient<Channel>,
}

/// Creates and stages a volume; returns its ID and staging path.
async fn staged_volume(c: &mut Clients, dir: &Path, name: &str) -> (String, PathBuf) {
    let id = c
        .controller
        .create_volume(CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 1 << 20,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![capability()],
            ..Default::default()
        })
        .await
        .expect("create")
        .into_inner()
        .volume
        .expect("volume")
        .volume_id;
    let staging = dir.join(format!("staging-{name}"));
    std::fs::create_dir_all(&staging).expect("staging dir");
    c.node
        .node_stage_volume(NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(capability()),
            ..Default::default()
        })
        .await
        .expect("stage");
    (id, staging)
}

async fn pair(c: &mut Clients, id: &str, staging: &Path, target: &Path) {
    c.node
        .node_publish_volume(NodePublishVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(capability()),
            ..Default::default()
        })
        .await
        .expect("publish");
    c.node
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: id.into(),
            target_path: target.display().to_string(),
        })
        .await
        .expect("unpublish");
}

/// Runs `workers` loops of publish+unpublish for `seconds`; returns pairs/s, p50 and p99.
async fn run_level(
    c: &Clients,
    dir: &Path,
    workers: usize,
    seconds: f64,
) -> (f64, Duration, Duration) {
    let mut volumes = Vec::new();
    for i in 0..workers {
        let mut c = c.clone();
        volumes.push(staged_volume(&mut c, dir, &format!("c{workers}-{i}")).await);
    }
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let tasks: Vec<_> = volumes
        .into_iter()
        .enumerate()
        .map(|(i, (id, staging))| {
            let mut c = c.clone();
            let target = dir.join(format!("target-{workers}-{i}"));
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    pair(&mut c, &id, &staging, &target).await;
                    latencies.push(t.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("worker"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort();
    let at = |p: f64| all[((all.len() as f64 - 1.0) * p).round() as usize];
    (all.len() as f64 / elapsed, at(0.5), at(0.99))
}

/// Sixteen requests of 1–4 MB (names, volume contexts; the last eight at once), as a careless
/// or hostile client sends them; the codes node-server answered.
async fn hostile(c: &Clients, dir: &Path) -> Vec<tonic::Code> {
    let create = |name: String| CreateVolumeRequest {
        name,
        volume_capabilities: vec![capability()],
        ..Default::default()
    };
    let code = |r: Result<(), tonic::Status>| r.map_or_else(|s| s.code(), |()| tonic::Code::Ok);
    let mut c = c.clone();
    let mut codes = Vec::new();
    for mib in [1, 2, 4, 4] {
        let request = create("n".repeat(mib << 20));
        codes.push(code(c.controller.create_volume(request).await.map(drop)));
    }
    for i in 0..4 {
        let request = NodePublishVolumeRequest {
            volume_id: format!("vol-{i}"),
            staging_target_path: dir.join("s").display().to_string(),
            target_path: dir.join("t").display().to_string(),
            volume_capability: Some(capability()),
            volume_context: [("k".to_owned(), "v".repeat(4 << 20))].into(),
            ..Default::default()
        };
        codes.push(code(c.node.node_publish_volume(request).await.map(drop)));
    }
    let at_once: Vec<_> = (0..8)
        .map(|i| {
            let mut c = c.clone();
            let request = create(format!("{i}{}", "n".repeat(4 << 20)));
            tokio::spawn(async move { c.controller.create_volume(request).await.map(drop) })
        })
        .collect();
    for call in at_once {
        codes.push(code(call.await.expect("join")));
    }
    codes
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let seconds: f64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().canonicalize().expect("resolve");
    let bin = binary();
    let (server, channel) = support::node_server(&dir).await;
    let pid = server.0.id();
    let clients = Clients {
        node: NodeClient::new(channel.clone()),
        controller: ControllerClient::new(channel),
    };
    let mut c = clients.clone();
    c.node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .expect("info");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = memory_kib(pid);

    // One full lifecycle: create, stage, publish, stats, unpublish, unstage, delete.
    let (id, staging) = staged_volume(&mut c, &dir, "lifecycle").await;
    let target = dir.join("lifecycle-target");
    pair(&mut c, &id, &staging, &target).await;
    c.node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: staging.display().to_string(),
            ..Default::default()
        })
        .await
        .expect("stats");
    c.node
        .node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .expect("unstage");
    c.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: id,
            ..Default::default()
        })
        .await
        .expect("delete");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after_lifecycle = memory_kib(pid);
    let mut answers = hostile(&clients, &dir).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after_hostile = memory_kib(pid);
    answers.dedup();

    println!("node-server benchmark: {}", bin.display());
    println!(
        "binary size: {} KiB",
        std::fs::metadata(&bin).map(|m| m.len() / 1024).unwrap_or(0)
    );
    println!("{:<28}{:>10}{:>12}", "memory", "VmRSS", "VmHWM");
    println!(
        "{:<28}{:>10}{:>12}",
        "idle (1 s after start)",
        mb(idle.0),
        mb(idle.1)
    );
    println!(
        "{:<28}{:>10}{:>12}",
        "after one lifecycle",
        mb(after_lifecycle.0),
        mb(after_lifecycle.1)
    );
    println!(
        "{:<28}{:>10}{:>12}   answered {answers:?}",
        "after 16 requests of 1-4 MB",
        mb(after_hostile.0),
        mb(after_hostile.1),
    );
    println!();
    println!(
        "{:<14}{:>14}{:>12}{:>12}{:>10}{:>12}",
        "concurrency", "pairs/s", "p50", "p99", "threads", "VmRSS"
    );
    for workers in [1, 8, 32] {
        let (rate, p50, p99) = run_level(&clients, &dir, workers, seconds).await;
        println!(
            "{:<14}{:>14.0}{:>12.2?}{:>12.2?}{:>10}{:>12}",
            workers,
            rate,
            p50,
            p99,
            threads(pid),
            mb(memory_kib(pid).0)
        );
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = memory_kib(pid);
    println!();
    println!(
        "after load: VmRSS {} (peak {}), {} threads",
        mb(after.0),
        mb(after.1),
        threads(pid)
    );
    // What every call pays for "the mount table is the truth", at this many mounts.
    let reads = 500;
    let started = Instant::now();
    let mut text = Vec::new();
    for _ in 0..reads {
        text = std::fs::read("/proc/self/mountinfo").expect("mountinfo");
    }
    let read = started.elapsed() / reads;
    let started = Instant::now();
    let mut entries = 0;
    for _ in 0..reads {
        let table = csi_nodekit::linux::mountinfo::MountTable::parse(&text);
        entries = table.entries().len();
    }
    println!(
        "mount table: {entries} entries ({} bytes): read {read:.0?}, parse {:.0?}",
        text.len(),
        started.elapsed() / reads
    );
    drop(server);
    // The server was killed with its volumes staged: unmount what it left in our namespace.
    let table = csi_nodekit::linux::mountinfo::MountTable::read().expect("mount table");
    let mut points: Vec<_> = table
        .mounts_under(&dir)
        .map(|e| e.mount_point.clone())
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for point in points {
        let _ = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH);
    }
}
