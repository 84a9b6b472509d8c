//! The doctor's Kubernetes API comparisons against a fake API server over real HTTPS (a test CA
//! from rcgen) and a kubeconfig pointing at it: a driver missing from the CSINode, a node ID or
//! topology keys that differ, no CSIDriver object, attachRequired for a driver without
//! ControllerPublishVolume, a CSINode entry nobody announces — with our own node-server and
//! registrar beside fakes — and proof that only GETs were made.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use common::binary;
use common::doctor::{KubeletRoot, Outcome, empty_proc, fake_plugin, our_plugin, run};
use common::fake_api::FakeApi;
use serde_json::{Value, json};

const OURS: &str = "nodekit.csi.local";
const CSINODE: &str = "/apis/storage.k8s.io/v1/csinodes/node-a";
const CSIDRIVERS: &str = "/apis/storage.k8s.io/v1/csidrivers";
const NODE: &str = "/api/v1/nodes/node-a";

fn doctor(root: &Path, kubeconfig: &Path) -> Command {
    let mut command = Command::new(binary());
    command
        .args(["probe", "doctor", "--output=json", "--node-name=node-a"])
        .arg(format!("--kubelet-root={}", root.display()))
        .arg(format!("--proc-root={}", empty_proc().display()))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .stdin(Stdio::null());
    command
}

fn api_findings(out: &Outcome) -> Vec<(String, String)> {
    out.findings()
        .into_iter()
        .filter(|(_, check, _)| check.starts_with("api."))
        .map(|(severity, check, _)| (severity, check))
        .collect()
}

