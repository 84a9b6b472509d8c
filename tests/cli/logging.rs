//! Logging as an operator and the tools that parse Kubernetes logs see it: quiet by default,
//! klog's text header, component-base's JSON, `--v` and `--vmodule`.

use crate::common;

use std::process::{Command, Stdio};

/// Runs a registrar to its exit (the given flags after the ones it needs) and returns its PID
/// and its stderr.
fn registrar(extra: &[&str]) -> (u32, String) {
    let child = Command::new(common::binary())
        .args(["registrar", "--kubelet-registration-path=/x"])
        .args(extra)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    (pid, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn registrar_probe_mode(extra: &[&str]) -> (u32, String) {
    registrar(&[&["--mode=kubelet-registration-probe"], extra].concat())
}

/// A registrar that waits for a driver that never comes: it logs its retries (debug) and
/// then fails (error).
fn registrar_without_driver(extra: &[&str]) -> (u32, String) {
    let dir = tempfile::tempdir().unwrap();
    let csi = format!("--csi-address={}", dir.path().join("none.sock").display());
    let registry = format!("--plugin-registration-path={}", dir.path().display());
    registrar(&[&[&csi, &registry, "--driver-wait-limit=300ms"], extra].concat())
}

/// Checks klog's header byte by byte: `Lmmdd hh:mm:ss.uuuuuu PPPPPPP file:line] ` and returns
/// (severity, file, message).
fn klog_header(line: &str, pid: u32) -> (char, &str, &str) {
    let bytes = line.as_bytes();
    assert!(line.len() > 31, "{line}");
    assert!(b"IWEF".contains(&bytes[0]), "severity: {line}");
    let digits = |range: std::ops::Range<usize>| bytes[range].iter().all(u8::is_ascii_digit);
    assert!(digits(1..5) && bytes[5] == b' ', "mmdd: {line}");
    assert!(
        digits(6..8) && bytes[8] == b':' && digits(9..11) && bytes[11] == b':',
        "{line}"
    );
    assert!(
        digits(12..14) && bytes[14] == b'.' && digits(15..21),
        "time: {line}"
    );
    assert_eq!(
        &line[21..30],
        format!(" {pid:>7} "),
        "pid, right-aligned in 7: {line}"
    );
    let (place, message) = line[30..].split_once("] ").expect("file:line] ");
    let (file, number) = place.rsplit_once(':').expect("file:line");
    assert!(
        file.ends_with(".rs") && number.parse::<u32>().is_ok(),
        "{line}"
    );
    (bytes[0] as char, file, message)
}

#[test]
fn text_lines_carry_klog_header_with_the_pid_and_the_source_file() {
    let (pid, stderr) = registrar_probe_mode(&[]);
    let line = stderr.lines().next().expect("a log line");
    let (severity, file, message) = klog_header(line, pid);
    assert_eq!((severity, file), ('I', "registrar/mod.rs"), "{line}");
    assert!(message.contains("kubelet-registration-probe"), "{line}");
}

#[test]
fn verbose_lines_are_info_lines_and_errors_quote_their_message_with_err() {
    let (pid, stderr) = registrar_without_driver(&["--v=5"]);
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(lines.len() > 2, "{stderr}");
    for line in &lines {
        klog_header(line, pid);
    }
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with('I') && l.contains("retrying")),
        "{stderr}"
    );
    let error = lines.last().unwrap();
    let (severity, file, message) = klog_header(error, pid);
    assert_eq!((severity, file), ('E', "main.rs"), "{error}");
    assert!(
        message.starts_with("\"csi-nodekit registrar failed\" err=\"connect to "),
        "{error}"
    );
}

#[test]
fn add_dir_header_names_the_directory_and_skip_headers_drops_the_header() {
    let (pid, stderr) = registrar_without_driver(&["--add_dir_header"]);
    let (_, file, _) = klog_header(stderr.lines().last().unwrap(), pid);
    assert_eq!(file, "src/main.rs", "{stderr}");
    let (_, stderr) = registrar_without_driver(&["-skip_headers"]);
    assert!(
        stderr.starts_with("\"csi-nodekit registrar failed\" err="),
        "{stderr}"
    );
}

#[test]
fn quiet_by_default_and_vmodule_makes_one_module_verbose() {
    let (_, quiet) = registrar_without_driver(&[]);
    assert_eq!(quiet.lines().count(), 1, "only the failure: {quiet}");
    let (_, socket) = registrar_without_driver(&["--vmodule=socket=2"]);
    assert!(socket.lines().count() > 1, "{socket}");
    assert!(socket.lines().any(|l| l.contains("dial.rs:")), "{socket}");
    let (_, other) = registrar_without_driver(&["--vmodule=supervise=2,http=5"]);
    assert_eq!(
        other.lines().count(),
        1,
        "another module stays quiet: {other}"
    );
    let (_, file) = registrar_without_driver(&["-vmodule", "d?al=2"]);
    assert!(file.lines().any(|l| l.contains("dial.rs:")), "{file}");
}

