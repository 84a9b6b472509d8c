//! `csi-nodekit probe doctor` as a real process against staged nodes: a healthy node with our
//! own node-server and registrar, the registry's failure classes (stale, not a socket, one
//! driver twice, a driver socket nobody announces, nothing at all), exit codes, and proof that
//! the doctor changes nothing — files, the registrar's state, an upstream-style registrar that
//! would exit on NotifyRegistrationStatus(false).

use crate::common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::binary;
use common::doctor::{
    KubeletRoot, command, doctor, fake_plugin, our_plugin, registration, snapshot, stale_socket,
};
use common::fake_plugin::csi_plugin;
use common::upstream_registrar::UpstreamRegistrar;

const DRIVER: &str = "nodekit.csi.local";

async fn registrar_metrics(http: &str) -> String {
    let (status, body) = csi_nodekit::http::get(http, "/metrics", Duration::from_secs(5))
        .await
        .expect("registrar /metrics");
    assert_eq!(status, 200);
    // The registrar's own view of its state; nothing the doctor does may move it.
    body.lines()
        .filter(|l| l.starts_with("csi_nodekit_registrar_"))
        .map(str::to_owned)
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn a_healthy_node_with_our_node_server_and_registrar_reports_no_problem() {
    let node = KubeletRoot::new();
    let (_server, _registrar, _) = our_plugin(&node, DRIVER).await;
    let lock = node.registry().join(format!("{DRIVER}-reg.sock.lock"));
    assert!(lock.is_file(), "the registrar holds its claim in {lock:?}");
    let out = doctor(&node.root, &[]).await;
    assert_eq!(out.code, Some(0), "{:#}\n{}", out.report, out.stderr);
    assert_eq!(out.report["summary"]["errors"], 0);
    assert_eq!(out.report["summary"]["warnings"], 0, "{:#}", out.report);
    let about_the_lock: Vec<_> = out
        .findings()
        .into_iter()
        .filter(|(_, _, saw)| saw.contains(".lock"))
        .collect();
    assert!(
        about_the_lock.is_empty(),
        "the registrar's own lock file is no finding: {about_the_lock:?}"
    );
    let plugin = out.plugin(&node.reg_socket(DRIVER));
    assert_eq!(plugin["driver"], DRIVER);
    assert_eq!(plugin["healthy"], true);
    let checks: Vec<&str> = plugin["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["check"].as_str().unwrap())
        .collect();
    assert_eq!(
        checks,
        [
            "registration.get-info",
            "endpoint.socket",
            "driver.plugin-info",
            "driver.probe",
            "driver.node-info"
        ]
    );
    let (_, node_info) = &out.of("driver.node-info")[0];
    assert!(
        node_info.contains(
            "node ID \"node-a\", at most 7 volumes, topology keys [topology.nodekit.csi.local/node]"
        ),
        "{node_info}"
    );
    assert_eq!(out.report["kubeletRoot"]["source"], "flag");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn the_doctor_changes_no_file_no_registrar_state_and_calls_nothing_but_get_info() {
    let node = KubeletRoot::new();
    let (_server, _registrar, http) = our_plugin(&node, DRIVER).await;
    // Every kind of entry the doctor reads, beside our plugin.
    let upstream_socket = node.reg_socket("upstream.csi.example.io");
    let upstream = UpstreamRegistrar::start(
        &upstream_socket,
        csi_plugin("upstream.csi.example.io", "/nonexistent/csi.sock"),
    );
    stale_socket(&node.reg_socket("gone.csi.example.io"));
    std::fs::write(node.reg_socket("file.csi.example.io"), b"not a socket").unwrap();
    stale_socket(&node.driver_socket("orphan.csi.example.io"));
    let files_before = snapshot(&node.root);
    let state_before = registrar_metrics(&http).await;

    let out = doctor(&node.root, &[]).await;
    assert_eq!(out.code, Some(1), "the staged faults are errors");

    assert_eq!(
        snapshot(&node.root),
        files_before,
        "the doctor changed the kubelet root"
    );
    assert_eq!(registrar_metrics(&http).await, state_before);
    assert!(
        state_before.contains(r#"csi_nodekit_registrar_state{state="waiting_for_kubelet"} 1"#),
        "{state_before}"
    );
    assert_eq!(
        upstream.record.calls(),
        ["/pluginregistration.Registration/GetInfo"]
    );
    assert!(
        !upstream.record.exited(),
        "the upstream-style registrar was told to give up"
    );
    // Still serving: the doctor's second run sees it answer again.
    let again = doctor(&node.root, &[]).await;
    assert_eq!(
        again.plugin(&upstream_socket)["driver"],
        "upstream.csi.example.io"
    );
    assert_eq!(upstream.record.calls().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn a_stale_registration_socket_is_an_error_unless_its_driver_registers_elsewhere() {
    let node = KubeletRoot::new();
    stale_socket(&node.reg_socket("gone.csi.example.io"));
    let out = doctor(&node.root, &[]).await;
    assert_eq!(out.code, Some(1));
    let stale = out.of("registration.stale");
    assert_eq!(stale.len(), 1);
    assert_eq!(stale[0].0, "error");
    assert!(
        stale[0]
            .1
            .contains("gone.csi.example.io-reg.sock is a socket nobody listens on"),
        "{stale:?}"
    );

    // The same driver alive under another name: the stale one is only a leftover.
    let _live = fake_plugin(&node, "x.csi.example.io");
    stale_socket(&node.registry().join("old/x.csi.example.io-reg.sock"));
    let out = doctor(&node.root, &[]).await;
    let leftover: Vec<_> = out
        .of("registration.stale")
        .into_iter()
        .filter(|(_, saw)| saw.contains("old/x.csi"))
        .collect();
    assert_eq!(leftover.len(), 1);
    assert_eq!(leftover[0].0, "warning", "{:#}", out.report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn a_file_in_the_registry_named_like_a_registration_socket_is_an_error() {
    let node = KubeletRoot::new();
    let _ok = fake_plugin(&node, "a.csi.example.io");
    std::fs::write(node.reg_socket("b.csi.example.io"), b"").unwrap();
    std::fs::write(node.registry().join("README"), b"").unwrap();
    let out = doctor(&node.root, &[]).await;
    assert_eq!(out.code, Some(1));
    assert_eq!(out.errors(), ["registry.not-socket"]);
    let (_, saw) = &out.of("registry.not-socket")[0];
    assert!(
        saw.ends_with("b.csi.example.io-reg.sock is a regular file, not a socket"),
        "{saw}"
    );
    assert_eq!(
        out.of("registry.ignored")[0].0,
        "info",
        "other files are only ignored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn two_registration_sockets_for_one_driver_are_an_error_on_both() {
    let node = KubeletRoot::new();
    let plugin = fake_plugin(&node, "twice.csi.example.io");
    let endpoint = plugin.driver.socket.display().to_string();
    let second = node.registry().join("second-reg.sock");
    let (_second, _) = registration(&second, csi_plugin("twice.csi.example.io", &endpoint));
    let out = doctor(&node.root, &[]).await;
    assert_eq!(out.code, Some(1));
    let duplicates = out.of("registration.duplicate");
    assert_eq!(duplicates.len(), 2, "{:#}", out.report);
    assert!(
        duplicates[0]
            .1
            .contains("announced by 2 registration sockets"),
        "{duplicates:?}"
    );
    assert_eq!(
        out.errors(),
        ["registration.duplicate", "registration.duplicate"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn a_driver_socket_no_registrar_announces_is_an_error_and_a_dead_one_a_warning() {
    let node = KubeletRoot::new();
    let lonely = node.driver_socket("lonely.csi.example.io");
    let _driver = common::doctor::fake_driver(
        &lonely,
        common::doctor::behaviour("lonely.csi.example.io"),
        common::fake_plugin::NodeAnswer::new("node-a", 0, &[]),
    );
    stale_socket(&node.driver_socket("dead.csi.example.io"));
    let out = doctor(&node.root, &[]).await;
    assert_eq!(out.code, Some(1));
    let unregistered = out.of("plugins.unregistered");
    assert_eq!(unregistered.len(), 1);
    assert!(
        unregistered[0].1.contains(
            "serves driver \"lonely.csi.example.io\", but no registration socket announces it"
        ),
        "{unregistered:?}"
    );
    assert_eq!(out.of("plugins.stale")[0].0, "warning");
    assert_eq!(out.of("registry.empty")[0].0, "warning");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn a_missing_registry_is_reported_and_not_created() {
    let dir = tempfile::tempdir().unwrap();
    let out = doctor(dir.path(), &[]).await;
    assert_eq!(out.code, Some(1));
    assert_eq!(out.errors(), ["root.no-registry"]);
    assert!(
        !dir.path().join("plugins_registry").exists(),
        "the doctor created the registry"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn the_text_report_has_one_line_per_finding_grouped_per_plugin_and_a_summary() {
    let node = KubeletRoot::new();
    let _ok = fake_plugin(&node, "a.csi.example.io");
    stale_socket(&node.reg_socket("b.csi.example.io"));
    let mut text = command(&node.root, &["--output=text"]);
    text.stdout(Stdio::piped());
    let output = tokio::task::spawn_blocking(move || text.output().unwrap())
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "node node-a");
    assert!(
        lines[1].starts_with(&format!(
            "  info     kubelet root {} — given with --kubelet-root",
            node.root.display()
        )),
        "{stdout}"
    );
    let a = lines
        .iter()
        .position(|l| l.ends_with("a.csi.example.io-reg.sock (driver a.csi.example.io)"))
        .expect(&stdout);
    assert!(lines[a].starts_with("plugin "), "{stdout}");
    assert!(
        lines[a + 1].starts_with("  ok       GetInfo: type CSIPlugin"),
        "{stdout}"
    );
    let b = lines
        .iter()
        .position(|l| l.ends_with("b.csi.example.io-reg.sock"))
        .expect(&stdout);
    assert!(
        lines[b + 1].starts_with("  error    ") && lines[b + 1].contains(". Fix: "),
        "{stdout}"
    );
    let summary = lines.last().unwrap();
    assert!(
        summary.starts_with("summary: 2 plugins, 1 error, 0 warnings in "),
        "{summary}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_usage_exits_2_with_a_line_naming_the_flag() {
    for (args, names) in [
        (&["--output=yaml"][..], "--output"),
        (&["--timeout=soon"][..], "--timeout"),
        (&["--timeout=0s"][..], "--timeout"),
        (&["--kubelet-root=var/lib/kubelet"][..], "--kubelet-root"),
        (
            &["--kubeconfig=/nonexistent/config"][..],
            "/nonexistent/config",
        ),
    ] {
        let mut cmd = Command::new(binary());
        cmd.args(["probe", "doctor"])
            .args(args)
            .stdin(Stdio::null());
        let output = tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(names) && stderr.lines().count() == 1,
            "{args:?}: {stderr}"
        );
    }
}
