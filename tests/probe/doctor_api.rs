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

/// The doctor could not reach the API server at `server`: an error (every finding of it),
/// exit 1, the first finding saying `saw` and the report giving `fix`.
fn assert_unreachable(out: &Outcome, server: &str, saw: &str, fix: &str) {
    let unavailable = out.of("api.unavailable");
    assert!(
        !unavailable.is_empty() && unavailable.iter().all(|(severity, _)| severity == "error"),
        "{server}: {unavailable:?}\n{}",
        out.stderr
    );
    assert!(unavailable[0].1.contains(saw), "{server}: {unavailable:?}");
    assert!(
        out.report.to_string().contains(fix),
        "{server}: {:#}",
        out.report
    );
    assert_eq!(out.code, Some(1), "{server}: {:#}", out.report);
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
        assert_unreachable(&out, &server, saw, fix);
    }
}

/// `command` run in a mount namespace of its own where `/etc/hosts` and `/etc/resolv.conf` are
/// the given files: what the binary reads to look names up, and nothing else changed.
fn with_name_files(hosts: &Path, resolv_conf: &Path, command: &Command) -> Command {
    let mut wrapped = Command::new("unshare");
    wrapped
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind "$1" /etc/hosts && mount --bind "$2" /etc/resolv.conf && shift 2 && exec "$@""#)
        .arg("sh")
        .arg(hosts)
        .arg(resolv_conf)
        .arg(command.get_program())
        .args(command.get_args())
        .stdin(Stdio::null());
    wrapped
}

/// A name server on its own loopback address's port 53 answering one name's A question (and
/// nothing for AAAA); NXDOMAIN for every other name. Every question is counted.
fn answer_one_name(
    listen: std::net::Ipv4Addr,
    name: &'static str,
    address: std::net::Ipv4Addr,
) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    use simple_dns::{CLASS, Packet, QTYPE, RCODE, ResourceRecord, TYPE, rdata};
    let socket = std::net::UdpSocket::bind((listen, 53)).expect("bind a loopback port 53");
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = asked.clone();
    std::thread::spawn(move || {
        let mut buffer = [0u8; 1500];
        while let Ok((read, from)) = socket.recv_from(&mut buffer) {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let Ok(query) = Packet::parse(&buffer[..read]) else {
                continue;
            };
            let question = query.questions[0].clone();
            let mut reply = Packet::new_reply(query.id());
            if !question.qname.to_string().eq_ignore_ascii_case(name) {
                *reply.rcode_mut() = RCODE::NameError;
            } else if question.qtype == QTYPE::TYPE(TYPE::A) {
                let a = rdata::RData::A(rdata::A::from(address));
                reply
                    .answers
                    .push(ResourceRecord::new(question.qname.clone(), CLASS::IN, 5, a));
            }
            reply.questions.push(question);
            let _ = socket.send_to(&reply.build_bytes_vec().unwrap(), from);
        }
    });
    asked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it; mounts over /etc/hosts in a namespace of its own"]
async fn api_server_names_are_looked_up_in_etc_hosts_and_dns_without_glibc() {
    let node = KubeletRoot::new();
    let _plugin = fake_plugin(&node, "a.csi.example.io");
    let dir = tempfile::tempdir().unwrap();
    // Every name below resolves to 127.0.0.1, where this port refuses: "connection refused"
    // proves the name was found, "does not resolve" that it was not.
    let free = common::free_local_address();
    let port = free.rsplit_once(':').unwrap().1;
    let (hosts, resolv_conf) = (dir.path().join("hosts"), dir.path().join("resolv.conf"));
    std::fs::write(&hosts, "127.0.0.1 api.from-hosts.nodekit.test\n").unwrap();
    let dns_server = std::net::Ipv4Addr::new(127, 53, 0, 1);
    std::fs::write(
        &resolv_conf,
        format!("nameserver {dns_server}\noptions timeout:1 attempts:1\n"),
    )
    .unwrap();
    let asked = answer_one_name(
        dns_server,
        "api.from-dns.nodekit.test",
        std::net::Ipv4Addr::LOCALHOST,
    );
    for (host, saw, fix) in [
        (
            "api.from-hosts.nodekit.test",
            "Connection refused",
            "check the kubeconfig's server:",
        ),
        (
            "api.from-dns.nodekit.test",
            "Connection refused",
            "check the kubeconfig's server:",
        ),
        // Not in the hosts file: localhost needs none.
        (
            "localhost",
            "Connection refused",
            "check the kubeconfig's server:",
        ),
        (
            "api.nowhere.nodekit.test",
            "the host name \"api.nowhere.nodekit.test\" does not resolve: no such host",
            "use a name this node resolves",
        ),
    ] {
        let kubeconfig = kubeconfig_for(dir.path(), &format!("http://{host}:{port}"));
        let out = run(with_name_files(
            &hosts,
            &resolv_conf,
            &doctor(&node.root, &kubeconfig),
        ))
        .await;
        assert_unreachable(&out, host, saw, fix);
    }
    assert!(
        asked.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "DNS was never asked"
    );

    // A name server that never answers: an error naming the servers and the fix, in ~1 s.
    std::fs::write(
        &resolv_conf,
        "nameserver 127.53.0.2\noptions timeout:1 attempts:1\n",
    )
    .unwrap();
    let _silent = std::net::UdpSocket::bind(("127.53.0.2", 53)).unwrap();
    let kubeconfig = kubeconfig_for(
        dir.path(),
        &format!("http://api.silent.nodekit.test:{port}"),
    );
    let out = run(with_name_files(
        &hosts,
        &resolv_conf,
        &doctor(&node.root, &kubeconfig),
    ))
    .await;
    let (saw, fix) = (
        "no answer from the name servers 127.53.0.2",
        "no name server answered",
    );
    assert_unreachable(&out, "api.silent.nodekit.test", saw, fix);
}
