//! `csi-nodekit probe kubelet` as a real process: the `--once` report and exit codes, and the
//! events it prints while it watches.

use crate::common;

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::eventually;
use common::fake_plugin::{Bind, NodeAnswer, csi_plugin, node, registration};
use common::{KillOnDrop, binary, send_signal, wait_exit};
use serde_json::{Value, json};

fn kubelet(registry: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new(binary());
    command
        .args(["probe", "kubelet", "--node-name", "node-a"])
        .arg(format!("--plugins-registry={}", registry.display()))
        .args(extra)
        .stdin(Stdio::null());
    command
}

/// Runs the command to its end off the async threads (the fakes are served on them).
async fn finish(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().expect("run csi-nodekit"))
        .await
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_prints_the_report_and_exits_0_when_every_plugin_registered() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("registry");
    let driver_socket = dir.path().join("csi.sock");
    let _driver = node(&driver_socket, NodeAnswer::new("n1", 5, &[("zone", "z")]));
    let endpoint = driver_socket.display().to_string();
    let (_reg, registrar) = registration(
        &registry.join("a-reg.sock"),
        Bind::AtPath,
        csi_plugin("a.csi", &endpoint),
    );

    let out = finish(kubelet(&registry, &["--once", "--output", "json"])).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
    assert_eq!(
        report["plugins"],
        json!([{
            "socket": registry.join("a-reg.sock"), "registered": true, "driver": "a.csi",
            "endpoint": endpoint, "nodeID": "n1",
        }])
    );
    assert_eq!(
        report["csiNode"],
        json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
            "metadata": {"name": "node-a"},
            "spec": {"drivers": [{
                "name": "a.csi", "nodeID": "n1", "topologyKeys": ["zone"],
                "allocatable": {"count": 5},
            }]},
        })
    );
    assert_eq!(
        report["node"],
        json!({
            "name": "node-a",
            "annotations": {"csi.volume.kubernetes.io/nodeid": "{\"a.csi\":\"n1\"}"},
            "labels": {"zone": "z"},
        })
    );
    assert!(registrar.statuses(1, Duration::from_secs(1)).await[0].plugin_registered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_exits_1_with_the_reason_when_a_plugin_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("registry");
    let driver_socket = dir.path().join("csi.sock");
    let _driver = node(&driver_socket, NodeAnswer::new("n1", 0, &[]));
    let endpoint = driver_socket.display().to_string();
    let (_good, _) = registration(
        &registry.join("a-reg.sock"),
        Bind::AtPath,
        csi_plugin("a.csi", &endpoint),
    );
    let mut old = csi_plugin("b.csi", &endpoint);
    old.supported_versions = vec!["0.3.0".into()];
    let (_bad, _) = registration(&registry.join("b-reg.sock"), Bind::AtPath, old);

    let out = finish(kubelet(&registry, &["--once"])).await;
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("registered  a.csi from "), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "failed      {}: RegisterPlugin error -- plugin validation failed",
            registry.join("b-reg.sock").display()
        )),
        "{stdout}"
    );
    assert!(stdout.contains("1 of 2 plugins registered"), "{stdout}");
    assert!(
        stdout.contains(r#"annotation csi.volume.kubernetes.io/nodeid: {"a.csi":"n1"}"#),
        "{stdout}"
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("1 of 2 plugins failed to register"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_on_a_missing_registry_creates_it_and_exits_1_for_finding_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("new/registry");
    let out = finish(kubelet(&registry, &["--once"])).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(registry.is_dir());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "no plugin sockets found in {}",
            registry.display()
        )),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_output_format_is_bad_usage() {
    let dir = tempfile::tempdir().unwrap();
    let out = finish(kubelet(dir.path(), &["--once", "--output", "yaml"])).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("\"yaml\""),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watching_prints_each_event_as_it_happens_and_sigterm_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("registry");
    let driver_socket = dir.path().join("csi.sock");
    let _driver = node(&driver_socket, NodeAnswer::new("n1", 0, &[]));
    let mut child = kubelet(&registry, &["--output=json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut child = KillOnDrop::new(child);
    let (lines, mut events) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let _ = lines.send(line.unwrap());
        }
    });
    let mut next = async || -> Value {
        let line = tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .expect("an event line within 10 s")
            .expect("stdout open");
        serde_json::from_str(&line).expect("one JSON object per line")
    };

    let created = eventually(Duration::from_secs(10), || registry.is_dir().then_some(())).await;
    assert!(created.is_some(), "the registry is created");
    let reg_socket = registry.join("w-reg.sock");
    let info = csi_plugin("w.csi", &driver_socket.display().to_string());
    let (reg, _) = registration(&reg_socket, Bind::Renamed, info);
    let event = next().await;
    assert_eq!(event["event"], "registered");
    assert_eq!(event["driver"], "w.csi");
    assert_eq!(event["csiNode"]["spec"]["drivers"][0]["nodeID"], "n1");

    reg.stop().await;
    let event = next().await;
    assert_eq!(event["event"], "deregistered");
    assert_eq!(event["csiNode"]["spec"]["drivers"], json!([]));

    send_signal(&child.0, nix::sys::signal::Signal::SIGTERM);
    let status = wait_exit(&mut child.0, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
}
