//! A surge rollout of the registrar, as real processes: the new registrar starts while the old
//! one still serves the registration socket, stands by (Ready, so the rollout goes on) without
//! touching it, and takes over when the old one exits; the old one's exit leaves the new
//! socket alone. The kubelet is the emulator, watching the registry with inotify.

use std::path::Path;
use std::process::Command;

use super::setup::{DRIVER, Setup, WAIT};
use crate::common;
use common::kubelet::{Kubelet, registered};
use common::{is_socket, wait_until};
use csi_nodekit::probe::kubelet::Event;
use csi_nodekit::socket::identity_of;

/// The registrar as a DaemonSet runs it; outside a container the driver socket's host path is
/// its own path, so the emulated kubelet dials it for NodeGetInfo.
fn registrar(setup: &Setup, http: &str) -> Command {
    let mut command = Command::new(common::binary());
    command
        .arg("registrar")
        .arg("--v=2")
        .arg(format!("--csi-address={}", setup.csi.display()))
        .arg(format!(
            "--kubelet-registration-path={}",
            setup.csi.display()
        ))
        .arg(format!(
            "--plugin-registration-path={}",
            setup.registry.display()
        ))
        .arg(format!("--http-endpoint={http}"));
    command
}

async fn until_readyz(address: &str, wanted: &str, matches: fn(&str, &str) -> bool) {
    let ready = async {
        loop {
            // Refused until the process has bound its port.
            let answer = csi_nodekit::http::get(address, "/readyz", WAIT).await;
            if answer.is_ok_and(|(code, body)| code == 200 && matches(&body, wanted)) {
                return;
            }
            // Polling an HTTP endpoint is the gate here: the registrar reports its phase there.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    assert!(
        tokio::time::timeout(WAIT, ready).await.is_ok(),
        "/readyz never said {wanted:?}"
    );
}

fn driver(setup: &Setup, state: &Path) -> common::KillOnDrop {
    common::spawn_node_server(
        &setup.csi,
        state,
        &[&format!("--driver-name={DRIVER}"), "--node-id=node-a"],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_surge_rollout_the_new_registrar_stands_by_takes_over_at_the_old_ones_exit_and_keeps_its_socket()
 {
    let setup = Setup::new();
    let state = tempfile::tempdir().unwrap();
    let _driver = driver(&setup, state.path());
    assert!(
        wait_until(WAIT, || is_socket(&setup.csi)).await,
        "no driver socket"
    );
    let mut kubelet = Kubelet::start(&setup.registry, None);
    let (old_http, new_http) = (common::free_local_address(), common::free_local_address());
    let mut old = common::spawn(&mut registrar(&setup, &old_http), "old registrar");
    let (socket, registration, _) = registered(kubelet.next().await);
    assert_eq!(
        (socket.as_path(), registration.driver.as_str()),
        (setup.reg_socket().as_path(), DRIVER)
    );
    let old_socket = identity_of(&setup.reg_socket()).expect("the old registrar's socket");

    let new = common::spawn(&mut registrar(&setup, &new_http), "new registrar");
    until_readyz(&new_http, "standing by", |body, part| body.contains(part)).await;
    assert_eq!(
        identity_of(&setup.reg_socket()),
        Some(old_socket),
        "the new registrar left the old one's live socket alone"
    );

    common::send_signal(&old.0, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(common::wait_exit(&mut old.0, WAIT).code(), Some(0));
    match kubelet.next().await {
        Event::Deregistered { driver, .. } => assert_eq!(driver, DRIVER),
        other => panic!("expected the old socket's deregistration, got {other:?}"),
    }
    let (socket, registration, _) = registered(kubelet.next().await);
    assert_eq!(
        (socket.as_path(), registration.driver.as_str()),
        (setup.reg_socket().as_path(), DRIVER)
    );
    until_readyz(&new_http, "ok", |body, whole| body == whole).await;
    let new_socket = identity_of(&setup.reg_socket());
    assert!(
        new_socket.is_some() && new_socket != Some(old_socket),
        "the new registrar's own socket is in place after the old one's exit"
    );
    assert!(new.stderr().contains("standing by"), "{}", new.stderr());
}
