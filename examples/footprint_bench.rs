//! Figures for the footprint of a node's three long-running containers, printed (not
//! asserted): RSS, PSS and anonymous memory (`/proc/<pid>/smaps_rollup`) of node-server, the
//! registrar and `probe serve` running side by side on one binary — idle, after the publish
//! benchmark (NodePublish+NodeUnpublish pairs at concurrency 1, 8 and 32, kubelet-style probes on
//! both health ports), and after floods of 900 connections held open on each health port —
//! and the sum of their PSS, which is what the node pays for all three. The modes run in the
//! image's environment (its `GLIBC_TUNABLES`); set the variable, even empty, to run them in yours.
//!
//! Runs a fresh copy of the real binary (as `node_server_bench` finds it): the kernel maps a
//! binary's cached pages in folios whose size depends on how they entered the page cache (a
//! write, a sequential read, a fault), which moves the RSS of its text by a megabyte or more;
//! a fresh copy starts every run from the same state, a written file (or, with
//! `FOOTPRINT_PAGES=from-disk`, one whose pages were dropped from the cache). Needs root in a private
//! mount namespace: `unshare --mount --propagation private target/release/examples/footprint_bench`.
//! `BENCH_SECONDS` sets the time per concurrency level (default 2). `FOOTPRINT_RESIDENT=FILE`
//! writes the copy's pages in the page cache at the end, one page number a line: with the copy
//! on a filesystem without readahead (as `scripts/text-order.sh` runs it), the pages the three
//! modes touched. `FOOTPRINT_HOOK=PROGRAM` runs PROGRAM, and waits for it, at each step:
//! `PROGRAM copied PATH` once the copy is written and before any mode starts, then
//! `PROGRAM idle`, `PROGRAM load` and `PROGRAM flood` once each step's figures are printed
//! (`scripts/text-order.sh` counts the functions each step ran, with uprobes on the copy).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi_nodekit::proto::csi::controller_client::ControllerClient;
use csi_nodekit::proto::csi::node_client::NodeClient;
use csi_nodekit::proto::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_nodekit::proto::csi::*;
use csi_nodekit::proto::registration::{
    InfoRequest, RegistrationStatus, registration_client::RegistrationClient,
};
use tonic::transport::Channel;

#[path = "../benches/support/mod.rs"]
mod support;
use support::{Proc, binary, spawn};

/// Connections held open at once in one flood (the server tracks 64 and sheds the rest).
const FLOOD: usize = 900;

/// What `/proc/<pid>/smaps_rollup` says of a process, in KiB.
#[derive(Debug, Clone, Copy, Default)]
struct Footprint {
    rss: u64,
    pss: u64,
    anonymous: u64,
}

fn footprint(pid: u32) -> Footprint {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    Footprint {
        rss: field("Rss:"),
        pss: field("Pss:"),
        anonymous: field("Anonymous:"),
    }
}

fn mb(kib: u64) -> String {
    format!("{:.2}", kib as f64 / 1024.0)
}

fn capability() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeMultiWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

/// Creates and stages a volume; returns its ID and staging path.
async fn staged_volume(channel: &Channel, dir: &Path, name: &str) -> (String, PathBuf) {
    let request = CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 1 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability()],
        ..Default::default()
    };
    let reply = ControllerClient::new(channel.clone())
        .create_volume(request)
        .await
        .expect("create");
    let id = reply.into_inner().volume.expect("volume").volume_id;
    let staging = dir.join(format!("staging-{name}"));
    std::fs::create_dir_all(&staging).expect("staging dir");
    let stage = NodeStageVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(capability()),
        ..Default::default()
    };
    NodeClient::new(channel.clone())
        .node_stage_volume(stage)
        .await
        .expect("stage");
    (id, staging)
}

/// `workers` loops of publish+unpublish for `seconds`, each on its own staged volume; pairs/s.
async fn publish_level(channel: &Channel, dir: &Path, workers: usize, seconds: f64) -> f64 {
    let mut volumes = Vec::new();
    for i in 0..workers {
        volumes.push(staged_volume(channel, dir, &format!("c{workers}-{i}")).await);
    }
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let tasks: Vec<_> = volumes
        .into_iter()
        .enumerate()
        .map(|(i, (id, staging))| {
            let mut node = NodeClient::new(channel.clone());
            let target = dir
                .join(format!("target-{workers}-{i}"))
                .display()
                .to_string();
            tokio::spawn(async move {
                let mut pairs = 0u64;
                while Instant::now() < deadline {
                    let publish = NodePublishVolumeRequest {
                        volume_id: id.clone(),
                        staging_target_path: staging.display().to_string(),
                        target_path: target.clone(),
                        volume_capability: Some(capability()),
                        ..Default::default()
                    };
                    node.node_publish_volume(publish).await.expect("publish");
                    let unpublish = NodeUnpublishVolumeRequest {
                        volume_id: id.clone(),
                        target_path: target.clone(),
                    };
                    node.node_unpublish_volume(unpublish)
                        .await
                        .expect("unpublish");
                    pairs += 1;
                }
                pairs
            })
        })
        .collect();
    let mut pairs = 0;
    for task in tasks {
        pairs += task.await.expect("worker");
    }
    pairs as f64 / started.elapsed().as_secs_f64()
}