#[test]
fn json_lines_are_component_base_objects_with_ts_caller_msg_and_v_or_err() {
    let (_, stderr) = registrar_without_driver(&["--logging-format=json", "--v=2"]);
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(lines.len() > 1, "{stderr}");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as f64;
    for line in &lines {
        let entry: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        // Epoch milliseconds, as component-base writes them, not seconds.
        let ts = entry["ts"].as_f64().unwrap();
        assert!((now_ms - ts).abs() < 60_000.0, "{line}");
        assert!(
            entry.get("level").is_none(),
            "component-base writes no level: {line}"
        );
        let caller = entry["caller"].as_str().unwrap();
        let (file, number) = caller.rsplit_once(':').unwrap();
        assert!(file.contains('/') && file.ends_with(".rs"), "{line}");
        assert!(number.parse::<u32>().is_ok(), "{line}");
        // Key order: ts, caller, msg, then v (info) or the key-values and err last (errors).
        let at = |key: &str| line.find(&format!("\"{key}\":"));
        assert!(
            line.starts_with("{\"ts\":") && at("caller") < at("msg"),
            "{line}"
        );
    }
    let info = serde_json::from_str::<serde_json::Value>(lines[0]).unwrap();
    assert!(
        info["v"].as_u64().is_some() && info.get("err").is_none(),
        "{}",
        lines[0]
    );
    let error = lines.last().unwrap();
    let parsed: serde_json::Value = serde_json::from_str(error).unwrap();
    assert_eq!(parsed["msg"], "csi-nodekit registrar failed", "{error}");
    assert!(parsed.get("v").is_none(), "errors carry no v: {error}");
    assert!(
        parsed["err"].as_str().unwrap().starts_with("connect to "),
        "{error}"
    );
    assert!(
        error.ends_with("\"}") && error.contains(",\"err\":"),
        "err last: {error}"
    );
}

#[test]
fn flags_without_effect_are_named_in_one_line_once_the_mode_starts() {
    let (_, stderr) = registrar_without_driver(&[
        "--logtostderr",
        "-log_dir=/var/log",
        "--stderrthreshold=WARNING",
        "--log-flush-frequency",
        "10s",
        "--enable-pprof",
    ]);
    let notices: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("accepted for compatibility and ignored"))
        .collect();
    assert_eq!(notices.len(), 1, "{stderr}");
    for flag in [
        "--logtostderr",
        "--log_dir",
        "--stderrthreshold",
        "--log-flush-frequency",
        "--enable-pprof",
    ] {
        assert!(notices[0].contains(flag), "{flag}: {}", notices[0]);
    }
    assert!(
        !notices[0].contains("/var/log"),
        "values are not logged: {}",
        notices[0]
    );
    // An exec probe that exits at once says nothing about them.
    let (_, probe) = registrar_probe_mode(&["--logtostderr"]);
    assert!(!probe.contains("ignored"), "{probe}");
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

#[tokio::test(flavor = "current_thread")]
async fn secrets_never_reach_the_logs_even_at_the_highest_verbosity() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let state = dir.path().join("state");
    let server = common::spawn_node_server(&socket, &state, &["--v=10"]);
    assert!(
        common::wait_until(std::time::Duration::from_secs(10), || common::is_socket(
            &socket
        ))
        .await
    );
    let mut csi = common::csi_node::connect(&socket).await;
    const MARKER: &str = "s3cr3t-that-must-not-be-logged";
    let secrets = std::collections::HashMap::from([("password".to_owned(), MARKER.to_owned())]);
    let mut create = common::csi_node::create_request("secret-volume", 1 << 20);
    create.secrets = secrets.clone();
    let created = csi
        .controller
        .create_volume(create)
        .await
        .unwrap()
        .into_inner();
    let id = created.volume.unwrap().volume_id;
    // An oversize secret is refused; the refusal names the field, not the value.
    let mut oversize = common::csi_node::create_request("secret-volume-2", 1 << 20);
    oversize.secrets =
        std::collections::HashMap::from([("password".to_owned(), MARKER.repeat(400))]);
    let refused = csi.controller.create_volume(oversize).await.unwrap_err();
    assert!(!refused.message().contains(MARKER), "{}", refused.message());
    let mut delete = common::csi_node::delete_request(&id);
    delete.secrets = secrets;
    csi.controller.delete_volume(delete).await.unwrap();
    drop(csi);
    common::send_signal(&server.0, nix::sys::signal::Signal::SIGTERM);
    let mut server = server;
    // Waiting without blocking lets this runtime close the client's connection.
    let limit = std::time::Duration::from_secs(10);
    let exited = common::wait_until(limit, || server.0.try_wait().unwrap().is_some()).await;
    assert!(exited, "node-server did not exit on SIGTERM");
    let logs = server.stderr();
    assert!(
        logs.contains("CreateVolume"),
        "--v=10 logs the calls: {logs}"
    );
    assert!(!logs.contains(MARKER), "a secret was logged:\n{logs}");
}
