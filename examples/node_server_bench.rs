//! Figures for `node-server`, printed (not asserted): resident memory idle, after a volume
//! lifecycle, after a handful of hostile requests (1–4 MB names and contexts) and after load;
//! and NodePublish+NodeUnpublish pairs per second with real bind
//! mounts at concurrency 1, 8 and 32 (each worker on its own staged volume, unstaged and
//! deleted after its level, so each level starts from the same mount table).
//!
//! `--scale` prints what `scripts/bench-node-scale.sh` compares at each size of the mount
//! table: the pairs, NodeGetVolumeStats latency and the kernel's floor (the pair's syscalls
//! alone). `--startup N` times node-server's start, to its first GetPluginInfo answered, with
//! N volume records in its state directory.
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
use support::floor::{self, Rate};
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

/// Runs `workers` loops of publish+unpublish for `seconds`, each on a volume of its own,
/// unstaged and deleted afterwards.
async fn run_level(c: &Clients, dir: &Path, workers: usize, seconds: f64) -> Rate {
    let mut volumes = Vec::new();
    for i in 0..workers {
        let mut c = c.clone();
        volumes.push(staged_volume(&mut c, dir, &format!("c{workers}-{i}")).await);
    }
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let tasks: Vec<_> = (volumes.iter().cloned().enumerate())
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
    let rate = Rate::of(all, started.elapsed());
    let mut c = c.clone();
    for (id, staging) in volumes {
        remove_volume(&mut c, id, &staging).await;
    }
    rate
}

/// Unstages and deletes a volume.
async fn remove_volume(c: &mut Clients, id: String, staging: &Path) {
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
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [] => all(seconds).await,
        ["--scale"] => scale(seconds).await,
        ["--startup", records] => startup(records.parse().expect("--startup N")).await,
        ["--pairs", pairs] => just_pairs(pairs.parse().expect("--pairs N")).await,
        _ => {
            eprintln!("usage: node_server_bench [--scale | --startup N | --pairs N]");
            std::process::exit(2);
        }
    }
}

/// Every figure of `scripts/bench-node-server.sh`.
async fn all(seconds: f64) {
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
    remove_volume(&mut c, id, &staging).await;
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
        let rate = run_level(&clients, &dir, workers, seconds).await;
        println!(
            "{:<14}{:>14.0}{:>12.2?}{:>12.2?}{:>10}{:>12}",
            workers,
            rate.per_second,
            rate.p50,
            rate.p99,
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
    unmount_under(&dir);
}

/// What `scripts/bench-node-scale.sh` prints at one size of the mount table: pairs at
/// concurrency 1, 8 and 32, NodeGetVolumeStats of a published volume one call after another,
/// and the floor of a pair (its syscalls alone, one thread), each for `seconds`.
async fn scale(seconds: f64) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().canonicalize().expect("resolve");
    let (server, channel) = support::node_server(&dir).await;
    let clients = Clients {
        node: NodeClient::new(channel.clone()),
        controller: ControllerClient::new(channel),
    };
    let pid = server.0.id();
    let mut pairs = Vec::new();
    for workers in [1, 8, 32] {
        let cpu = support::cpu_time(pid);
        let started = Instant::now();
        let rate = run_level(&clients, &dir, workers, seconds).await;
        let cpu = support::cpu_time(pid).saturating_sub(cpu).as_secs_f64();
        // The level's own stage, unstage, create and delete calls are in the CPU time too.
        let share = cpu / started.elapsed().as_secs_f64();
        println!(
            "publish+unpublish pairs, c={workers}: {rate}; server on CPU {:.0} µs a pair \
             ({share:.2} cores)",
            cpu * 1e6 / rate.count as f64
        );
        pairs.push(rate);
    }
    let mut c = clients.clone();
    let (id, staging) = staged_volume(&mut c, &dir, "stats").await;
    let target = dir.join("stats-target");
    let publish = NodePublishVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(capability()),
        ..Default::default()
    };
    c.node.node_publish_volume(publish).await.expect("publish");
    let request = NodeGetVolumeStatsRequest {
        volume_id: id.clone(),
        volume_path: target.display().to_string(),
        ..Default::default()
    };
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let mut latencies = Vec::new();
    while Instant::now() < deadline {
        let t = Instant::now();
        let reply = c.node.node_get_volume_stats(request.clone()).await;
        reply.expect("stats");
        latencies.push(t.elapsed());
    }
    println!(
        "NodeGetVolumeStats, one after another: {}",
        Rate::of(latencies, started.elapsed())
    );
    // What a pair's two calls cost with no work in them: the transport's own floor.
    let cpu = support::cpu_time(pid);
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let mut latencies = Vec::new();
    while Instant::now() < deadline {
        let t = Instant::now();
        for _ in 0..2 {
            let reply = c.node.node_get_capabilities(NodeGetCapabilitiesRequest {});
            reply.await.expect("capabilities");
        }
        latencies.push(t.elapsed());
    }
    let calls = Rate::of(latencies, started.elapsed());
    let cpu = support::cpu_time(pid).saturating_sub(cpu).as_secs_f64();
    println!(
        "two empty calls (NodeGetCapabilities), one pair after another: {calls}; server on CPU \
         {:.0} µs a pair",
        cpu * 1e6 / calls.count as f64
    );
    drop(server);
    unmount_under(&dir);
    let floor = tokio::task::block_in_place(|| floor::directory(&dir, seconds));
    println!("kernel floor (mkdir, bind, umount, rmdir; one thread): {floor}");
    let both = 1.0 / (1.0 / floor.per_second + 1.0 / calls.per_second);
    println!(
        "c=1 pairs are {:.0} % of the floor, {:.0} % of the floor and two empty calls \
         ({both:.0}/s); c=32 is {:.2}x c=8",
        100.0 * pairs[0].per_second / floor.per_second,
        100.0 * pairs[0].per_second / both,
        pairs[2].per_second / pairs[1].per_second
    );
}

