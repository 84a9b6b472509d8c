//! The doctor on one plugin's chain, a failure class per test, each staged with real sockets:
//! endpoints that exist only in a container (with and without `--host-root`), a driver that
//! calls itself by another name, a dead or hung driver, a full listen queue, a driver not
//! ready, an empty node ID, versions the kubelet refuses, a path too long for a socket, and a
//! DRA plugin that is none of the doctor's business.

use crate::common;

use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use common::doctor::{
    KubeletRoot, behaviour, command, doctor, fake_driver, fake_plugin, registration, run,
    stale_socket,
};
use common::fake_plugin::{NodeAnswer, csi_plugin};

const D: &str = "x.csi.example.io";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn an_endpoint_that_exists_only_inside_the_registrars_container_is_named_with_the_right_path()
{
    let node = KubeletRoot::new();
    assert!(
        !Path::new("/csi/csi.sock").exists(),
        "this test needs /csi/csi.sock not to exist"
    );
    let driver = node.driver_socket(D);
    let _driver = fake_driver(&driver, behaviour(D), NodeAnswer::new("node-a", 0, &[]));
    let (_reg, _) = registration(&node.reg_socket(D), csi_plugin(D, "/csi/csi.sock"));
    let out = doctor(&node.root, &[]).await;
    assert_eq!(out.code, Some(1));
    assert_eq!(out.errors(), ["endpoint.missing"], "{:#}", out.report);
    let finding = &out.plugin(&node.reg_socket(D))["findings"][1];
    assert_eq!(
        finding["saw"],
        "the endpoint /csi/csi.sock does not exist on the host"
    );
    assert!(
        finding["means"]
            .as_str()
            .unwrap()
            .contains("exists only inside its container")
    );
    assert_eq!(
        finding["fix"],
        format!(
            "a socket exists at {}: pass that to the registrar as --kubelet-registration-path",
            driver.display()
        )
    );
    // The socket the registrar should have named is pointed out, not counted twice.
    assert_eq!(out.of("plugins.unregistered")[0].0, "warning");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn with_host_root_host_paths_are_looked_up_under_it() {
    let host = tempfile::tempdir().unwrap();
    let root = Path::new("/var/lib/kubelet");
    let on_host = |p: &str| host.path().join(p.trim_start_matches('/'));
    let good = "/var/lib/kubelet/plugins/x.csi.example.io/csi.sock";
    let _driver = fake_driver(
        &on_host(good),
        behaviour(D),
        NodeAnswer::new("node-a", 0, &[]),
    );
    let good_reg = "/var/lib/kubelet/plugins_registry/x.csi.example.io-reg.sock";
    let (_a, _) = registration(&on_host(good_reg), csi_plugin(D, good));
    let bad_reg = "/var/lib/kubelet/plugins_registry/y.csi.example.io-reg.sock";
    let (_b, _) = registration(
        &on_host(bad_reg),
        csi_plugin("y.csi.example.io", "/csi/csi.sock"),
    );
    let host_root = format!("--host-root={}", host.path().display());
    let out = doctor(root, &[&host_root]).await;
    assert_eq!(out.code, Some(1));
    assert_eq!(
        out.plugin(Path::new(good_reg))["healthy"],
        true,
        "{:#}",
        out.report
    );
    assert_eq!(out.report["hostRoot"], host.path().display().to_string());
    let missing = out.of("endpoint.missing");
    assert_eq!(
        missing[0].1,
        format!(
            "the endpoint /csi/csi.sock does not exist on the host (looked under --host-root {})",
            host.path().display()
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn a_driver_that_calls_itself_otherwise_than_its_registrar_says_is_an_error() {
    let node = KubeletRoot::new();
    let driver = node.driver_socket(D);
    let _driver = fake_driver(
        &driver,
        behaviour("other.csi.example.io"),
        NodeAnswer::new("node-a", 0, &[]),
    );
    let (_reg, _) = registration(
        &node.reg_socket(D),
        csi_plugin(D, &driver.display().to_string()),
    );
    let out = doctor(&node.root, &[]).await;
    assert_eq!(out.code, Some(1));
    assert_eq!(out.errors(), ["driver.name-mismatch"]);
    let (_, saw) = &out.of("driver.name-mismatch")[0];
    assert!(saw.contains("calls itself \"other.csi.example.io\", but the registrar announces \"x.csi.example.io\""), "{saw}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn a_dead_driver_behind_a_live_registrar_is_an_error() {
    let node = KubeletRoot::new();
    let driver = node.driver_socket(D);
    stale_socket(&driver);
    let (_reg, _) = registration(
        &node.reg_socket(D),
        csi_plugin(D, &driver.display().to_string()),
    );
    let out = doctor(&node.root, &[]).await;
    assert_eq!(out.code, Some(1));
    assert_eq!(out.errors(), ["endpoint.stale"], "{:#}", out.report);
}

/// A socket that accepts connections and never says a word.
fn silent_listener(path: &Path) -> tokio::task::JoinHandle<()> {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let listener = tokio::net::UnixListener::bind(path).unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn hung_sockets_cost_one_timeout_each_in_parallel_and_are_named() {
    let node = KubeletRoot::new();
    let hung_driver = node.driver_socket(D);
    let _silent = silent_listener(&hung_driver);
    let (_reg, _) = registration(
        &node.reg_socket(D),
        csi_plugin(D, &hung_driver.display().to_string()),
    );
    let hung_reg = node.reg_socket("hung.csi.example.io");
    let _silent_reg = silent_listener(&hung_reg);
    let _healthy: Vec<_> = (0..3)
        .map(|i| fake_plugin(&node, &format!("ok{i}.csi.example.io")))
        .collect();
    let out = doctor(&node.root, &["--timeout=1s"]).await;
    assert_eq!(out.code, Some(1));
    let hung: Vec<_> = out
        .findings()
        .into_iter()
        .filter(|(s, _, saw)| s == "error" && saw.contains("within 1s"))
        .map(|(_, check, _)| check)
        .collect();
    assert_eq!(hung.len(), 2, "{:#}", out.report);
    assert!(
        hung.contains(&"registration.get-info".to_owned()),
        "{hung:?}"
    );
    // Both hang at once, and each only until its first timeout (a functional bound, not a
    // benchmark: five sequential timeouts would be 5 s; one is 1 s, and the rest of the bound
    // is room for a loaded CI machine).
    assert!(
        out.took < Duration::from_millis(4000),
        "took {:?}",
        out.took
    );
    assert_eq!(out.report["summary"]["plugins"], 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn a_full_listen_queue_is_told_apart_from_a_dead_socket() {
    use nix::sys::socket::{
        AddressFamily, Backlog, SockFlag, SockType, UnixAddr, bind, listen, socket,
    };
    let node = KubeletRoot::new();
    let path = node.reg_socket("busy.csi.example.io");
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    bind(fd.as_raw_fd(), &UnixAddr::new(&path).unwrap()).unwrap();
    listen(&fd, Backlog::new(0).unwrap()).unwrap();
    let _queued = std::os::unix::net::UnixStream::connect(&path).unwrap();
    let out = doctor(&node.root, &[]).await;
    assert_eq!(out.code, Some(1));
    let dial = out.of("registration.dial");
    assert!(dial[0].1.contains("its listen queue is full"), "{dial:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn a_driver_that_is_not_ready_is_an_error() {
    let node = KubeletRoot::new();
    let plugin = fake_plugin(&node, D);
    *plugin.behaviour.ready.lock().unwrap() = Some(false);
    let out = doctor(&node.root, &[]).await;
    assert_eq!(out.code, Some(1));
    assert_eq!(out.errors(), ["driver.probe"]);
    assert_eq!(
        out.of("driver.probe")[0].1,
        "Probe: the driver responded but is not ready"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn an_empty_node_id_is_an_error_the_kubelet_never_retries() {
    let node = KubeletRoot::new();
    let plugin = fake_plugin(&node, D);
    plugin.answer.response.lock().unwrap().node_id.clear();
    let out = doctor(&node.root, &[]).await;
    assert_eq!(out.code, Some(1));
    assert_eq!(out.errors(), ["driver.node-id"]);
    let finding = &out.plugin(&node.reg_socket(D))["findings"];
    let means = finding
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "driver.node-id")
        .unwrap();
    assert!(
        means["means"].as_str().unwrap().contains("never retries"),
        "{means}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn versions_the_kubelet_refuses_are_reported_with_the_kubelets_own_text() {
    let node = KubeletRoot::new();
    let plugin = fake_plugin(&node, D);
    plugin.registrar.info.lock().unwrap().supported_versions = vec!["0.3.0".into()];
    let out = doctor(&node.root, &[]).await;
    assert_eq!(out.code, Some(1));
    assert_eq!(out.errors(), ["registration.versions"]);
    let finding = out.plugin(&node.reg_socket(D))["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "registration.versions")
        .cloned()
        .unwrap();
    let endpoint = node.driver_socket(D).display().to_string();
    assert_eq!(
        finding["means"],
        format!(
            "it answers NotifyRegistrationStatus(false) with: validation failed for CSI Driver {D} at endpoint {endpoint}: \
             kubernetes.io/csi: ValidatePlugin for CSI driver \"{D}\" failed. None of the versions specified [\"0.3.0\"] \
             are supported. err=highest supported version reported is 0.3.0, must be v1.x"
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn an_endpoint_longer_than_a_socket_path_can_be_is_an_error() {
    let node = KubeletRoot::new();
    let long = format!("/var/lib/kubelet/plugins/{}/csi.sock", "d".repeat(90));
    let (_reg, _) = registration(&node.reg_socket(D), csi_plugin(D, &long));
    let out = doctor(&node.root, &[]).await;
    assert_eq!(out.errors(), ["endpoint.too-long"]);
    assert_eq!(
        out.of("endpoint.too-long")[0].1,
        format!("the endpoint {long} is {} bytes long", long.len())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn a_dra_plugin_socket_is_noted_and_not_judged() {
    let node = KubeletRoot::new();
    let mut info = csi_plugin("gpu.example.com", "");
    info.r#type = "DRAPlugin".into();
    let (_reg, _) = registration(&node.registry().join("gpu.example.com-reg.sock"), info);
    let _csi = fake_plugin(&node, D);
    let out = run(command(&node.root, &[])).await;
    assert_eq!(out.code, Some(0), "{:#}", out.report);
    assert_eq!(
        out.of("registration.type")[0],
        ("info".into(), "a DRAPlugin socket, not a CSI driver".into())
    );
}
