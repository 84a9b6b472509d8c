//! Figures for the sidecar modes, printed (not asserted): registrar and livenessprobe memory,
//! registrar start-to-GetInfo time, /healthz latency at concurrency 1 and 8, and `probe once`
//! process start-to-exit time. Runs the real binary: the static release build if present
//! (`scripts/build-static.sh`), else `target/release/csi-nodekit`; `NODEKIT_BIN` overrides.
//!
//! `cargo bench --bench sidecars`

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "support/mod.rs"]
mod support;
use support::{binary, mb, memory_kib, spawn};

use csi_nodekit::proto::registration::{
    InfoRequest, RegistrationStatus, registration_client::RegistrationClient,
};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn get_info(socket: &Path) -> Option<String> {
    let channel = csi_nodekit::socket::connect(socket).await.ok()?;
    Some(
        RegistrationClient::new(channel)
            .get_info(InfoRequest {})
            .await
            .ok()?
            .into_inner()
            .name,
    )
}

async fn wait_for<F: std::future::Future<Output = bool>>(mut check: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

async fn registrar(dir: &Path, csi: &Path) {
    let registry = dir.join("registry");
    let reg_socket = registry.join("nodekit.csi.local-reg.sock");
    let args = |http: u16| {
        vec![
            "registrar".to_owned(),
            format!("--csi-address={}", csi.display()),
            "--kubelet-registration-path=/var/lib/kubelet/plugins/nodekit.csi.local/csi.sock"
                .to_owned(),
            format!("--plugin-registration-path={}", registry.display()),
            format!("--http-endpoint=127.0.0.1:{http}"),
        ]
    };
    let mut starts = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        let process = spawn(&args(free_port()));
        wait_for(|| async { get_info(&reg_socket).await.is_some() }).await;
        starts.push(started.elapsed());
        drop(process);
        wait_for(|| async { !reg_socket.exists() }).await;
    }
    starts.sort();
    println!(
        "registrar: start to a registration socket answering GetInfo: median {:?}, min {:?}, max {:?} (10 runs, driver up)",
        percentile(&starts, 0.5),
        starts[0],
        starts[starts.len() - 1]
    );

    let process = spawn(&args(free_port()));
    wait_for(|| async { get_info(&reg_socket).await.is_some() }).await;
    let channel = csi_nodekit::socket::connect(&reg_socket).await.unwrap();
    let ok = RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    };
    RegistrationClient::new(channel)
        .notify_registration_status(ok)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rss, peak) = memory_kib(process.0.id());
    println!(
        "registrar: idle after registration: RSS {} (peak {}); upstream v2.17 measured here: 19.5 MB",
        mb(rss),
        mb(peak)
    );
}

async fn healthz_latencies(address: &str, concurrency: usize, per_task: usize) -> Vec<Duration> {
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let address = address.to_owned();
            tokio::spawn(async move {
                let mut times = Vec::with_capacity(per_task);
                for _ in 0..per_task {
                    let started = Instant::now();
                    let (code, _) =
                        csi_nodekit::http::get(&address, "/healthz", Duration::from_secs(5))
                            .await
                            .unwrap();
                    assert_eq!(code, 200);
                    times.push(started.elapsed());
                }
                times
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all.sort();
    all
}

async fn livenessprobe(csi: &Path) {
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let process = spawn(&[
        "probe".into(),
        "serve".into(),
        format!("--csi-address={}", csi.display()),
        format!("--http-endpoint={address}"),
    ]);
    wait_for(|| async {
        csi_nodekit::http::get(&address, "/healthz", Duration::from_secs(1))
            .await
            .is_ok()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (idle, _) = memory_kib(process.0.id());
    let _ = healthz_latencies(&address, 1, 500).await;
    let (after_500, _) = memory_kib(process.0.id());
    for concurrency in [1, 8] {
        let times = healthz_latencies(&address, concurrency, 2000 / concurrency).await;
        println!(
            "probe serve: /healthz latency at concurrency {concurrency}: p50 {:?}, p99 {:?} ({} requests, new connection each)",
            percentile(&times, 0.5),
            percentile(&times, 0.99),
            times.len()
        );
    }
    let (after_load, peak) = memory_kib(process.0.id());
    println!(
        "probe serve: RSS idle {}, after 500 probes {}, after 4500 probes {} (peak {}); upstream v2.19 measured here: 20.4 MB idle, 25 MB after 500",
        mb(idle),
        mb(after_500),
        mb(after_load),
        mb(peak)
    );
}

fn probe_once(csi: &Path) {
    let mut times: Vec<Duration> = (0..50)
        .map(|_| {
            let started = Instant::now();
            let status = Command::new(binary())
                .args(["probe", "once", &format!("--csi-address={}", csi.display())])
                .status()
                .unwrap();
            assert!(status.success());
            started.elapsed()
        })
        .collect();
    times.sort();
    println!(
        "probe once: process start to exit: median {:?}, p99 {:?} (50 runs)",
        percentile(&times, 0.5),
        percentile(&times, 0.99)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let bin = binary();
    assert!(
        bin.exists(),
        "{} not built: run scripts/build-static.sh or cargo build --release",
        bin.display()
    );
    let size = std::fs::metadata(&bin).unwrap().len();
    println!(
        "binary: {} ({} bytes, {:.2} MB)",
        bin.display(),
        size,
        size as f64 / 1_048_576.0
    );
    let dir = tempfile::tempdir().unwrap();
    let csi = dir.path().join("plugin/csi.sock");
    let _driver = spawn(&[
        "node-server".into(),
        format!("--endpoint={}", csi.display()),
        format!("--state-dir={}", dir.path().join("state").display()),
    ]);
    wait_for(|| async { csi.exists() }).await;
    registrar(dir.path(), &csi).await;
    livenessprobe(&csi).await;
    probe_once(&csi);
}
