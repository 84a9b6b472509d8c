//! `probe serve` (livenessprobe), `probe once` and `probe registration` as real processes
//! against a real CSI driver socket.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::fake_driver::FakeDriver;
use common::start_livenessprobe;

const DRIVER: &str = "fake.csi.example.io";

async fn healthz(address: &str) -> (u16, String) {
    common::http_get(address, "/healthz").await
}

fn probe_once(csi: &Path, timeout: &str) -> Output {
    Command::new(common::binary())
        .args([
            "probe",
            "once",
            &format!("--csi-address={}", csi.display()),
            &format!("--probe-timeout={timeout}"),
        ])
        .output()
        .expect("run probe once")
}

fn csi_path(dir: &Path) -> PathBuf {
    dir.join("csi.sock")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_is_200_when_the_driver_is_ready_or_leaves_ready_unset() {
    let dir = tempfile::tempdir().unwrap();
    let driver = FakeDriver::start(&csi_path(dir.path()), DRIVER);
    let (_probe, address) = start_livenessprobe(dir.path(), &driver.socket, &[]).await;
    *driver.behaviour.ready.lock().unwrap() = Some(true);
    assert_eq!(healthz(&address).await, (200, "ok".into()));
    *driver.behaviour.ready.lock().unwrap() = None;
    assert_eq!(healthz(&address).await, (200, "ok".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_is_500_when_the_driver_is_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let driver = FakeDriver::start(&csi_path(dir.path()), DRIVER);
    *driver.behaviour.ready.lock().unwrap() = Some(false);
    let (_probe, address) = start_livenessprobe(dir.path(), &driver.socket, &[]).await;
    assert_eq!(
        healthz(&address).await,
        (500, "driver responded but is not ready".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_answers_500_while_the_driver_is_absent_and_200_once_it_appears() {
    let dir = tempfile::tempdir().unwrap();
    let csi = csi_path(dir.path());
    let (mut probe, address) = start_livenessprobe(dir.path(), &csi, &[]).await;
    let (code, body) = healthz(&address).await;
    assert_eq!(code, 500);
    assert!(body.contains(&csi.display().to_string()), "{body}");
    let _driver = FakeDriver::start(&csi, DRIVER);
    assert_eq!(healthz(&address).await, (200, "ok".into()));
    assert!(
        probe.0.try_wait().unwrap().is_none(),
        "livenessprobe exited"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_that_hangs_past_the_timeout_is_unhealthy() {
    let dir = tempfile::tempdir().unwrap();
    let driver = FakeDriver::start(&csi_path(dir.path()), DRIVER);
    *driver.behaviour.probe_delay.lock().unwrap() = Duration::from_secs(5);
    let (_probe, address) =
        start_livenessprobe(dir.path(), &driver.socket, &["--probe-timeout=300ms"]).await;
    let (code, body) = healthz(&address).await;
    assert_eq!(code, 500);
    assert!(body.contains("DeadlineExceeded"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_driver_is_redialled_on_the_same_connection_slot() {
    let dir = tempfile::tempdir().unwrap();
    let csi = csi_path(dir.path());
    let driver = FakeDriver::start(&csi, DRIVER);
    let (_probe, address) = start_livenessprobe(dir.path(), &csi, &[]).await;
    assert_eq!(healthz(&address).await.0, 200);
    driver.stop().await;
    assert_eq!(healthz(&address).await.0, 500);
    let _driver = FakeDriver::start(&csi, DRIVER);
    assert_eq!(healthz(&address).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simultaneous_probes_share_one_call_to_the_driver() {
    let dir = tempfile::tempdir().unwrap();
    let driver = FakeDriver::start(&csi_path(dir.path()), DRIVER);
    let (_probe, address) = start_livenessprobe(dir.path(), &driver.socket, &[]).await;
    assert_eq!(healthz(&address).await.0, 200); // connect and learn the name first
    driver.behaviour.probe_calls.store(0, Ordering::SeqCst);
    // Long enough for all eight connections to arrive while the first Probe is held.
    *driver.behaviour.probe_delay.lock().unwrap() = Duration::from_secs(2);
    let requests: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn({
                let address = address.clone();
                async move { healthz(&address).await }
            })
        })
        .collect();
    for request in requests {
        assert_eq!(request.await.unwrap().0, 200);
    }
    let calls = driver.behaviour.probe_calls.load(Ordering::SeqCst);
    assert!(calls <= 2, "8 simultaneous probes made {calls} Probe calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_probe_is_in_the_upstream_histogram_under_the_drivers_name() {
    let dir = tempfile::tempdir().unwrap();
    let driver = FakeDriver::start(&csi_path(dir.path()), DRIVER);
    let (_probe, address) = start_livenessprobe(dir.path(), &driver.socket, &[]).await;
    assert_eq!(healthz(&address).await.0, 200);
    let (code, body) = common::http_get(&address, "/metrics").await;
    assert_eq!(code, 200);
    // Recorded once both the Probe and the name are in: no `driver_name=""` series.
    let labelled = format!(
        r#"csi_sidecar_operations_seconds_count{{driver_name="{DRIVER}",method_name="/csi.v1.Identity/Probe",grpc_status_code="OK"}} 1"#
    );
    assert!(body.contains(&labelled), "{body}");
    assert!(!body.contains(r#"driver_name="""#), "{body}");
    assert!(body.contains("process_start_time_seconds "), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_livenessprobe_with_exit_0() {
    let dir = tempfile::tempdir().unwrap();
    let (mut probe, _) = start_livenessprobe(dir.path(), &csi_path(dir.path()), &[]).await;
    common::send_signal(&probe.0, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(
        common::wait_exit(&mut probe.0, Duration::from_secs(10)).code(),
        Some(0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_once_exits_0_for_a_ready_driver_and_1_with_one_line_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let csi = csi_path(dir.path());
    let driver = FakeDriver::start(&csi, DRIVER);
    let csi_for = csi.clone();
    let run = move |timeout: &'static str| {
        let csi = csi_for.clone();
        async move {
            tokio::task::spawn_blocking(move || probe_once(&csi, timeout))
                .await
                .unwrap()
        }
    };
    let ready = run("3s").await;
    assert_eq!(ready.status.code(), Some(0), "{ready:?}");

    *driver.behaviour.ready.lock().unwrap() = None;
    assert_eq!(run("3s").await.status.code(), Some(0));

    *driver.behaviour.ready.lock().unwrap() = Some(false);
    let not_ready = run("3s").await;
    assert_eq!(not_ready.status.code(), Some(1));
    let err = String::from_utf8_lossy(&not_ready.stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("driver responded but is not ready"), "{err}");

    *driver.behaviour.ready.lock().unwrap() = Some(true);
    *driver.behaviour.probe_delay.lock().unwrap() = Duration::from_secs(5);
    let hung = run("300ms").await;
    assert_eq!(hung.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&hung.stderr).contains("DeadlineExceeded"));

    driver.stop().await;
    let absent = run("1s").await;
    assert_eq!(absent.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&absent.stderr).contains(&csi.display().to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_registration_follows_the_registrars_readyz() {
    let dir = tempfile::tempdir().unwrap();
    let csi = csi_path(dir.path());
    let registry = dir.path().join("registry");
    let _driver = FakeDriver::start(&csi, DRIVER);
    let registrar = common::registrar::Registrar::start(&csi, &registry, &[]).await;
    let http = registrar.http.clone();
    let reg_socket = registry.join(format!("{DRIVER}-reg.sock"));
    assert!(
        common::wait_until(Duration::from_secs(10), || {
            common::is_socket(&reg_socket)
        })
        .await
    );
    let ask = {
        let http = http.clone();
        move || {
            Command::new(common::binary())
                .args(["probe", "registration", &format!("--http-endpoint={http}")])
                .output()
                .unwrap()
        }
    };
    let before = tokio::task::spawn_blocking(ask.clone()).await.unwrap();
    assert_eq!(before.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&before.stderr).contains("waiting for the kubelet"),
        "{before:?}"
    );

    let channel = csi_nodekit::socket::connect(&reg_socket).await.unwrap();
    let status = csi_nodekit::proto::registration::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    };
    csi_nodekit::proto::registration::registration_client::RegistrationClient::new(channel)
        .notify_registration_status(status)
        .await
        .unwrap();
    let after = tokio::task::spawn_blocking(ask).await.unwrap();
    assert_eq!(after.status.code(), Some(0), "{after:?}");
}

#[test]
fn probe_without_a_subcommand_is_a_usage_error() {
    let out = Command::new(common::binary())
        .arg("probe")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_deadline_covers_connecting_and_probing_as_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let csi = csi_path(dir.path());
    // Accepts connections (the kernel queues them) but never speaks: the handshake hangs.
    let _mute = std::os::unix::net::UnixListener::bind(&csi).unwrap();
    let (_probe, address) = start_livenessprobe(dir.path(), &csi, &["--probe-timeout=1s"]).await;
    let started = std::time::Instant::now();
    let (code, body) = healthz(&address).await;
    let took = started.elapsed();
    assert_eq!(code, 500, "{body}");
    assert!(
        took < Duration::from_millis(1800),
        "first probe took {took:?} for a 1 s timeout"
    );
}
