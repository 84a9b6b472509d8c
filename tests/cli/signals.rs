//! Real processes and real signals: a graceful stop leaves nothing behind, lets a call in
//! flight finish (or answers it UNAVAILABLE when the grace period is over), and a second
//! signal does not wait for stuck calls.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::held_call::HeldCall;
use common::{
    is_socket, send_signal, spawn_node_server, wait_exit, wait_until, wait_until_blocking,
};
use nix::sys::signal::Signal;

const PROBE: &str = "/csi.v1.Identity/Probe";

/// Starts a node-server and opens a call on it that stays in flight, then sends SIGTERM and
/// waits (the gate) for the server to say it is shutting down.
async fn sigterm_with_a_call_in_flight(dir: &Path) -> (common::KillOnDrop, HeldCall) {
    let socket = dir.join("csi.sock");
    let server = spawn_node_server(&socket, &dir.join("state"), &[]);
    assert!(
        wait_until(Duration::from_secs(10), || is_socket(&socket)).await,
        "socket never appeared"
    );
    let in_flight = HeldCall::open(&socket, PROBE).await;
    send_signal(&server.0, Signal::SIGTERM);
    assert!(
        wait_until(Duration::from_secs(10), || server
            .stderr()
            .contains("shutting down"))
        .await,
        "no shutdown line: {}",
        server.stderr()
    );
    (server, in_flight)
}

/// A node-server serving on `<dir>/csi.sock`, and that socket.
fn serving_in(dir: &Path) -> (common::KillOnDrop, std::path::PathBuf) {
    let socket = dir.join("csi.sock");
    let server = spawn_node_server(&socket, &dir.join("state"), &[]);
    assert!(
        wait_until_blocking(Duration::from_secs(10), || is_socket(&socket)),
        "socket never appeared"
    );
    (server, socket)
}

fn graceful_stop_on(signal: Signal) {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, socket) = serving_in(dir.path());
    send_signal(&server.0, signal);
    let status = wait_exit(&mut server.0, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{signal}: {status:?}");
    assert!(!socket.exists(), "{signal} left the socket behind");
}

#[test]
fn sigterm_stops_the_server_with_exit_0_and_no_socket_left() {
    graceful_stop_on(Signal::SIGTERM);
}

#[test]
fn sigint_stops_the_server_with_exit_0_and_no_socket_left() {
    graceful_stop_on(Signal::SIGINT);
}

#[tokio::test]
async fn a_second_signal_exits_at_once_and_still_removes_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let mut server = spawn_node_server(&socket, &dir.path().join("state"), &[]);
    assert!(
        wait_until(Duration::from_secs(10), || is_socket(&socket)).await,
        "socket never appeared"
    );
    let _in_flight = HeldCall::open(&socket, PROBE).await;

    send_signal(&server.0, Signal::SIGTERM);
    // The gate: the server says it is shutting down; the open call keeps it running.
    assert!(
        wait_until(Duration::from_secs(10), || server
            .stderr()
            .contains("shutting down"))
        .await,
        "no shutdown line: {}",
        server.stderr()
    );
    assert!(
        server.0.try_wait().unwrap().is_none(),
        "graceful stop should wait for the open call"
    );

    send_signal(&server.0, Signal::SIGTERM);
    let status = wait_exit(&mut server.0, Duration::from_secs(3));
    assert_eq!(status.code(), Some(128 + 15), "{status:?}");
    assert!(!socket.exists(), "forced exit left the socket behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_flight_at_sigterm_is_answered_and_the_server_then_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let (mut server, in_flight) = sigterm_with_a_call_in_flight(dir.path()).await;
    // No new calls: the socket goes at once, so a client dialling now fails instead of
    // waiting in a backlog nobody accepts from.
    assert!(
        wait_until(Duration::from_secs(10), || !socket.exists()).await,
        "the socket outlived the shutdown's start"
    );
    let dialled = std::os::unix::net::UnixStream::connect(&socket);
    assert!(dialled.is_err(), "a new connection was accepted");
    assert!(
        server.0.try_wait().unwrap().is_none(),
        "it waits for the call"
    );

    let answer = in_flight.finish().await;
    assert_eq!(answer.grpc_status, "0", "{answer:?}");
    // Well inside the 10 s grace period: nothing else holds it.
    let status = wait_exit(&mut server.0, Duration::from_secs(5));
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_still_in_flight_when_the_grace_period_ends_is_answered_unavailable_and_the_server_exits_0()
 {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, in_flight) = sigterm_with_a_call_in_flight(dir.path()).await;
    let grace = csi_nodekit::shutdown::GRACE_PERIOD;
    let answer = tokio::time::timeout(grace * 2, in_flight.answer())
        .await
        .expect("an answer once the grace period is over");
    assert_eq!(answer.grpc_status, "14", "UNAVAILABLE: {answer:?}");
    assert!(answer.message.contains("grace%20period"), "{answer:?}");
    let status = wait_exit(&mut server.0, Duration::from_secs(5));
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(
        server.stderr().contains("answering UNAVAILABLE"),
        "{}",
        server.stderr()
    );
}

/// Connections whose clients never read (a stopped or hung process; one that connected and
/// never spoke) never answer the GOAWAY's ping: with no call in flight they do not hold the
/// stop to the end of the grace period.
#[test]
fn connections_that_never_read_do_not_hold_the_stop_to_the_grace_period() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let (mut server, socket) = serving_in(dir.path());
    let silent = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    let mut spoke = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    // The HTTP/2 preface and an empty SETTINGS frame; the server's replies are never read.
    spoke
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let sent = std::time::Instant::now();
    send_signal(&server.0, Signal::SIGTERM);
    let status = wait_exit(&mut server.0, Duration::from_secs(15));
    let took = sent.elapsed();
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(
        took < Duration::from_secs(3),
        "held {took:?} by connections that never read (the grace period is {:?})",
        csi_nodekit::shutdown::GRACE_PERIOD
    );
    assert!(!socket.exists(), "the socket was left behind");
    assert!(
        !server.stderr().contains("did not finish"),
        "no call was in flight: {}",
        server.stderr()
    );
    drop((silent, spoke));
}
