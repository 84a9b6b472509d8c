//! Logging as an operator sees it: quiet by default, klog-like text, or one JSON object a line.

use crate::common;

use std::process::Command;

fn registrar_probe_mode(extra: &[&str]) -> String {
    let out = Command::new(common::binary())
        .args([
            "registrar",
            "--mode=kubelet-registration-probe",
            "--kubelet-registration-path=/x",
        ])
        .args(extra)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn json_format_prints_one_json_object_per_line() {
    let stderr = registrar_probe_mode(&["--logging-format=json"]);
    assert!(!stderr.is_empty());
    for line in stderr.lines() {
        let entry: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(entry["level"], "info", "{line}");
        assert!(
            entry["msg"]
                .as_str()
                .unwrap()
                .contains("kubelet-registration-probe"),
            "{line}"
        );
        assert!(entry["ts"].as_f64().unwrap() > 1.7e9, "{line}");
    }
}

#[test]
fn text_format_lines_look_like_klog() {
    let stderr = registrar_probe_mode(&[]);
    let line = stderr.lines().next().expect("a log line");
    // I1129 20:27:17.123456 registrar] message
    let (header, message) = line.split_once("] ").expect("klog header");
    assert!(
        header.starts_with('I') && header.as_bytes()[1].is_ascii_digit(),
        "{line}"
    );
    assert!(message.contains("kubelet-registration-probe"), "{line}");
}

#[test]
fn a_successful_exec_probe_prints_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let mut server = common::spawn_node_server(&socket, &dir.path().join("state"), &[]);
    assert!(common::wait_until_blocking(
        std::time::Duration::from_secs(10),
        || common::is_socket(&socket)
    ));
    let out = Command::new(common::binary())
        .args([
            "probe",
            "once",
            &format!("--csi-address={}", socket.display()),
        ])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
    common::send_signal(&server.0, nix::sys::signal::Signal::SIGTERM);
    common::wait_exit(&mut server.0, std::time::Duration::from_secs(10));
}
