//! The registrar served in process, on each test's own HTTP listener and directories, between
//! a real CSI driver socket and a kubelet-side client on its real registration socket:
//! GetInfo, waiting for the driver, the kubelet's verdicts and the back-off after a
//! rejection, a registration socket deleted or taken over, a driver restarted or renamed,
//! and what `/healthz` and `/readyz` answer meanwhile.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::setup::{DRIVER, Setup, WAIT, http, until_healthy};
use crate::common;
use common::fake_driver::FakeDriver;
use common::registrar::HOST_PATH;
use common::{is_socket, logs, wait_until};
use csi_nodekit::proto::registration::{
    InfoRequest, RegistrationStatus, registration_client::RegistrationClient,
};

/// Which socket is at `path` (inode numbers alone get reused by the next file created).
fn inode(path: &Path) -> Option<csi_nodekit::socket::Identity> {
    csi_nodekit::socket::identity_of(path)
}

async fn kubelet(socket: &Path) -> RegistrationClient<tonic::transport::Channel> {
    RegistrationClient::new(
        csi_nodekit::socket::connect(socket)
            .await
            .expect("dial registration socket"),
    )
}

/// The kubelet's first call: GetInfo on the registration socket.
async fn get_info(socket: &Path) -> csi_nodekit::proto::registration::PluginInfo {
    let reply = kubelet(socket).await.get_info(InfoRequest {}).await;
    reply.expect("GetInfo").into_inner()
}

async fn notify(socket: &Path, registered: bool, error: &str) {
    let status = RegistrationStatus {
        plugin_registered: registered,
        error: error.into(),
    };
    kubelet(socket)
        .await
        .notify_registration_status(status)
        .await
        .expect("notify");
}

/// Polls `path` until it answers `code` (the registrar reacts to a notification asynchronously).
async fn http_until(address: &str, path: &str, code: u16) -> (u16, String) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let answer = http(address, path).await;
        if answer.0 == code || tokio::time::Instant::now() > deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn get_info_returns_the_driver_name_endpoint_and_version_on_a_0700_socket() {
    let setup = Setup::new();
    let (_driver, _registrar) = setup.running().await;
    let info = get_info(&setup.reg_socket()).await;
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(info.endpoint, HOST_PATH);
    assert_eq!(info.supported_versions, vec!["1.0.0"]);
    let mode = std::fs::metadata(setup.reg_socket())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700);
}

#[tokio::test]
async fn a_late_driver_socket_is_waited_for_while_healthz_stays_alive() {
    let setup = Setup::new();
    let registrar = setup.start_registrar().await;
    let http_addr = registrar.http.clone();
    let (code, body) = http(&http_addr, "/healthz").await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = http(&http_addr, "/readyz").await;
    assert_eq!(code, 503);
    assert!(body.contains("waiting for the driver"), "{body}");
    // Late: the registrar has tried the missing socket and backed off more than once (upstream
    // would be counting to its 30 s exit by now).
    assert!(
        wait_until(WAIT, || logs::count("; retrying in") >= 2).await,
        "the registrar did not retry the missing driver socket"
    );
    let _driver = FakeDriver::start(&setup.csi, DRIVER);
    assert!(
        wait_until(WAIT, || is_socket(&setup.reg_socket())).await,
        "registrar did not register the late driver"
    );
}

