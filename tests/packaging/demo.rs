//! The README's "Try it" command: the demo runs the whole flow and leaves nothing behind.

use crate::common;

use std::process::Command;

#[ignore = "needs root: the demo makes a private mount namespace and real mounts"]
#[test]
fn the_demo_registers_publishes_a_volume_and_leaves_nothing_behind() {
    let out = Command::new(common::binary())
        .arg("demo")
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "\"kind\": \"CSINode\"",
        "\"nodeID\": \"demo-node\"",
        "csi.volume.kubernetes.io/nodeid",
        "the registrar's /readyz now says: 200 ok",
        "reads back \"written by the demo pod\"",
        // Whether sizes are enforced here or not, the demo says which.
        "=> the volume's 67108864 bytes are accounted",
        "unmounted and removed: true",
        "staging path unmounted: true",
        "the kubelet: deregistered",
        "nothing left behind",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
    let root = stdout
        .lines()
        .next()
        .and_then(|l| l.split(' ').nth(3))
        .expect("the demo names its directory");
    let prefix = std::env::temp_dir().join("csi-nodekit-demo.");
    assert!(root.starts_with(&*prefix.to_string_lossy()), "{root}");
    // The demo's mounts live in its own mount namespace and vanish with it; the demo itself
    // refuses to remove its directory while anything is mounted there, so a removed directory
    // means nothing was left mounted.
    assert!(!std::path::Path::new(root).exists(), "{root} left behind");
}

#[ignore = "needs root: the demo makes a private mount namespace and real mounts"]
#[test]
fn the_demos_processes_log_in_the_format_the_demo_was_given() {
    let out = Command::new(common::binary())
        .args(["demo", "--v=2", "--logging-format=json"])
        .output()
        .expect("run the demo");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed:\n{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    // node-server, the registrar and the kubelet each log at --v=2.
    for who in [
        "serving CSI driver",
        "registering through",
        "registered demo",
    ] {
        assert!(
            lines.iter().any(|l| l.contains(who)),
            "no log line of {who:?}:\n{stderr}"
        );
    }
    let text: Vec<&&str> = lines
        .iter()
        .filter(|l| serde_json::from_str::<serde_json::Value>(l).is_err())
        .collect();
    assert!(
        text.is_empty(),
        "{} of {} log lines are not JSON, e.g. {:?}",
        text.len(),
        lines.len(),
        text.first()
    );
}
