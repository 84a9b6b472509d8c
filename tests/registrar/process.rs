//! The registrar as a real process: SIGTERM (with a GetInfo or a `/healthz` self-check in
//! progress), the probe mode, usage errors and Go-only flags, a driver that never comes, and a
//! driver name it refuses.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::setup::{DRIVER, Setup, WAIT, http, until_healthy};
use crate::common;
use common::fake_driver::FakeDriver;
use common::{is_socket, wait_until};

#[tokio::test]
async fn the_process_removes_the_registration_socket_on_sigterm_and_exits_0() {
    let setup = Setup::new();
    let _driver = FakeDriver::start(&setup.csi, DRIVER);
    let mut registrar = common::spawn(&mut setup.registrar_command(), "registrar");
    assert!(
        wait_until(WAIT, || is_socket(&setup.reg_socket())).await,
        "no registration socket"
    );
    common::send_signal(&registrar.0, nix::sys::signal::Signal::SIGTERM);
    let status = common::wait_exit(&mut registrar.0, WAIT);
    assert_eq!(status.code(), Some(0));
    assert!(!setup.reg_socket().exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_info_in_flight_at_sigterm_is_answered_before_the_exit() {
    let setup = Setup::new();
    let _driver = FakeDriver::start(&setup.csi, DRIVER);
    let mut registrar = common::spawn(&mut setup.registrar_command(), "registrar");
    assert!(
        wait_until(WAIT, || is_socket(&setup.reg_socket())).await,
        "no registration socket"
    );
    let get_info = "/pluginregistration.Registration/GetInfo";
    let in_flight = common::held_call::HeldCall::open(&setup.reg_socket(), get_info).await;
    common::send_signal(&registrar.0, nix::sys::signal::Signal::SIGTERM);
    // The gate: the socket is withdrawn first, so the kubelet dials no server that stops.
    assert!(
        wait_until(WAIT, || !setup.reg_socket().exists()).await,
        "the registration socket outlived the shutdown's start"
    );
    let answer = in_flight.finish().await;
    assert_eq!(answer.grpc_status, "0", "{answer:?}");
    let status = common::wait_exit(&mut registrar.0, WAIT);
    assert_eq!(status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthz_self_check_in_progress_at_sigterm_is_answered_before_the_exit() {
    let setup = Setup::new();
    let _driver = FakeDriver::start(&setup.csi, DRIVER);
    let http_addr = common::free_local_address();
    let mut registrar = common::spawn(
        setup
            .registrar_command()
            .arg("--timeout=2s")
            .arg(format!("--http-endpoint={http_addr}")),
        "registrar",
    );
    // A registration socket that accepts and never answers takes the place of the registrar's,
    // so the self-check waits its whole --timeout. The registrar notices the swap within half
    // a second and answers without a self-check from then on; a /healthz that came too late
    // for the swap is tried again once the registrar has its own socket back.
    let hung_path = setup.registry.with_file_name("hung.sock");
    let mut attempts = 0;
    let (in_progress, _hung) = loop {
        attempts += 1;
        // The HTTP port is bound before the registration socket is made.
        assert!(
            wait_until(WAIT, || is_socket(&setup.reg_socket())).await,
            "no registration socket"
        );
        until_healthy(&http_addr).await;
        let dialled = Arc::new(AtomicUsize::new(0));
        let hung = common::hung_listener_counting(&hung_path, None, dialled.clone());
        std::fs::rename(&hung_path, setup.reg_socket()).unwrap();
        let address = http_addr.clone();
        let request = tokio::spawn(async move { http(&address, "/healthz").await });
        // The gate: the self-check dialled the hung socket (it now waits its --timeout), or
        // the /healthz was answered because the registrar noticed the swap first.
        let settled = wait_until(WAIT, || {
            dialled.load(Ordering::SeqCst) > 0 || request.is_finished()
        })
        .await;
        assert!(
            settled,
            "the /healthz neither dialled the socket nor was answered"
        );
        if dialled.load(Ordering::SeqCst) > 0 {
            break (request, hung);
        }
        assert!(attempts < 5, "the swap was noticed first {attempts} times");
        hung.abort();
        std::fs::remove_file(setup.reg_socket()).unwrap();
    };
    common::send_signal(&registrar.0, nix::sys::signal::Signal::SIGTERM);
    let (code, body) = in_progress.await.expect("the /healthz in progress");
    assert_eq!(code, 500, "{body}");
    assert!(body.contains("no answer within 2s"), "{body}");
    let status = common::wait_exit(&mut registrar.0, WAIT);
    assert_eq!(status.code(), Some(0));
}

#[test]
fn the_probe_mode_exits_0_at_once_as_upstream() {
    let status = Command::new(common::binary())
        .args([
            "registrar",
            "--mode=kubelet-registration-probe",
            "--kubelet-registration-path=/x/csi.sock",
        ])
        .output()
        .unwrap()
        .status;
    assert_eq!(status.code(), Some(0));
}

#[test]
fn a_missing_kubelet_registration_path_is_a_usage_error() {
    let out = Command::new(common::binary())
        .args(["registrar", "--csi-address=/csi/csi.sock"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--kubelet-registration-path"));
}

#[test]
fn health_port_and_http_endpoint_together_are_refused() {
    let out = Command::new(common::binary())
        .args([
            "registrar",
            "--kubelet-registration-path=/x",
            "--health-port=9809",
            "--http-endpoint=:9809",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn go_only_flags_are_accepted_and_named_once_as_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(common::binary())
        .args([
            "csi-node-driver-registrar",
            "--enable-pprof",
            "--automaxprocs=true",
            "--connection-timeout=15s",
            "--kubelet-registration-path=/x/csi.sock",
            "--driver-wait-limit=200ms",
        ])
        .arg(format!(
            "--csi-address={}",
            dir.path().join("absent.sock").display()
        ))
        .arg(format!(
            "--plugin-registration-path={}",
            dir.path().display()
        ))
        .output()
        .unwrap();
    // No driver ever answers: the registrar gives up (exit 1), having started.
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let logged = String::from_utf8_lossy(&out.stderr);
    let notice = logged
        .lines()
        .find(|l| l.contains("accepted for compatibility and ignored"))
        .unwrap_or_else(|| panic!("{logged}"));
    for flag in ["--enable-pprof", "--automaxprocs", "--connection-timeout"] {
        assert!(notice.contains(flag), "{flag}: {notice}");
    }
}

#[test]
fn a_driver_wait_limit_makes_the_registrar_give_up_naming_the_socket() {
    let setup = Setup::new();
    let started = std::time::Instant::now();
    let out = setup
        .registrar_command()
        .arg("--driver-wait-limit=1s")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(started.elapsed() < Duration::from_secs(10));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&setup.csi.display().to_string()), "{err}");
    assert!(!setup.reg_socket().exists());
}

#[tokio::test]
async fn an_invalid_driver_name_is_refused_and_nothing_is_created() {
    let setup = Setup::new();
    let _driver = FakeDriver::start(&setup.csi, "../escape");
    let mut command = setup.registrar_command();
    let out = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("../escape") && err.contains("CSI naming rules"),
        "{err}"
    );
    assert!(
        !setup
            .registry
            .parent()
            .unwrap()
            .join("escape-reg.sock")
            .exists()
    );
}