#[tokio::test]
async fn get_plugin_info_failures_are_retried_with_backoff() {
    let setup = Setup::new();
    let driver = FakeDriver::start(&setup.csi, DRIVER);
    driver.behaviour.failures_left.store(2, Ordering::SeqCst);
    let registrar = setup.start_registrar().await;
    let http_addr = registrar.http.clone();
    assert!(
        wait_until(WAIT, || is_socket(&setup.reg_socket())).await,
        "never registered after failures"
    );
    assert_eq!(driver.behaviour.plugin_info_calls.load(Ordering::SeqCst), 3);
    let (_, metrics) = http(&http_addr, "/metrics").await;
    assert!(
        metrics.contains(r#"grpc_status_code="Unavailable""#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"method_name="/csi.v1.Identity/GetPluginInfo""#),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_successful_registration_makes_readyz_answer_200() {
    let setup = Setup::new();
    let (_driver, _registrar) = setup.running().await;
    let http_addr = _registrar.http.clone();
    assert_eq!(http(&http_addr, "/readyz").await.0, 503);
    notify(&setup.reg_socket(), true, "").await;
    assert_eq!(
        http_until(&http_addr, "/readyz", 200).await,
        (200, "ok".to_owned())
    );
    let (_, metrics) = http(&http_addr, "/metrics").await;
    assert!(
        metrics.contains(r#"csi_nodekit_registrar_state{state="registered"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_failed_registration_is_answered_and_the_socket_recreated_after_a_backoff() {
    let setup = Setup::new();
    let (_driver, registrar) = setup.running().await;
    let http_addr = registrar.http.clone();
    let first = inode(&setup.reg_socket());
    notify(&setup.reg_socket(), false, "node ID is empty").await;
    let (_, body) = http(&http_addr, "/readyz").await;
    assert!(body.contains("node ID is empty"), "{body}");
    let recreated = wait_until(WAIT, || {
        inode(&setup.reg_socket()).is_some_and(|i| Some(i) != first)
    })
    .await;
    assert!(recreated, "registration socket was not re-created");
    assert!(
        registrar.is_running(),
        "registrar exited after a failed registration"
    );
    let (_, metrics) = http(&http_addr, "/metrics").await;
    assert!(
        metrics.contains(r#"csi_nodekit_registrar_last_error{error="node ID is empty"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("csi_nodekit_registrar_registration_attempts_total 2"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_deleted_registration_socket_is_recreated_within_about_a_second() {
    let setup = Setup::new();
    let (_driver, _registrar) = setup.running().await;
    std::fs::remove_file(setup.reg_socket()).unwrap();
    assert!(
        wait_until(Duration::from_secs(3), || is_socket(&setup.reg_socket())).await,
        "not healed"
    );
    let info = get_info(&setup.reg_socket()).await;
    assert_eq!(info.name, DRIVER);
}

#[tokio::test]
async fn a_driver_restart_recreates_the_registration_socket() {
    let setup = Setup::new();
    let (driver, _registrar) = setup.running().await;
    let first = inode(&setup.reg_socket());
    driver.stop().await;
    assert!(
        wait_until(WAIT, || logs::count("waiting for the driver to come back")
            > 0)
        .await,
        "the registrar did not notice the driver leave"
    );
    assert_eq!(
        inode(&setup.reg_socket()),
        first,
        "socket should be kept while the driver is away"
    );
    let _driver = FakeDriver::start(&setup.csi, DRIVER);
    let recreated = wait_until(WAIT, || {
        inode(&setup.reg_socket()).is_some_and(|i| Some(i) != first)
    })
    .await;
    assert!(
        recreated,
        "registration socket was not re-created after the driver restart"
    );
}

#[tokio::test]
async fn a_renamed_driver_gets_a_new_registration_socket_and_the_old_one_goes() {
    let setup = Setup::new();
    let (driver, _registrar) = setup.running().await;
    driver.stop().await;
    let _driver = FakeDriver::start(&setup.csi, "renamed.csi.example.io");
    let renamed = setup.registry.join("renamed.csi.example.io-reg.sock");
    assert!(
        wait_until(WAIT, || is_socket(&renamed)).await,
        "no socket for the new name"
    );
    assert!(
        !setup.reg_socket().exists(),
        "the old name's socket was left behind"
    );
}

#[tokio::test]
async fn healthz_answers_200_404_and_500_as_upstream_does() {
    let setup = Setup::new();
    let (_driver, _registrar) = setup.running().await;
    let http_addr = _registrar.http.clone();
    assert_eq!(http(&http_addr, "/healthz").await, (200, "ok".to_owned()));

    // Missing socket → 404, caught before the registrar heals it (it may win the race; retry).
    let mut saw_404 = false;
    for _ in 0..10 {
        assert!(wait_until(WAIT, || is_socket(&setup.reg_socket())).await);
        std::fs::remove_file(setup.reg_socket()).unwrap();
        let (code, body) = http(&http_addr, "/healthz").await;
        if code == 404 {
            assert_eq!(body, "registration socket does not exist");
            saw_404 = true;
            break;
        }
    }
    assert!(saw_404, "never saw 404 for a missing registration socket");

    // A socket that answers for another driver → 500 naming it. The registrar's watch (every
    // 500 ms) may notice the impostor before /healthz looks, and then answers without a
    // self-check: that try is repeated once it has its own socket back.
    let mut saw_500 = false;
    for _ in 0..10 {
        until_healthy(&http_addr).await;
        let _ = std::fs::remove_file(setup.reg_socket());
        let Ok(impostor) = std::panic::catch_unwind(|| {
            FakeRegistration::start(&setup.reg_socket(), "other.csi.io")
        }) else {
            continue; // the registrar re-created its socket first
        };
        let (code, body) = http(&http_addr, "/healthz").await;
        drop(impostor);
        if body.starts_with("ok: re-creating") {
            continue;
        }
        assert_eq!(code, 500, "{body}");
        assert!(body.contains("other.csi.io"), "{body}");
        saw_500 = true;
        break;
    }
    assert!(saw_500, "could not put an impostor in place");
}

/// A registration server that answers GetInfo for some other driver.
struct FakeRegistration {
    _runtime_task: tokio::task::JoinHandle<()>,
    stop: csi_nodekit::shutdown::Trigger,
}

impl FakeRegistration {
    fn start(socket: &Path, name: &str) -> Self {
        use csi_nodekit::proto::registration::registration_server::RegistrationServer;
        let perms = csi_nodekit::socket::Permissions {
            mode: 0o700,
            gid: None,
        };
        let (listener, guard) =
            csi_nodekit::socket::bind_tokio(socket, perms).expect("bind impostor");
        let (stop, stopped) = csi_nodekit::shutdown::Shutdown::manual();
        let (verdicts, _) = tokio::sync::mpsc::unbounded_channel();
        let info = csi_nodekit::registrar::plugin_info(name, "/elsewhere/csi.sock");
        let service = csi_nodekit::registrar::RegistrationService {
            info,
            generation: 0,
            verdicts,
        };
        let task = tokio::spawn(async move {
            let _guard = guard;
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
            let _ = tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(service))
                .serve_with_incoming_shutdown(incoming, stopped.wait())
                .await;
        });
        Self {
            _runtime_task: task,
            stop,
        }
    }
}

impl Drop for FakeRegistration {
    fn drop(&mut self) {
        self.stop.fire();
    }
}

/// Waits until the socket at `path` is a different one than `before`; returns how long it took.
async fn replaced_after(path: &Path, before: Option<csi_nodekit::socket::Identity>) -> Duration {
    let started = std::time::Instant::now();
    assert!(
        wait_until(WAIT, || inode(path).is_some_and(|i| Some(i) != before)).await,
        "not re-created"
    );
    started.elapsed()
}

#[tokio::test]
async fn rejections_back_off_doubling_while_healthz_stays_200_and_success_resets_it() {
    let setup = Setup::new();
    let (_driver, _registrar) = setup.running().await;
    let http_addr = _registrar.http.clone();
    let socket = setup.reg_socket();

    notify(&socket, false, "first refusal").await;
    let (code, body) = http(&http_addr, "/healthz").await;
    assert_eq!(code, 200, "liveness must hold during the back-off: {body}");
    assert!(body.contains("first refusal"), "{body}");
    let first = replaced_after(&socket, inode(&socket)).await;
    assert!(
        first >= Duration::from_millis(900),
        "first back-off was {first:?}"
    );

    notify(&socket, false, "second refusal").await;
    let second = replaced_after(&socket, inode(&socket)).await;
    assert!(
        second >= Duration::from_millis(1900),
        "second back-off was {second:?}, not doubled"
    );

    notify(&socket, true, "").await;
    assert_eq!(http_until(&http_addr, "/readyz", 200).await.0, 200);
    notify(&socket, false, "after a success").await;
    let reset = replaced_after(&socket, inode(&socket)).await;
    assert!(
        reset < Duration::from_millis(1900),
        "success did not reset the back-off: {reset:?}"
    );
}

#[tokio::test]
async fn readyz_drops_as_soon_as_the_registration_socket_is_lost() {
    let setup = Setup::new();
    let (_driver, _registrar) = setup.running().await;
    let http_addr = _registrar.http.clone();
    notify(&setup.reg_socket(), true, "").await;
    assert_eq!(http_until(&http_addr, "/readyz", 200).await.0, 200);
    std::fs::remove_file(setup.reg_socket()).unwrap();
    let (code, body) = http_until(&http_addr, "/readyz", 503).await;
    assert_eq!(code, 503, "{body}");
}

#[tokio::test]
async fn healthz_stays_200_while_a_restarted_driver_does_not_answer_yet() {
    let setup = Setup::new();
    let (driver, _registrar) = setup.running().await;
    let http_addr = _registrar.http.clone();
    driver.stop().await;
    drop(std::os::unix::net::UnixListener::bind(&setup.csi).unwrap()); // back, but not answering
    let (_, ready) = http_until(&http_addr, "/readyz", 503).await;
    assert!(
        wait_until(WAIT, || !setup.reg_socket().exists()).await,
        "old socket kept"
    );
    let (code, body) = http(&http_addr, "/healthz").await;
    assert_eq!(code, 200, "{body} (readyz: {ready})");
    assert!(body.contains("waiting for the driver"), "{body}");
}
