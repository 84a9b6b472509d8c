//! Real processes and real signals: a graceful stop leaves nothing behind, a second signal
//! does not wait for stuck calls.

use crate::common;

use std::time::Duration;

use common::{
    is_socket, send_signal, spawn_node_server, wait_exit, wait_until, wait_until_blocking,
};
use nix::sys::signal::Signal;

fn graceful_stop_on(signal: Signal) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let mut server = spawn_node_server(&socket, &dir.path().join("state"), &[]);
    assert!(
        wait_until_blocking(Duration::from_secs(10), || is_socket(&socket)),
        "socket never appeared"
    );
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

/// Opens an HTTP/2 stream for a unary call and never finishes its body, so the call stays in
/// flight for as long as the returned handles live.
async fn hold_a_call_open(socket: &std::path::Path) -> impl Sized {
    let io = tokio::net::UnixStream::connect(socket).await.unwrap();
    let (mut client, mut connection) = h2::client::handshake(io).await.unwrap();
    let mut ping_pong = connection.ping_pong().expect("a ping handle");
    tokio::spawn(connection);
    let request = http::Request::post("http://localhost/csi.v1.Identity/Probe")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, body) = client.send_request(request, false).unwrap();
    // The gate: the server reads frames in order, so its PONG means it has the call's HEADERS.
    ping_pong.ping(h2::Ping::opaque()).await.expect("a PONG");
    (client, response, body)
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
    let _in_flight = hold_a_call_open(&socket).await;

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