/// Exactly `pairs` publish+unpublish pairs, one after another, on one staged volume: for
/// counting what one pair costs the server (`strace -c`, `perf stat` through `NODEKIT_BIN`).
async fn just_pairs(pairs: u32) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().canonicalize().expect("resolve");
    let (server, channel) = support::node_server(&dir).await;
    let mut c = Clients {
        node: NodeClient::new(channel.clone()),
        controller: ControllerClient::new(channel),
    };
    let (id, staging) = staged_volume(&mut c, &dir, "pairs").await;
    let target = dir.join("pairs-target");
    let started = Instant::now();
    for _ in 0..pairs {
        pair(&mut c, &id, &staging, &target).await;
    }
    let elapsed = started.elapsed();
    println!(
        "{pairs} pairs in {elapsed:.2?}: {:.0} µs each",
        elapsed.as_secs_f64() * 1e6 / f64::from(pairs)
    );
    remove_volume(&mut c, id, &staging).await;
    drop(server);
}

/// Creates `records` volumes, then starts node-server on their state directory three times:
/// the time from spawning it to its first GetPluginInfo answered, median and each run.
async fn startup(records: usize) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().canonicalize().expect("resolve");
    let (server, channel) = support::node_server(&dir).await;
    let mut c = Clients {
        node: NodeClient::new(channel.clone()),
        controller: ControllerClient::new(channel),
    };
    let created = Instant::now();
    for i in 0..records {
        let request = CreateVolumeRequest {
            name: format!("startup-{i}"),
            capacity_range: Some(CapacityRange {
                required_bytes: 1 << 20,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![capability()],
            ..Default::default()
        };
        c.controller.create_volume(request).await.expect("create");
    }
    let created = created.elapsed();
    drop(server);
    let mut runs = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        let server = support::spawn_node_server(&dir);
        support::first_plugin_info(&dir.join("csi.sock")).await;
        runs.push(started.elapsed());
        drop(server);
    }
    let mut sorted = runs.clone();
    sorted.sort();
    println!(
        "start-up with {records} volume records, to the first GetPluginInfo answered: \
         {:.1} ms median (runs {:.1?}; the {records} CreateVolume calls took {created:.1?})",
        sorted[1].as_secs_f64() * 1e3,
        runs
    );
}

/// Unmounts what a killed server left staged under `dir` in our namespace, deepest first.
fn unmount_under(dir: &Path) {
    let table = csi_nodekit::linux::mountinfo::MountTable::read().expect("mount table");
    let mut points: Vec<_> = table
        .mounts_under(dir)
        .map(|e| e.mount_point.clone())
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for point in points {
        let _ = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH);
    }
}