/// One kubelet-style probe: a new connection, `Connection: close`; the status code.
fn probe(address: &str) -> u16 {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    let request = "GET /healthz HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.33\r\n\
                   Connection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).expect("send probe");
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    String::from_utf8_lossy(&reply)
        .get(9..12)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

/// Holds `FLOOD` idle connections open on `address`, probes through them, lets them go, and
/// waits until the server answers again with every one of them gone.
fn flood(address: &str) {
    let idle: Vec<TcpStream> = (0..FLOOD)
        .filter_map(|_| TcpStream::connect(address).ok())
        .collect();
    for _ in 0..20 {
        assert_eq!(probe(address), 200, "{address}: /healthz under a flood");
    }
    drop(idle);
    assert_eq!(probe(address), 200, "{address}: /healthz after a flood");
}

async fn wait_for<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn free_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").to_string()
}

/// The registrar for node-server's `csi`, registered (as a kubelet would confirm it).
async fn registrar(dir: &Path, csi: &Path, http: &str) -> Proc {
    let registry = dir.join("registry");
    let socket = registry.join("nodekit.csi.local-reg.sock");
    let process = spawn(&[
        "registrar".to_owned(),
        format!("--csi-address={}", csi.display()),
        "--kubelet-registration-path=/var/lib/kubelet/plugins/nodekit.csi.local/csi.sock".into(),
        format!("--plugin-registration-path={}", registry.display()),
        format!("--http-endpoint={http}"),
    ]);
    let info = || async {
        let Ok(channel) = csi_nodekit::socket::connect(&socket).await else {
            return false;
        };
        RegistrationClient::new(channel)
            .get_info(InfoRequest {})
            .await
            .is_ok()
    };
    wait_for("the registration socket", info).await;
    let channel = csi_nodekit::socket::connect(&socket)
        .await
        .expect("connect");
    let ok = RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    };
    RegistrationClient::new(channel)
        .notify_registration_status(ok)
        .await
        .expect("registration status");
    process
}

