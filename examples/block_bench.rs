//! Figures for raw block volumes, printed (not asserted): NodePublish+NodeUnpublish pairs per
//! second of block volumes at concurrency 1 and 8, each worker on its own staged volume (a
//! sparse file on a real loop device, its device node bound onto a target file and removed
//! again), read-write (the staged device) and read-only (a read-only loop device attached and
//! detached with every pair); and one stage+unstage (attach, detach) for comparison.
//!
//! Runs the real binary (as `node_server_bench` finds it), with its state directory under
//! `BENCH_DIR` (default: the system's temporary directory). Needs root in a private mount
//! namespace; `scripts/bench-node-server.sh` sets that up. `BENCH_SECONDS` sets the time per
//! level (default 3). `--scale` prints what `scripts/bench-node-scale.sh` compares at each size
//! of the mount table: read-write pairs at concurrency 1 and 8 and the floor of a pair (its
//! syscalls alone, one thread, on a loop device of its own).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi_nodekit::proto::csi::controller_client::ControllerClient;
use csi_nodekit::proto::csi::node_client::NodeClient;
use csi_nodekit::proto::csi::volume_capability::{AccessMode, AccessType, BlockVolume};
use csi_nodekit::proto::csi::*;
use tonic::transport::Channel;

#[path = "../benches/support/mod.rs"]
mod support;
use support::floor::{self, Rate};
use support::{binary, mb, memory_kib};

fn capability() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeMultiWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

#[derive(Clone)]
struct Clients {
    node: NodeClient<Channel>,
    controller: ControllerClient<Channel>,
}

fn stage_request(id: &str, staging: &Path) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(capability()),
        ..Default::default()
    }
}

fn unstage_request(id: &str, staging: &Path) -> NodeUnstageVolumeRequest {
    NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
    }
}

/// Creates and stages a 64 MiB block volume; returns its ID and staging path.
async fn staged_volume(c: &mut Clients, dir: &Path, name: &str) -> (String, PathBuf) {
    let request = CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 64 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability()],
        ..Default::default()
    };
    let reply = c.controller.create_volume(request).await.expect("create");
    let id = reply.into_inner().volume.expect("volume").volume_id;
    let staging = dir.join(format!("staging-{name}"));
    std::fs::create_dir_all(&staging).expect("staging dir");
    c.node
        .node_stage_volume(stage_request(&id, &staging))
        .await
        .expect("stage");
    (id, staging)
}

async fn pair(c: &mut Clients, id: &str, staging: &Path, target: &Path, readonly: bool) {
    let publish = NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(capability()),
        readonly,
        ..Default::default()
    };
    c.node.node_publish_volume(publish).await.expect("publish");
    let unpublish = NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.display().to_string(),
    };
    c.node
        .node_unpublish_volume(unpublish)
        .await
        .expect("unpublish");
}

