//! The whole registration flow with three real processes and no cluster: `node-server` (the
//! driver), `registrar`, and `probe kubelet` playing the kubelet, all in one temp dir.

use crate::common;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{KillOnDrop, is_socket, send_signal, wait_exit, wait_until_blocking as wait_until};
use csi_nodekit::proto::csi::{NodeGetInfoRequest, node_client::NodeClient};
use nix::sys::signal::Signal;
use serde_json::{Value, json};

const DRIVER: &str = "e2e.csi.example.io";
const NODE: &str = "e2e-node";

struct Flow {
    dir: tempfile::TempDir,
    http: String,
}

impl Flow {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            http: common::free_local_address(),
        }
    }
    fn csi(&self) -> PathBuf {
        self.dir.path().join(format!("plugins/{DRIVER}/csi.sock"))
    }
    fn registry(&self) -> PathBuf {
        self.dir.path().join("plugins_registry")
    }

    fn node_server(&self) -> Child {
        Command::new(common::binary())
            .args([
                "node-server",
                &format!("--endpoint=unix://{}", self.csi().display()),
            ])
            .args([format!(
                "--state-dir={}",
                self.dir.path().join("state").display()
            )])
            .args([
                format!("--driver-name={DRIVER}"),
                format!("--node-id={NODE}"),
                "--max-volumes-per-node=7".into(),
            ])
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start node-server")
    }

    /// The registrar with the arguments of a real DaemonSet; outside a container the host path
    /// of the driver socket is its own path.
    fn registrar(&self) -> Child {
        Command::new(common::binary())
            .args([
                "csi-node-driver-registrar",
                "--v=2",
                &format!("--csi-address={}", self.csi().display()),
            ])
            .arg(format!(
                "--kubelet-registration-path={}",
                self.csi().display()
            ))
            .arg(format!(
                "--plugin-registration-path={}",
                self.registry().display()
            ))
            .arg(format!("--http-endpoint={}", self.http))
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start registrar")
    }

    /// `probe kubelet` printing one JSON event per line; events arrive on the returned channel.
    fn kubelet(&self) -> (KillOnDrop, std::sync::mpsc::Receiver<Value>) {
        let mut child = Command::new(common::binary())
            .args([
                "probe",
                "kubelet",
                &format!("--plugins-registry={}", self.registry().display()),
            ])
            .args([format!("--node-name={NODE}"), "--output=json".into()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start probe kubelet");
        let stdout = child.stdout.take().unwrap();
        let (send, events) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                let event = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                if send.send(event).is_err() {
                    break;
                }
            }
        });
        (KillOnDrop::new(child), events)
    }
}

fn next_event(events: &std::sync::mpsc::Receiver<Value>) -> Value {
    events
        .recv_timeout(Duration::from_secs(15))
        .expect("an event from probe kubelet within 15 s")
}

fn stop(child: &mut KillOnDrop) {
    send_signal(&child.0, Signal::SIGTERM);
    assert_eq!(
        wait_exit(&mut child.0, Duration::from_secs(10)).code(),
        Some(0)
    );
}

fn node_get_info(socket: &Path) -> csi_nodekit::proto::csi::NodeGetInfoResponse {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let channel = csi_nodekit::socket::connect(socket).await.unwrap();
        NodeClient::new(channel)
            .node_get_info(NodeGetInfoRequest {})
            .await
            .unwrap()
            .into_inner()
    })
}

/// The status code of the registrar's `/readyz` (0 when it does not answer), with a plain
/// blocking HTTP/1.0 request: this test runs no async runtime to wait on.
fn readyz(address: &str) -> u16 {
    use std::io::{Read, Write};
    let ask = || -> std::io::Result<String> {
        let mut stream = std::net::TcpStream::connect(address)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(b"GET /readyz HTTP/1.0\r\n\r\n")?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply)?;
        Ok(reply)
    };
    let reply = ask().unwrap_or_default();
    // "HTTP/1.0 200 OK"
    let code = reply.split(' ').nth(1).and_then(|code| code.parse().ok());
    code.unwrap_or(0)
}

#[test]
fn the_driver_registers_deregisters_with_its_registrar_and_registers_again() {
    let flow = Flow::new();
    let mut driver = KillOnDrop::new(flow.node_server());
    assert!(
        wait_until(Duration::from_secs(10), || is_socket(&flow.csi())),
        "driver socket never appeared"
    );
    let (mut kubelet, events) = flow.kubelet();
    let mut registrar = KillOnDrop::new(flow.registrar());

    let registered = next_event(&events);
    assert_eq!(registered["event"], "registered", "{registered}");
    assert_eq!(registered["driver"], DRIVER);

    // The CSINode entry is exactly what NodeGetInfo says.
    let info = node_get_info(&flow.csi());
    let topology = info.accessible_topology.expect("topology");
    let mut keys: Vec<&String> = topology.segments.keys().collect();
    keys.sort();
    assert_eq!(info.node_id, NODE);
    assert_eq!(
        registered["csiNode"],
        json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSINode",
            "metadata": {"name": NODE},
            "spec": {"drivers": [{
                "name": DRIVER,
                "nodeID": info.node_id,
                "topologyKeys": keys,
                "allocatable": {"count": info.max_volumes_per_node},
            }]},
        })
    );
    let annotation = registered["node"]["annotations"]["csi.volume.kubernetes.io/nodeid"]
        .as_str()
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(annotation).unwrap(),
        json!({ DRIVER: NODE })
    );
    for (key, value) in &topology.segments {
        assert_eq!(
            registered["node"]["labels"][key],
            json!(value),
            "label {key}"
        );
    }
    assert!(
        wait_until(Duration::from_secs(5), || readyz(&flow.http) == 200),
        "registrar never saw success"
    );

    stop(&mut registrar);
    let gone = next_event(&events);
    assert_eq!(gone["event"], "deregistered", "{gone}");
    assert_eq!(gone["csiNode"]["spec"]["drivers"], json!([]));

    let _registrar = KillOnDrop::new(flow.registrar());
    let again = next_event(&events);
    assert_eq!(again["event"], "registered", "{again}");
    assert_eq!(again["csiNode"], registered["csiNode"]);

    stop(&mut kubelet);
    stop(&mut driver);
    assert!(!flow.csi().exists(), "driver socket left behind");
}

#[test]
fn a_restarted_driver_is_registered_again_through_a_new_registration_socket() {
    let flow = Flow::new();
    let mut driver = KillOnDrop::new(flow.node_server());
    assert!(wait_until(Duration::from_secs(10), || is_socket(
        &flow.csi()
    )));
    let (_kubelet, events) = flow.kubelet();
    let _registrar = KillOnDrop::new(flow.registrar());
    assert_eq!(next_event(&events)["event"], "registered");

    stop(&mut driver);
    let _driver = KillOnDrop::new(flow.node_server());
    // The registrar re-creates its socket: the kubelet deregisters, then registers afresh and
    // reads NodeGetInfo again.
    assert_eq!(next_event(&events)["event"], "deregistered");
    let again = next_event(&events);
    assert_eq!(again["event"], "registered", "{again}");
    assert_eq!(again["nodeID"], NODE);
}
