//! `probe serve` follows the driver, not a dead connection: a driver re-created at the same
//! path while a hung predecessor still holds the old connection, and a connection that wedged
//! while the socket stayed the same, are both left behind within a probe timeout or two. Probes
//! in progress are answered on SIGTERM. (That the first Probe is recorded under the driver's
//! name is checked with the metrics, in `health`.)

use crate::common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::fake_driver::FakeDriver;
use common::start_livenessprobe;

const DRIVER: &str = "follow.csi.example.io";
const TIMEOUT: Duration = Duration::from_secs(1);

async fn healthz(address: &str) -> (u16, String) {
    common::http_get(address, "/healthz").await
}

/// `/healthz` is 500 DeadlineExceeded now, and 200 again within two probe timeouts once
/// `change` has been made.
async fn healthy_again_within_two_timeouts(address: &str, change: impl FnOnce(), what: &str) {
    let (code, body) = healthz(address).await;
    assert!(
        code == 500 && body.contains("DeadlineExceeded"),
        "{code} {body}"
    );
    change();
    let started = Instant::now();
    // Each probe waits for the server's answer, so asking again at once is no busy loop.
    let mut last = (0, String::new());
    let healthy = async {
        while last.0 != 200 {
            last = healthz(address).await;
        }
    };
    let within = tokio::time::timeout(Duration::from_secs(10), healthy).await;
    assert!(within.is_ok(), "still {last:?} 10 s after {what}");
    let took = started.elapsed();
    println!("/healthz was 200 {took:?} after {what}");
    assert!(took <= 2 * TIMEOUT, "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_follows_a_driver_re_created_at_its_path_while_a_hung_one_holds_the_old_socket() {
    let dir = tempfile::tempdir().unwrap();
    let csi = dir.path().join("csi.sock");
    let hung = common::hung_listener(&csi, None);
    let (_probe, address) = start_livenessprobe(dir.path(), &csi, &["--probe-timeout=1s"]).await;
    // The hung driver keeps its listener and the old connection; a healthy one takes the path.
    let mut driver = None;
    let re_create = || {
        std::fs::remove_file(&csi).unwrap();
        driver = Some(FakeDriver::start(&csi, DRIVER));
    };
    healthy_again_within_two_timeouts(&address, re_create, "the driver was re-created").await;
    hung.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_dials_again_after_a_probe_timed_out_on_a_wedged_connection() {
    let dir = tempfile::tempdir().unwrap();
    let real = FakeDriver::start(&dir.path().join("real.sock"), DRIVER);
    let csi = dir.path().join("csi.sock");
    let wedging = common::hung_listener(&csi, Some(real.socket.clone()));
    let (_probe, address) = start_livenessprobe(dir.path(), &csi, &["--probe-timeout=1s"]).await;
    healthy_again_within_two_timeouts(&address, || {}, "the first probe timed out").await;
    wedging.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthz_in_progress_is_answered_when_sigterm_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let driver = FakeDriver::start(&dir.path().join("csi.sock"), DRIVER);
    let (mut probe, address) = start_livenessprobe(dir.path(), &driver.socket, &[]).await;
    assert_eq!(healthz(&address).await.0, 200);
    *driver.behaviour.probe_delay.lock().unwrap() = Duration::from_millis(1500);
    let calls_before = driver.behaviour.probe_calls.load(Ordering::SeqCst);
    let in_progress = tokio::spawn(async move { healthz(&address).await });
    // The gate: the /healthz in progress has reached the driver's Probe (which now hangs).
    let behaviour = driver.behaviour.clone();
    assert!(
        common::wait_until(Duration::from_secs(10), || {
            behaviour.probe_calls.load(Ordering::SeqCst) > calls_before
        })
        .await,
        "the /healthz never reached the driver"
    );
    common::send_signal(&probe.0, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(in_progress.await.unwrap(), (200, "ok".to_owned()));
    let status = common::wait_exit(&mut probe.0, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
}