struct Modes {
    pids: [(&'static str, u32); 3],
}

impl Modes {
    fn print(&self, when: &str, idle: Option<&[Footprint; 3]>) -> [Footprint; 3] {
        let now = self.pids.map(|(_, pid)| footprint(pid));
        for ((name, _), f) in self.pids.iter().zip(&now) {
            let ratio = idle
                .map(|idle| {
                    let before = idle[self.pids.iter().position(|p| p.0 == *name).unwrap()];
                    format!("{:.2}x idle", f.rss as f64 / before.rss as f64)
                })
                .unwrap_or_default();
            println!(
                "{when:<24}{name:<14}{:>8}{:>8}{:>12}   {ratio}",
                mb(f.rss),
                mb(f.pss),
                mb(f.anonymous)
            );
        }
        let pss: u64 = now.iter().map(|f| f.pss).sum();
        println!("{when:<24}{:<14}{:>8}{:>8}", "all three", "", mb(pss));
        now
    }
}

async fn run(dir: &Path) {
    let seconds: f64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let (server, channel) = support::node_server(dir).await;
    let csi = dir.join("csi.sock");
    let (registrar_http, probe_http) = (free_address(), free_address());
    let registrar = registrar(dir, &csi, &registrar_http).await;
    let probe_serve = spawn(&[
        "probe".to_owned(),
        "serve".to_owned(),
        format!("--csi-address={}", csi.display()),
        format!("--http-endpoint={probe_http}"),
    ]);
    let healthy = || async {
        let address = probe_http.clone();
        tokio::task::spawn_blocking(move || {
            TcpStream::connect(&address).is_ok() && probe(&address) == 200
        })
        .await
        .unwrap_or(false)
    };
    wait_for("probe serve's /healthz", healthy).await;
    let modes = Modes {
        pids: [
            ("node-server", server.0.id()),
            ("registrar", registrar.0.id()),
            ("probe serve", probe_serve.0.id()),
        ],
    };
    println!(
        "{:<24}{:<14}{:>8}{:>8}{:>12}",
        "MB", "mode", "RSS", "PSS", "anonymous"
    );
    // Settled: the start-up's work done, nothing but the idle loops running.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = modes.print("idle", None);
    hook(&["idle"]);

    let mut rates = Vec::new();
    for workers in [1, 8, 32] {
        rates.push(publish_level(&channel, dir, workers, seconds).await);
    }
    let addresses = [registrar_http.clone(), probe_http.clone()];
    tokio::task::spawn_blocking(move || {
        for address in &addresses {
            for _ in 0..500 {
                assert_eq!(probe(address), 200, "{address}: /healthz");
            }
        }
    })
    .await
    .expect("probes");
    tokio::time::sleep(Duration::from_secs(1)).await;
    modes.print("after publish load", Some(&idle));
    hook(&["load"]);

    let addresses = [registrar_http, probe_http];
    for round in 1..=2 {
        let addresses = addresses.clone();
        tokio::task::spawn_blocking(move || addresses.iter().for_each(|a| flood(a)))
            .await
            .expect("flood");
        tokio::time::sleep(Duration::from_secs(1)).await;
        modes.print(&format!("after {FLOOD}-conn flood {round}"), Some(&idle));
    }
    hook(&["flood"]);
    println!(
        "publish+unpublish pairs/s at concurrency 1 / 8 / 32: {:.0} / {:.0} / {:.0}",
        rates[0], rates[1], rates[2]
    );
    drop((registrar, probe_serve, server));
    if let Ok(list) = std::env::var("FOOTPRINT_RESIDENT") {
        let pages = resident_pages(&dir.join("csi-nodekit"));
        let lines: String = pages.iter().map(|p| format!("{p}\n")).collect();
        std::fs::write(&list, lines).expect("write the resident pages");
        println!(
            "{} pages of the binary in the page cache, listed in {list}",
            pages.len()
        );
    }
    // node-server was stopped with its volumes staged: unmount what it left in our namespace.
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

/// Runs `FOOTPRINT_HOOK`, if set, with `args`, and waits for it.
fn hook(args: &[&str]) {
    let Ok(program) = std::env::var("FOOTPRINT_HOOK") else {
        return;
    };
    let status = std::process::Command::new(&program)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("FOOTPRINT_HOOK {program}: {e}"));
    assert!(
        status.success(),
        "FOOTPRINT_HOOK {program} {args:?}: {status}"
    );
}

/// The numbers of `file`'s pages in the page cache (`mincore` of a mapping of it).
fn resident_pages(file: &Path) -> Vec<usize> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(file).expect("open the copy");
    let length = file.metadata().expect("the copy's size").len() as usize;
    // SAFETY: a new shared read-only mapping of a file we hold open; only mincore reads it.
    let mapped = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            length,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(mapped, libc::MAP_FAILED, "map the copy");
    let mut flags = vec![0u8; length.div_ceil(4096)];
    // SAFETY: `flags` has one byte per page of the mapping, which is unmapped just after.
    let answer = unsafe { libc::mincore(mapped, length, flags.as_mut_ptr()) };
    let error = std::io::Error::last_os_error();
    // SAFETY: the mapping made above, of this length, used by nothing else.
    unsafe { libc::munmap(mapped, length) };
    assert_eq!(answer, 0, "mincore: {error}");
    (0..flags.len())
        .filter(|&page| flags[page] & 1 == 1)
        .collect()
}

/// Writes the copy out and drops its pages from the page cache, so the modes read it as a
/// node does long after the image was unpacked: by faults and readahead, not as written.
fn drop_cached_pages(copy: &Path) {
    let file = std::fs::File::open(copy).expect("open the copy");
    file.sync_all().expect("fsync the copy");
    nix::fcntl::posix_fadvise(
        &file,
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    )
    .expect("drop the copy's pages");
}

fn main() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().canonicalize().expect("resolve");
    let original = binary();
    let copy = dir.join("csi-nodekit");
    std::fs::copy(&original, &copy).expect("copy the binary");
    hook(&["copied", &copy.to_string_lossy()]);
    let size = std::fs::metadata(&copy).expect("binary").len();
    let from_disk = std::env::var("FOOTPRINT_PAGES").as_deref() == Ok("from-disk");
    if from_disk {
        drop_cached_pages(&copy);
    }
    println!(
        "footprint benchmark: {} ({size} bytes), a fresh copy, {}",
        original.display(),
        match from_disk {
            true => "its pages dropped from the cache (they come in by faults and readahead)",
            false => "its pages as written (FOOTPRINT_PAGES=from-disk drops them first)",
        }
    );
    match std::env::var("GLIBC_TUNABLES") {
        Ok(yours) => println!("the modes run with your GLIBC_TUNABLES={yours:?}"),
        Err(_) => {
            let env: Vec<String> = support::image_env()
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            println!("the modes run with the image's {}", env.join(" "));
        }
    }
    // SAFETY: no other thread runs yet; `support::binary` reads NODEKIT_BIN.
    unsafe { std::env::set_var("NODEKIT_BIN", &copy) };
    // Room for the floods' connections beside our own descriptors.
    if let Ok((_, hard)) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    {
        let _ =
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard);
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(run(&dir));
}
