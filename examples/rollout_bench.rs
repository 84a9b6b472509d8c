//! A surge rollout of the node plugin, printed (not asserted): two generations, each a
//! node-server and a registrar as processes on the same socket directory, registry and
//! `--state-dir`, under NodePublish+NodeUnpublish load, with `probe kubelet` watching the
//! registry. Each round: generation A serves and is registered; B starts (its node-server
//! waits for the state directory's lock, its registrar stands by); A's two processes get
//! SIGTERM at once, as a pod deletion sends it. Printed per round: old registrar's exit →
//! new registration socket; the window `probe kubelet` saw the driver unregistered
//! (deregistered → registered event; its reconciler, like the kubelet's, runs every second);
//! and every failed call by code. UNAVAILABLE (nothing listening for a moment) is what a
//! kubelet retries as a matter of course; any other failure is a defect.
//!
//! Runs the real binary (see `benches/support`); `REGISTRAR_BIN` runs another registrar
//! binary (to measure an older one). Needs root in a private mount namespace (real bind
//! mounts): `unshare --mount --propagation private target/release/examples/rollout_bench`.
//! `ROUNDS` (default 3), `WORKERS` (default 4), `OVERLAP_MS` (how long both generations run
//! side by side before the old one is stopped; default 3000).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use csi_nodekit::proto::csi::controller_client::ControllerClient;
use csi_nodekit::proto::csi::node_client::NodeClient;
use csi_nodekit::proto::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_nodekit::proto::csi::*;

#[path = "../benches/support/mod.rs"]
mod support;
use support::{Proc, binary};

const DRIVER: &str = "rollout.csi.example.io";

struct Paths {
    csi: PathBuf,
    registry: PathBuf,
    state: PathBuf,
    work: PathBuf,
}

impl Paths {
    fn reg_socket(&self) -> PathBuf {
        self.registry.join(format!("{DRIVER}-reg.sock"))
    }
}

/// A child whose stderr is read on a thread; `wait_for` blocks until a line contains a text.
fn spawn_watched(command: &mut Command) -> (Proc, std::sync::mpsc::Receiver<String>) {
    let mut child = command
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stderr = child.stderr.take().expect("stderr");
    let (said, heard) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = said.send(line);
        }
    });
    (Proc(child), heard)
}

fn wait_for(lines: &std::sync::mpsc::Receiver<String>, text: &str) {
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(15))
            .unwrap_or_else(|_| panic!("no line with {text:?} within 15 s"));
        if line.contains(text) {
            return;
        }
    }
}

/// One generation: node-server (serving, or waiting for the lock) and its registrar.
fn generation(p: &Paths, first: bool) -> (Proc, Proc) {
    let (server, lines) = spawn_watched(
        Command::new(binary())
            .arg("node-server")
            .arg(format!("--endpoint={}", p.csi.display()))
            .arg(format!("--state-dir={}", p.state.display()))
            .arg(format!("--driver-name={DRIVER}"))
            .arg("--node-id=bench")
            // Directory volumes wherever the bench runs: sizes not meant to hold.
            .arg("--quota=off"),
    );
    wait_for(
        &lines,
        if first {
            "serving CSI driver"
        } else {
            "waiting for it to exit"
        },
    );
    let registrar_bin = std::env::var("REGISTRAR_BIN").map_or_else(|_| binary(), PathBuf::from);
    let (registrar, lines) = spawn_watched(
        Command::new(registrar_bin)
            .arg("registrar")
            .arg("--v=2")
            .arg(format!("--csi-address={}", p.csi.display()))
            .arg(format!("--kubelet-registration-path={}", p.csi.display()))
            .arg(format!(
                "--plugin-registration-path={}",
                p.registry.display()
            )),
    );
    if first {
        wait_for(&lines, "registering through");
    } else {
        // Ours says "standing by"; an older registrar logs its failed bind and backs off.
        wait_for(&lines, "reg.sock");
    }
    std::thread::spawn(move || for _ in lines {});
    (server, registrar)
}

/// `probe kubelet --output=json`: each event with the moment it was read.
fn kubelet(
    p: &Paths,
) -> (
    Proc,
    std::sync::mpsc::Receiver<(Instant, serde_json::Value)>,
) {
    let mut child = Command::new(binary())
        .args(["probe", "kubelet", "--output=json", "--node-name=bench"])
        .arg(format!("--plugins-registry={}", p.registry.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn probe kubelet");
    let stdout = child.stdout.take().expect("stdout");
    let (send, events) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let event = serde_json::from_str(&line).expect("JSON event");
            if send.send((Instant::now(), event)).is_err() {
                break;
            }
        }
    });
    (Proc(child), events)
}

fn next_event(
    events: &std::sync::mpsc::Receiver<(Instant, serde_json::Value)>,
    kind: &str,
) -> Instant {
    let (at, event) = events
        .recv_timeout(Duration::from_secs(30))
        .expect("a kubelet event within 30 s");
    assert_eq!(event["event"], kind, "{event}");
    at
}

fn capability() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeMultiWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

type Codes = Arc<Mutex<BTreeMap<String, u64>>>;

fn count(codes: &Codes, what: &str) {
    *codes.lock().unwrap().entry(what.to_owned()).or_default() += 1;
}

