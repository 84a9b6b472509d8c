//! Every gRPC server we run on a Unix socket answers whatever `:authority` a client sends, as
//! the Go servers do: the socket path that kubelets before 1.26 and Python's grpcio send, the
//! `localhost` of grpc-go, tonic's, or none. The clients are real: a frame-level HTTP/2 client
//! that puts the path on the wire, Python's grpcio (which does the same; `.ci/run` installs
//! it), and tonic.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::csi_node;
use common::fake_driver::FakeDriver;
use common::raw_h2::{PROTOCOL_ERROR, RawH2, Refused, Reply};
use common::registrar::{HOST_PATH, Registrar};
use csi_nodekit::proto::csi::{GetPluginInfoResponse, ProbeResponse};
use csi_nodekit::proto::registration::PluginInfo;
use prost::Message;

const GET_PLUGIN_INFO: &str = "/csi.v1.Identity/GetPluginInfo";
const PROBE: &str = "/csi.v1.Identity/Probe";
const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";

/// Runs blocking raw-client calls off the async workers.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work).await.expect("client")
}

fn ok(reply: Result<Reply, Refused>, what: &str) -> Vec<u8> {
    let reply = reply.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(
        (reply.status.as_str(), reply.grpc_status.as_str()),
        ("200", "0"),
        "{what}"
    );
    reply.message
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_csi_socket_answers_a_client_that_sends_the_socket_path_as_authority() {
    let (_sandbox, server, _) = csi_node::setup().await;
    let socket = server.socket.clone();
    let path = socket.display().to_string();
    blocking(move || {
        let mut client = RawH2::connect(&socket);
        for round in 0..2 {
            let info = ok(
                client.unary(Some(&path), GET_PLUGIN_INFO, &[]),
                "GetPluginInfo",
            );
            let info = GetPluginInfoResponse::decode(info.as_slice()).unwrap();
            assert_eq!(info.name, csi_node::DRIVER, "round {round}");
            let probe = ok(client.unary(Some(&path), PROBE, &[]), "Probe");
            let probe = ProbeResponse::decode(probe.as_slice()).unwrap();
            assert_ne!(probe.ready, Some(false));
        }
    })
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_no_authority_and_localhost_share_one_connection_and_tonic_still_works() {
    let (_sandbox, server, mut csi) = csi_node::setup().await;
    let socket = server.socket.clone();
    let path = socket.display().to_string();
    blocking(move || {
        let mut client = RawH2::connect(&socket);
        // The path first (rewritten from here on), then none, then "localhost", then the
        // path again through the entries the first call indexed.
        for authority in [
            Some(path.as_str()),
            None,
            Some("localhost"),
            Some(path.as_str()),
        ] {
            let info = ok(
                client.unary(authority, GET_PLUGIN_INFO, &[]),
                "GetPluginInfo",
            );
            let info = GetPluginInfoResponse::decode(info.as_slice()).unwrap();
            assert_eq!(info.name, csi_node::DRIVER, "{authority:?}");
        }
    })
    .await;
    let request = csi_nodekit::proto::csi::GetPluginInfoRequest {};
    let info = csi.identity.get_plugin_info(request).await.expect("tonic");
    assert_eq!(info.into_inner().name, csi_node::DRIVER);
    server.stop().await;
}

/// What a connection's first request decides: "localhost" there, and the rest passes unread,
/// so a client that switched to its path later on the same connection (none does: each takes
/// its authority from the address it dials) meets h2's refusal, as without the adapter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_began_with_localhost_is_passed_on_unread() {
    let (_sandbox, server, _) = csi_node::setup().await;
    let socket = server.socket.clone();
    let path = socket.display().to_string();
    blocking(move || {
        let mut client = RawH2::connect(&socket);
        ok(
            client.unary(Some("localhost"), PROBE, &[]),
            "Probe with localhost",
        );
        let refused = client.unary(Some(&path), PROBE, &[]);
        assert!(
            matches!(refused, Err(Refused::Reset(PROTOCOL_ERROR))),
            "{refused:?}"
        );
        ok(
            RawH2::connect(&socket).unary(Some(&path), PROBE, &[]),
            "a new connection",
        );
    })
    .await;
    server.stop().await;
}

/// A fake driver and the registrar serving its registration socket (in-process, as
/// `registrar::serve` runs in the binary).
async fn registrar(dir: &Path) -> (FakeDriver, Registrar, PathBuf) {
    let driver = FakeDriver::start(&dir.join("csi.sock"), "raw.csi.example.io");
    let registry = dir.join("plugins_registry");
    let registrar = Registrar::start(&driver.socket, &registry, &[]).await;
    let socket = registry.join("raw.csi.example.io-reg.sock");
    assert!(
        common::wait_until(Duration::from_secs(10), || common::is_socket(&socket)).await,
        "no registration socket"
    );
    (driver, registrar, socket)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registration_socket_answers_a_kubelet_that_sends_its_path_as_authority() {
    let dir = tempfile::tempdir().unwrap();
    let (_driver, _registrar, socket) = registrar(dir.path()).await;
    // What the kubelet before 1.26 puts on the wire: the path it dialled.
    let info = blocking(move || {
        let mut kubelet = RawH2::connect(&socket);
        let path = socket.display().to_string();
        ok(kubelet.unary(Some(&path), GET_INFO, &[]), "GetInfo")
    })
    .await;
    let info = PluginInfo::decode(info.as_slice()).unwrap();
    assert_eq!(info.name, "raw.csi.example.io");
    assert_eq!(info.endpoint, HOST_PATH);
}

/// One unary call with an empty request from Python's grpcio over `unix://`; the reply bytes.
fn python_grpcio(socket: &Path, method: &str) -> Vec<u8> {
    const SCRIPT: &str = "import sys, grpc\n\
        with grpc.insecure_channel(sys.argv[1]) as channel:\n\
        \x20   call = channel.unary_unary(sys.argv[2])\n\
        \x20   sys.stdout.buffer.write(call(b'', timeout=5))\n";
    let output = Command::new("python3")
        .args([
            "-c",
            SCRIPT,
            &format!("unix://{}", socket.display()),
            method,
        ])
        .output()
        .expect("python3 is needed for the grpcio client");
    assert!(
        output.status.success(),
        "grpcio {method}: {} (needs Python grpcio: `pip install grpcio==1.85.3`, .ci/run does)",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

#[ignore = "needs python3 grpcio: a real non-Go gRPC client (.ci/run installs it)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpcio_over_unix_is_answered_on_both_sockets() {
    let (_sandbox, server, _) = csi_node::setup().await;
    let socket = server.socket.clone();
    let info = blocking(move || python_grpcio(&socket, GET_PLUGIN_INFO)).await;
    let info = GetPluginInfoResponse::decode(info.as_slice()).unwrap();
    assert_eq!(info.name, csi_node::DRIVER);
    let dir = tempfile::tempdir().unwrap();
    let (_driver, _registrar, socket) = registrar(dir.path()).await;
    let info = blocking(move || python_grpcio(&socket, GET_INFO)).await;
    assert_eq!(
        PluginInfo::decode(info.as_slice()).unwrap().name,
        "raw.csi.example.io"
    );
    server.stop().await;
}

#[test]
fn the_raw_client_is_refused_by_a_plain_h2_server_so_the_tests_above_mean_something() {
    // tonic without our adapter, as every server was before: the path authority is reset.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("plain.sock");
    let _driver = runtime.block_on(async { FakeDriver::start(&socket, "plain.csi.example.io") });
    let refused = RawH2::connect(&socket).unary(Some(&socket.display().to_string()), PROBE, &[]);
    assert!(
        matches!(refused, Err(Refused::Reset(PROTOCOL_ERROR))),
        "{refused:?}"
    );
    let accepted = RawH2::connect(&socket).unary(Some("localhost"), PROBE, &[]);
    ok(accepted, "Probe with localhost");
}