fn csidriver(name: &str, attach_required: bool) -> Value {
    json!({"metadata": {"name": name}, "spec": {"attachRequired": attach_required}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn the_api_objects_are_compared_with_the_node_and_only_read() {
    let node = KubeletRoot::new();
    let (_server, _registrar, _) = our_plugin(&node, OURS).await;
    let _a = fake_plugin(&node, "a.csi.example.io"); // node ID node-a; the CSINode says old-id
    let b = fake_plugin(&node, "b.csi.example.io"); // topology zone; the CSINode says rack
    *b.answer.response.lock().unwrap() = csi_nodekit::proto::csi::NodeGetInfoResponse {
        node_id: "node-a".into(),
        max_volumes_per_node: 0,
        accessible_topology: Some(csi_nodekit::proto::csi::Topology {
            segments: [("zone".to_owned(), "z1".to_owned())].into(),
        }),
    };
    let _c = fake_plugin(&node, "c.csi.example.io"); // not in the CSINode at all
    let csinode = json!({"kind": "CSINode", "metadata": {"name": "node-a"}, "spec": {"drivers": [
        {"name": OURS, "nodeID": "node-a", "topologyKeys": ["topology.nodekit.csi.local/node"], "allocatable": {"count": 7}},
        {"name": "a.csi.example.io", "nodeID": "old-id", "topologyKeys": null},
        {"name": "b.csi.example.io", "nodeID": "node-a", "topologyKeys": ["rack"]},
        {"name": "gone.csi.example.io", "nodeID": "node-a"},
    ]}});
    let drivers = json!({"kind": "CSIDriverList", "items": [
        csidriver(OURS, true), csidriver("a.csi.example.io", false), csidriver("c.csi.example.io", false),
    ]});
    let annotation = json!({OURS: "node-a", "a.csi.example.io": "old-id"}).to_string();
    let node_object = json!({"kind": "Node", "metadata": {"name": "node-a",
        "annotations": {"csi.volume.kubernetes.io/nodeid": annotation}}});
    let objects = BTreeMap::from([
        (CSINODE.to_owned(), (200, csinode)),
        (CSIDRIVERS.to_owned(), (200, drivers)),
        (NODE.to_owned(), (200, node_object)),
    ]);
    let api = FakeApi::start(objects).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path(), "      token: sekret-token\n");

    let out = run(doctor(&node.root, &kubeconfig)).await;
    assert_eq!(out.code, Some(1), "{:#}\n{}", out.report, out.stderr);
    assert_eq!(api_findings(&out), expected(), "{:#}", out.report);
    let saw = |check: &str| out.of(check)[0].1.clone();
    assert_eq!(
        saw("api.node-id"),
        "the CSINode has node ID \"old-id\" for a.csi.example.io, the driver now answers \"node-a\""
    );
    assert_eq!(
        saw("api.topology"),
        "the CSINode has topology keys [rack] for b.csi.example.io, the driver now answers [zone]"
    );
    assert_eq!(
        saw("api.not-registered"),
        "driver c.csi.example.io answers on this node, but the CSINode does not list it"
    );
    assert_eq!(
        saw("api.no-csidriver"),
        "there is no CSIDriver object named b.csi.example.io"
    );
    assert_eq!(
        saw("api.attach-required"),
        "CSIDriver nodekit.csi.local has attachRequired true, but the driver has no ControllerPublishVolume"
    );
    assert!(saw("api.unknown-driver").contains("gone.csi.example.io"));
    assert!(
        out.report["api"]
            .as_str()
            .unwrap()
            .starts_with("kubeconfig "),
        "{}",
        out.report["api"]
    );

    let seen = api.seen();
    assert_eq!(seen.len(), 3, "{seen:?}");
    let mut paths: Vec<&str> = seen.iter().map(|s| s.path.as_str()).collect();
    paths.sort();
    assert_eq!(paths, [NODE, CSIDRIVERS, CSINODE]);
    for request in &seen {
        assert_eq!(request.method, "GET", "{request:?}");
        assert_eq!(
            request.authorization.as_deref(),
            Some("Bearer sekret-token")
        );
    }
}

/// The findings the first test expects, in report order (node-wide findings first, in the
/// order the comparisons run: CSINode per local driver, then CSIDrivers, then the Node).
fn expected() -> Vec<(String, String)> {
    [
        ("error", "api.node-id"),
        ("error", "api.topology"),
        ("error", "api.not-registered"),
        ("ok", "api.csinode"),
        ("warning", "api.unknown-driver"),
        ("warning", "api.no-csidriver"),
        ("warning", "api.attach-required"),
        ("warning", "api.annotation"),
    ]
    .into_iter()
    .map(|(s, c)| (s.to_owned(), c.to_owned()))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn a_client_certificate_authenticates_and_a_missing_csinode_is_an_error() {
    let node = KubeletRoot::new();
    let _a = fake_plugin(&node, "a.csi.example.io");
    let drivers = json!({"items": [csidriver("a.csi.example.io", false)]});
    let api = FakeApi::start(BTreeMap::from([(CSIDRIVERS.to_owned(), (200, drivers))])).await;
    let client = api.ca.sign(&["doctor"]);
    let b64 = |pem: &str| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(pem)
    };
    let user = format!(
        "      client-certificate-data: {}\n      client-key-data: {}\n",
        b64(&client.cert_pem),
        b64(&client.key_pem)
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path(), &user);
    let out = run(doctor(&node.root, &kubeconfig)).await;
    assert_eq!(out.code, Some(1), "{:#}", out.report);
    assert_eq!(out.errors(), ["api.csinode-missing"]);
    assert!(
        api.seen()
            .iter()
            .all(|s| s.client_certificate && s.authorization.is_none() && s.method == "GET")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn a_forbidden_api_is_a_warning_that_names_the_rights_needed() {
    let node = KubeletRoot::new();
    let _a = fake_plugin(&node, "a.csi.example.io");
    let forbidden =
        json!({"kind": "Status", "message": "csinodes.storage.k8s.io \"node-a\" is forbidden"});
    let objects = BTreeMap::from([
        (CSINODE.to_owned(), (403, forbidden.clone())),
        (CSIDRIVERS.to_owned(), (403, forbidden.clone())),
        (NODE.to_owned(), (403, forbidden)),
    ]);
    let api = FakeApi::start(objects).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path(), "      token: t\n");
    let out = run(doctor(&node.root, &kubeconfig)).await;
    assert_eq!(
        out.code,
        Some(0),
        "warnings do not fail the doctor: {:#}",
        out.report
    );
    let unavailable = out.of("api.unavailable");
    assert_eq!(unavailable.len(), 3);
    assert_eq!(
        unavailable[0],
        (
            "warning".to_owned(),
            format!("GET {CSINODE}: HTTP 403 csinodes.storage.k8s.io \"node-a\" is forbidden")
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn a_server_certificate_from_another_ca_is_an_error_naming_the_certificate_authority() {
    let node = KubeletRoot::new();
    let api = FakeApi::start(BTreeMap::new()).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path(), "      token: t\n");
    std::fs::write(
        dir.path().join("ca.crt"),
        common::fake_api::TestCa::new().ca_pem,
    )
    .unwrap();
    let out = run(doctor(&node.root, &kubeconfig)).await;
    let unavailable = out.of("api.unavailable");
    assert_eq!(unavailable.len(), 3, "{unavailable:?}");
    assert_eq!(unavailable[0].0, "error");
    assert!(
        unavailable[0].1.contains(
            "TLS: the server's certificate is not signed by the certificate authority the \
             kubeconfig gives"
        ),
        "in words, not rustls' variant names: {unavailable:?}"
    );
    assert_eq!(out.code, Some(1), "{:#}", out.report);
    assert!(
        out.report
            .to_string()
            .contains("certificate-authority-data in the kubeconfig"),
        "the fix names what to give: {:#}",
        out.report
    );
    assert!(api.seen().is_empty());
}

/// A kubeconfig whose cluster is at `server`, with no CA (plain HTTP) and a token.
fn kubeconfig_for(dir: &Path, server: &str) -> std::path::PathBuf {
    let text = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: test\n\
         clusters:\n- name: c\n  cluster:\n    server: {server}\n\
         contexts:\n- name: test\n  context:\n    cluster: c\n    user: u\n\
         users:\n- name: u\n  user:\n    token: t\n"
    );
    let path = dir.join("kubeconfig");
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn an_api_server_that_does_not_resolve_or_does_not_listen_is_an_error_never_no_problem() {
    let node = KubeletRoot::new();
    let _plugin = fake_plugin(&node, "a.csi.example.io");
    let dir = tempfile::tempdir().unwrap();
    // `.invalid` never resolves (RFC 6761); a port nobody listens on refuses at once.
    let closed = common::free_local_address();
    for (server, saw, fix) in [
        (
            "http://api.no-such-cluster.invalid:6443".to_owned(),
            "the host name \"api.no-such-cluster.invalid\" does not resolve",
            "use a name this node resolves",
        ),
        (
            format!("http://{closed}"),
            "connect: Connection refused",
            "check the kubeconfig's server: address",
        ),
    ] {
        let kubeconfig = kubeconfig_for(dir.path(), &server);
        let out = run(doctor(&node.root, &kubeconfig)).await;
        let unavailable = out.of("api.unavailable");
        assert!(
            !unavailable.is_empty() && unavailable.iter().all(|(severity, _)| severity == "error"),
            "{server}: {unavailable:?}"
        );
        assert!(unavailable[0].1.contains(saw), "{server}: {unavailable:?}");
        assert!(
            out.report.to_string().contains(fix),
            "{server}: {:#}",
            out.report
        );
        assert_eq!(out.code, Some(1), "{server}: {:#}", out.report);
    }
}