/// A created and staged volume: its ID, staging path and target.
async fn staged(p: &Paths, i: usize) -> (String, PathBuf, PathBuf) {
    let channel = csi_nodekit::socket::connect(&p.csi).await.expect("connect");
    let id = ControllerClient::new(channel.clone())
        .create_volume(CreateVolumeRequest {
            name: format!("rollout-{i}"),
            volume_capabilities: vec![capability()],
            ..Default::default()
        })
        .await
        .expect("create")
        .into_inner()
        .volume
        .expect("volume")
        .volume_id;
    let staging = p.work.join(format!("staging-{i}"));
    let target = p.work.join(format!("target-{i}"));
    std::fs::create_dir_all(&staging).expect("staging dir");
    NodeClient::new(channel.clone())
        .node_stage_volume(NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(capability()),
            ..Default::default()
        })
        .await
        .expect("stage");
    (id, staging, target)
}

/// Publish+unpublish pairs on one staged volume until `stop`, redialling after a failure as
/// the kubelet does; every outcome counted.
async fn worker(
    p: Arc<Paths>,
    (id, staging, target): (String, PathBuf, PathBuf),
    codes: Codes,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let channel = csi_nodekit::socket::connect(&p.csi).await.expect("connect");
    let mut node = NodeClient::new(channel);
    let mut published = false;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let reply = if published {
            node.node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: id.clone(),
                target_path: target.display().to_string(),
            })
            .await
            .map(|_| ())
        } else {
            node.node_publish_volume(NodePublishVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: staging.display().to_string(),
                target_path: target.display().to_string(),
                volume_capability: Some(capability()),
                ..Default::default()
            })
            .await
            .map(|_| ())
        };
        match reply {
            Ok(()) => {
                count(&codes, "OK");
                published = !published;
            }
            Err(status) => {
                let what = match status.code() {
                    tonic::Code::Unavailable => "Unavailable".to_owned(),
                    code => format!("{code:?}: {}", csi_nodekit::deepest_cause(&status)),
                };
                count(&codes, &what);
                tokio::time::sleep(Duration::from_millis(20)).await;
                if let Ok(channel) = csi_nodekit::socket::connect(&p.csi).await {
                    node = NodeClient::new(channel);
                }
            }
        }
    }
}

fn sigterm(proc: &Proc) {
    let pid = nix::unistd::Pid::from_raw(proc.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds: usize = std::env::var("ROUNDS").map_or(3, |n| n.parse().expect("ROUNDS"));
    let workers: usize = std::env::var("WORKERS").map_or(4, |n| n.parse().expect("WORKERS"));
    let overlap = Duration::from_millis(
        std::env::var("OVERLAP_MS").map_or(3000, |n| n.parse().expect("OVERLAP_MS")),
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let p = Arc::new(Paths {
        csi: dir.path().join("plugin/csi.sock"),
        registry: dir.path().join("registry"),
        state: dir.path().join("state"),
        work: dir.path().join("pods"),
    });
    let (_kubelet, events) = kubelet(&p);
    let mut current = generation(&p, true);
    next_event(&events, "registered");
    let codes: Codes = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut volumes = Vec::new();
    for i in 0..workers {
        volumes.push(staged(&p, i).await);
    }
    let tasks: Vec<_> = volumes
        .into_iter()
        .map(|volume| tokio::spawn(worker(p.clone(), volume, codes.clone(), stop.clone())))
        .collect();
    println!(
        "surge rollout, {workers} publish/unpublish workers, {overlap:?} overlap, registrar {}",
        std::env::var("REGISTRAR_BIN").unwrap_or_else(|_| binary().display().to_string())
    );
    for round in 1..=rounds {
        let old_socket = csi_nodekit::socket::identity_of(&p.reg_socket());
        let next = tokio::task::block_in_place(|| generation(&p, false));
        // Both generations run side by side until the new pod is Ready and the old one is
        // deleted: at least one readiness period in a real rollout.
        tokio::time::sleep(overlap).await;
        let (mut old_server, mut old_registrar) = current;
        sigterm(&old_server);
        sigterm(&old_registrar);
        tokio::task::block_in_place(|| {
            old_registrar.0.wait().expect("reap the old registrar");
        });
        let exited = Instant::now();
        let socket_back = tokio::task::block_in_place(|| {
            loop {
                let now = csi_nodekit::socket::identity_of(&p.reg_socket());
                if now.is_some() && now != old_socket {
                    return exited.elapsed();
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        tokio::task::block_in_place(|| {
            old_server.0.wait().expect("reap the old node-server");
        });
        let (gone, back) = tokio::task::block_in_place(|| {
            (
                next_event(&events, "deregistered"),
                next_event(&events, "registered"),
            )
        });
        println!(
            "round {round}: old registrar's exit → new registration socket {:.1} ms; \
             unregistered as probe kubelet saw it {:.0} ms",
            socket_back.as_secs_f64() * 1e3,
            (back - gone).as_secs_f64() * 1e3
        );
        current = next;
        tokio::time::sleep(Duration::from_millis(500)).await; // load on the new generation
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in tasks {
        task.await.expect("worker");
    }
    println!("calls by outcome: {:?}", codes.lock().unwrap());
}
