//! Figures for `probe doctor`, printed (not asserted): wall time of one run on a node with ten
//! drivers (ten real node-servers, each behind a real registrar), and the same node with one
//! more plugin whose driver accepts connections and never answers. Runs the real binary (see
//! `support::binary`).
//!
//! `cargo bench --bench doctor`

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "support/mod.rs"]
mod support;
use support::{Proc, binary, spawn};

const DRIVERS: usize = 10;
const RUNS: usize = 20;

/// Driver `i`: node-server on `plugins/<name>/csi.sock`, and its registrar.
fn plugin(root: &Path, i: usize) -> [Proc; 2] {
    let name = format!("d{i}.csi.example.io");
    let socket = root.join(format!("plugins/{name}/csi.sock"));
    let server = spawn(&[
        "node-server".into(),
        format!("--endpoint=unix://{}", socket.display()),
        format!("--state-dir={}", root.join(format!("state/{i}")).display()),
        format!("--driver-name={name}"),
        "--node-id=bench-node".into(),
    ]);
    let registrar = spawn(&[
        "registrar".into(),
        format!("--csi-address={}", socket.display()),
        format!("--kubelet-registration-path={}", socket.display()),
        format!(
            "--plugin-registration-path={}",
            root.join("plugins_registry").display()
        ),
    ]);
    [server, registrar]
}

/// Wall times of `RUNS` doctor runs, sorted, and the last run's exit code.
fn measure(root: &Path, extra: &[&str]) -> (Vec<Duration>, Option<i32>) {
    let mut times = Vec::with_capacity(RUNS);
    let mut code = None;
    for _ in 0..RUNS {
        let started = Instant::now();
        let status = Command::new(binary())
            .args([
                "probe",
                "doctor",
                "--no-api",
                "--node-name=bench-node",
                "--output=json",
            ])
            .arg(format!("--kubelet-root={}", root.display()))
            .arg(format!("--proc-root={}", root.join("no-proc").display()))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run the doctor");
        times.push(started.elapsed());
        code = status.code();
    }
    times.sort();
    (times, code)
}

fn print(label: &str, (times, code): (Vec<Duration>, Option<i32>)) {
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
    println!(
        "{label}: median {}, max {}, min {} over {RUNS} runs (exit {code:?})",
        ms(times[RUNS / 2]),
        ms(times[RUNS - 1]),
        ms(times[0])
    );
}

fn main() {
    println!("binary: {}", binary().display());
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("plugins_registry")).unwrap();
    let _plugins: Vec<[Proc; 2]> = (0..DRIVERS).map(|i| plugin(root, i)).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_dir(root.join("plugins_registry"))
        .unwrap()
        .count()
        < DRIVERS
    {
        assert!(
            Instant::now() < deadline,
            "the registrars did not all start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200)); // hidden staging names renamed into place
    print(
        &format!("{DRIVERS} drivers, all healthy"),
        measure(root, &[]),
    );

    // One more plugin whose driver socket accepts connections and never answers.
    let hung = root.join("plugins/hung.csi.example.io/csi.sock");
    std::fs::create_dir_all(hung.parent().unwrap()).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(&hung).unwrap();
    let _held = std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            held.push(stream);
        }
    });
    // Its registration socket: a fake registrar that answers GetInfo for it (ours would
    // wait for a driver that answers).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let reg_socket = root.join("plugins_registry/hung.csi.example.io-reg.sock");
    let endpoint = hung.display().to_string();
    runtime.spawn(serve_get_info(reg_socket, endpoint));
    std::thread::sleep(Duration::from_millis(100));
    print(
        &format!("{DRIVERS} drivers + 1 hung driver, --timeout=1s"),
        measure(root, &["--timeout=1s"]),
    );
}

/// A registration socket that answers GetInfo for the hung driver.
async fn serve_get_info(socket: std::path::PathBuf, endpoint: String) {
    use csi_nodekit::proto::registration::registration_server::{Registration, RegistrationServer};
    use csi_nodekit::proto::registration::{
        InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
    };
    struct Fake(String);
    #[tonic::async_trait]
    impl Registration for Fake {
        async fn get_info(
            &self,
            _: tonic::Request<InfoRequest>,
        ) -> Result<tonic::Response<PluginInfo>, tonic::Status> {
            Ok(tonic::Response::new(PluginInfo {
                r#type: "CSIPlugin".into(),
                name: "hung.csi.example.io".into(),
                endpoint: self.0.clone(),
                supported_versions: vec!["1.0.0".into()],
            }))
        }
        async fn notify_registration_status(
            &self,
            _: tonic::Request<RegistrationStatus>,
        ) -> Result<tonic::Response<RegistrationStatusResponse>, tonic::Status> {
            Ok(tonic::Response::new(RegistrationStatusResponse {}))
        }
    }
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let _ = tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(Fake(endpoint)))
        .serve_with_incoming(incoming)
        .await;
}
