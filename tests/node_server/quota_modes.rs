//! `--quota` on this machine, whose kernel cannot enforce project quotas on the state
//! directory: the real binary with `auto` starts, warns once with what to do, makes no new
//! directory volume (its size would not hold; image volumes are made) and says why in the
//! stats of one made before;
//! `on` refuses to start with one line and exit 1; `off` says quotas are off and never looks.
//! (Where quotas do hold, the quota VM test drives the same binary.)

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::csi_node::*;
use csi_nodekit::proto::csi::CreateVolumeRequest;

/// The binary with `--quota=<mode>` on a state directory in `sandbox`, until it is up.
async fn start(sandbox: &MountSandbox, mode: &str) -> (common::KillOnDrop, Csi) {
    start_on(sandbox, mode, mode).await
}

/// [`start`] on the state directory named `state`.
async fn start_on(sandbox: &MountSandbox, mode: &str, state: &str) -> (common::KillOnDrop, Csi) {
    let socket = sandbox.path().join(format!("{mode}.sock"));
    let state = sandbox.path().join(state);
    let flag = format!("--quota={mode}");
    let child = common::spawn_node_server(&socket, &state, &["--node-id=n", &flag]);
    assert!(
        common::wait_until(Duration::from_secs(10), || common::is_socket(&socket)).await,
        "node-server --quota={mode} did not start:\n{}",
        child.stderr()
    );
    (child, connect(&socket).await)
}

/// The stats condition of two new staged volumes.
async fn conditions(csi: &mut Csi, sandbox: &MountSandbox) -> Vec<String> {
    let mut messages = Vec::new();
    for name in ["pvc-a", "pvc-b"] {
        let id = create(csi, name, 1 << 20).await;
        messages.push(condition(csi, sandbox, &id).await);
    }
    messages
}

/// The stats condition of volume `id`, staged for the call (it must be normal).
async fn condition(csi: &mut Csi, sandbox: &MountSandbox, id: &str) -> String {
    let staging = sandbox.path().join(format!("staging-{id}"));
    csi.node
        .node_stage_volume(stage_request(id, &staging))
        .await
        .unwrap();
    let stats = csi
        .node
        .node_get_volume_stats(stats_request(id, &staging.display().to_string()))
        .await
        .unwrap()
        .into_inner();
    let condition = stats.volume_condition.unwrap();
    assert!(!condition.abnormal, "{condition:?}");
    csi.node
        .node_unstage_volume(unstage_request(id, &staging))
        .await
        .unwrap();
    condition.message
}

#[ignore = "needs root: real bind mounts, loop devices and ext4 in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_auto_where_quotas_cannot_hold_warns_once_refuses_new_directory_volumes_and_says_why_in_every_stats()
 {
    let sandbox = MountSandbox::new();
    // A directory volume made where unenforced sizes were meant (`off`), then served by `auto`.
    let (mut child, mut csi) = start_on(&sandbox, "off", "auto").await;
    let old = create(&mut csi, "pvc-old", 1 << 20).await;
    common::send_signal(&child.0, nix::sys::signal::Signal::SIGTERM);
    common::wait_exit(&mut child.0, Duration::from_secs(10));
    let (child, mut csi) = start_on(&sandbox, "auto", "auto").await;
    let logs = child.stderr();
    let said: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("accounted, not enforced"))
        .collect();
    assert_eq!(said.len(), 1, "said once at start-up:\n{logs}");
    // Never silent: a warning, with what to do about it.
    assert!(said[0].starts_with('W'), "not a warning: {}", said[0]);
    let advice = ["layout: image", "prjquota", "--quota=off"];
    for word in advice {
        assert!(said[0].contains(word), "{word}: {}", said[0]);
    }
    let line = said[0].split("] ").nth(1).expect("a klog line");
    let reason = line.split(": a directory volume").next().unwrap();
    assert!(
        reason.contains(&*sandbox.path().to_string_lossy()),
        "{reason}"
    );

    // No new directory volume: its size would not hold.
    let refused = csi
        .controller
        .create_volume(create_request("pvc-new", 1 << 20))
        .await;
    let refused = refused.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    for word in advice.iter().chain([&reason]) {
        assert!(
            refused.message().contains(word),
            "{word}: {}",
            refused.message()
        );
    }
    // An image volume holds its size by construction.
    let image = CreateVolumeRequest {
        parameters: [("layout".into(), "image".into())].into(),
        ..create_request("pvc-image", 16 << 20)
    };
    csi.controller
        .create_volume(image)
        .await
        .expect("an image volume");

    // The volume made before says why its size does not hold, in its stats.
    let message = condition(&mut csi, &sandbox, &old).await;
    assert!(message.starts_with("volume is mounted; "), "{message}");
    assert!(message.contains(reason), "{message} lacks {reason}");
    assert!(message.contains("shared filesystem"), "{message}");
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_off_says_quotas_are_off_and_never_looks_at_the_filesystem() {
    let sandbox = MountSandbox::new();
    let (child, mut csi) = start(&sandbox, "off").await;
    for message in conditions(&mut csi, &sandbox).await {
        assert!(
            message.contains("quotas are off (--quota=off)"),
            "{message}"
        );
    }
    let logs = child.stderr();
    // Had it looked, it would name the filesystem, as auto does.
    assert!(logs.contains("quotas are off (--quota=off)"), "{logs}");
    assert!(!logs.contains("project quota"), "{logs}");
    assert!(
        !logs.lines().any(|l| l.starts_with('W')),
        "meant, so no warning: {logs}"
    );
}

#[test]
fn quota_on_where_quotas_cannot_hold_refuses_to_start_with_one_line_and_exit_1() {
    let sandbox = MountSandbox::new();
    let state = sandbox.path().join("state");
    let socket = sandbox.path().join("on.sock");
    let out = common::node_server_output(&socket, &state, &["--node-id=n", "--quota=on"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("--quota=on: "), "{stderr}");
    assert!(
        stderr.contains(&*state.join("volumes").to_string_lossy()),
        "{stderr}"
    );
    assert!(!Path::new(&socket).exists(), "it never listened");
    let bad = Command::new(common::binary())
        .args(["node-server", "--quota=yes"])
        .output()
        .expect("run node-server");
    assert_eq!(bad.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("--quota") && stderr.contains("yes"),
        "{stderr}"
    );
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test]
async fn http_endpoint_serves_the_quota_check_counters_on_metrics() {
    let sandbox = MountSandbox::new();
    let socket = sandbox.path().join("metrics.sock");
    let state = sandbox.path().join("metrics");
    let address = common::free_local_address();
    let endpoint = format!("--http-endpoint={address}");
    let child = common::spawn_node_server(&socket, &state, &["--node-id=n", &endpoint]);
    assert!(
        common::wait_until(Duration::from_secs(10), || common::is_socket(&socket)).await,
        "node-server did not start:\n{}",
        child.stderr()
    );
    let (status, body) = common::http_get(&address, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    for line in [
        "csi_nodekit_quota_escape_episodes_total 0",
        "csi_nodekit_quota_escaped_bytes_total 0",
        "process_start_time_seconds",
    ] {
        assert!(body.contains(line), "{line} in\n{body}");
    }
    assert_eq!(common::http_get(&address, "/healthz").await.0, 404);
}
