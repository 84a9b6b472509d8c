//! Helpers for benchmarks that drive the real binary: which binary, a process guard, and its
//! memory figures, node-server started for a benchmark. Shared by `examples/node_server_bench.rs`
//! and `examples/block_bench.rs`; sidecar benchmarks can
//! `#[path]`-include it too. (A subdirectory of `benches/` is not a bench target itself.)
#![allow(dead_code)]

pub mod floor;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// The binary to measure: `NODEKIT_BIN`, else the static release build if present
/// (`scripts/build-static.sh`), else `target/release/csi-nodekit`.
pub fn binary() -> PathBuf {
    if let Ok(path) = std::env::var("NODEKIT_BIN") {
        return path.into();
    }
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let static_build = Path::new(&target).join("x86_64-unknown-linux-gnu/release/csi-nodekit");
    if static_build.exists() {
        static_build
    } else {
        Path::new(&target).join("release/csi-nodekit")
    }
}

/// The environment the image gives every mode (its `ENV` lines): the figures are the image's.
/// A variable already set here is left as it is, so `GLIBC_TUNABLES= <bench>` measures
/// glibc's defaults.
pub fn image_env() -> Vec<(String, String)> {
    let containerfile = concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/Containerfile");
    let text = std::fs::read_to_string(containerfile).expect("read packaging/Containerfile");
    text.lines()
        .filter_map(|line| line.strip_prefix("ENV ")?.split_once('='))
        .filter(|(name, _)| std::env::var_os(name).is_none())
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

/// The binary started with `args` in the image's environment, its stderr discarded, stopped
/// on drop.
pub fn spawn(args: &[String]) -> Proc {
    Proc(
        std::process::Command::new(binary())
            .args(args)
            .envs(image_env())
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn"),
    )
}

/// node-server on `<dir>/csi.sock` with its state in `<dir>/state` (node ID `bench`), once
/// its socket is up, and a channel to it.
pub async fn node_server(dir: &Path) -> (Proc, tonic::transport::Channel) {
    let socket = dir.join("csi.sock");
    let server = spawn_node_server(dir);
    let started = Instant::now();
    while !socket.exists() {
        // Generous: under scripts/text-order.sh's uprobes a start-up runs some 30 times slower.
        assert!(started.elapsed() < Duration::from_secs(60), "no socket");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let channel = csi_nodekit::socket::connect(&socket)
        .await
        .expect("connect");
    (server, channel)
}

/// node-server started as [`node_server`] starts it, not waited for.
pub fn spawn_node_server(dir: &Path) -> Proc {
    spawn(&[
        "node-server".to_owned(),
        format!("--endpoint={}", dir.join("csi.sock").display()),
        format!("--state-dir={}", dir.join("state").display()),
        "--node-id=bench".to_owned(),
        // Directory volumes wherever the bench runs: sizes not meant to hold there.
        "--quota=off".to_owned(),
    ])
}

/// Waits (polling every 100 µs, for at most 60 s) until the node-server at `socket` answers
/// GetPluginInfo.
pub async fn first_plugin_info(socket: &Path) {
    use csi_nodekit::proto::csi::GetPluginInfoRequest;
    use csi_nodekit::proto::csi::identity_client::IdentityClient;
    let started = Instant::now();
    loop {
        assert!(started.elapsed() < Duration::from_secs(60), "never served");
        if let Ok(channel) = csi_nodekit::socket::connect(socket).await
            && IdentityClient::new(channel)
                .get_plugin_info(GetPluginInfoRequest {})
                .await
                .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_micros(100)).await;
    }
}

/// A child process stopped on drop the way Kubernetes stops containers: SIGTERM, then SIGKILL
/// after 5 s (a plain SIGKILL would leave sockets behind and skew the next measurement).
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// VmRSS and VmHWM (resident now, resident at peak) of a process, in KiB.
pub fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Time every thread of a process has spent on a CPU so far (from each thread's
/// `schedstat`; threads that ended are not counted).
pub fn cpu_time(pid: u32) -> Duration {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Duration::ZERO;
    };
    let nanos: u64 = (tasks.flatten())
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(nanos)
}

/// Threads of a process.
pub fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// KiB as megabytes with two decimals.
pub fn mb(kib: u64) -> String {
    format!("{:.2} MB", kib as f64 / 1024.0)
}