/// `workers` loops of publish+unpublish for `seconds`; pairs/s, p50 and p99.
async fn run_level(
    volumes: &[(String, PathBuf)],
    c: &Clients,
    dir: &Path,
    readonly: bool,
    seconds: f64,
) -> Rate {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let tasks: Vec<_> = (volumes.iter().cloned().enumerate())
        .map(|(i, (id, staging))| {
            let mut c = c.clone();
            let target = dir.join(format!("target-{}-{i}", volumes.len()));
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    pair(&mut c, &id, &staging, &target, readonly).await;
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
    Rate::of(all, started.elapsed())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let seconds: f64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let base = std::env::var_os("BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let tmp = tempfile::tempdir_in(base).expect("temp dir");
    let dir = tmp.path().canonicalize().expect("resolve");
    if std::env::args().nth(1).as_deref() == Some("--scale") {
        return scale(&dir, seconds).await;
    }
    let bin = binary();
    let (server, channel) = support::node_server(&dir).await;
    let pid = server.0.id();
    let clients = Clients {
        node: NodeClient::new(channel.clone()),
        controller: ControllerClient::new(channel),
    };
    let fs = nix::sys::statfs::statfs(&dir).expect("statfs");
    println!("block volume benchmark: {}", bin.display());
    println!(
        "state directory {} (filesystem magic {:#x})",
        dir.display(),
        fs.filesystem_type().0
    );

    let mut c = clients.clone();
    let (id, staging) = staged_volume(&mut c, &dir, "attach").await;
    let rounds = 20;
    let t = Instant::now();
    for _ in 0..rounds {
        c.node
            .node_unstage_volume(unstage_request(&id, &staging))
            .await
            .expect("unstage");
        c.node
            .node_stage_volume(stage_request(&id, &staging))
            .await
            .expect("stage");
    }
    println!(
        "stage+unstage (attach, detach a loop device): {:.2?} per pair, mean of {rounds}",
        t.elapsed() / rounds
    );
    println!();
    println!(
        "{:<14}{:<12}{:>12}{:>12}{:>12}{:>12}",
        "concurrency", "publish", "pairs/s", "p50", "p99", "VmRSS"
    );
    let mut all = vec![(id, staging)];
    for workers in [1, 8] {
        let volumes: Vec<_> = {
            let mut v = Vec::new();
            for i in 0..workers {
                v.push(staged_volume(&mut c, &dir, &format!("c{workers}-{i}")).await);
            }
            v
        };
        for readonly in [false, true] {
            let rate = run_level(&volumes, &clients, &dir, readonly, seconds).await;
            println!(
                "{:<14}{:<12}{:>12.0}{:>12.2?}{:>12.2?}{:>12}",
                workers,
                if readonly { "read-only" } else { "read-write" },
                rate.per_second,
                rate.p50,
                rate.p99,
                mb(memory_kib(pid).0)
            );
        }
        all.extend(volumes);
    }
    for (id, staging) in &all {
        c.node
            .node_unstage_volume(unstage_request(id, staging))
            .await
            .expect("unstage");
        let delete = DeleteVolumeRequest {
            volume_id: id.clone(),
            ..Default::default()
        };
        c.controller.delete_volume(delete).await.expect("delete");
    }
    drop(server);
}

/// Read-write pairs at concurrency 1 and 8, then the floor: the same syscalls alone on a loop
/// device attached here, after node-server is gone.
async fn scale(dir: &Path, seconds: f64) {
    let (server, channel) = support::node_server(dir).await;
    let mut c = Clients {
        node: NodeClient::new(channel.clone()),
        controller: ControllerClient::new(channel),
    };
    let mut pairs = Vec::new();
    let mut all = Vec::new();
    for workers in [1, 8] {
        let mut volumes = Vec::new();
        for i in 0..workers {
            volumes.push(staged_volume(&mut c, dir, &format!("c{workers}-{i}")).await);
        }
        let rate = run_level(&volumes, &c, dir, false, seconds).await;
        println!("block publish+unpublish pairs, c={workers}: {rate}");
        pairs.push(rate);
        all.extend(volumes);
    }
    for (id, staging) in &all {
        let unstage = c.node.node_unstage_volume(unstage_request(id, staging));
        unstage.await.expect("unstage");
    }
    drop(server);
    use csi_nodekit::linux::loopdev;
    let image = dir.join("floor-image");
    loopdev::create_backing_file(&image, 64 << 20).expect("image");
    let device = loopdev::attach(&image, loopdev::AttachOptions::default()).expect("attach");
    let floor = tokio::task::block_in_place(|| floor::block(dir, &device.device.path(), seconds));
    loopdev::detach(device.device, &image).expect("detach");
    println!(
        "block kernel floor (create, bind the device node, umount, unlink; one thread): {floor}"
    );
    println!(
        "block c=1 pairs are {:.0} % of their floor",
        100.0 * pairs[0].per_second / floor.per_second
    );
}
