//! `--help` as an operator of the upstream sidecars expects it: every flag with its default in
//! Go's layout and order, a usage line that works as written, `help <mode>`, and a top-level
//! help that names each mode.

use super::flags::{LIVENESSPROBE, LOGGING, REGISTRAR, run_as, text};
use crate::common;
use crate::common::fake_driver::FakeDriver;

use std::process::Command;

use csi_nodekit::cli::{ParseStop, parse_mode_args};

/// Each flag's entry in a Go-style help: its name as spelled on the command line.
fn help_names(help: &str) -> Vec<String> {
    help.lines()
        .filter_map(|l| l.strip_prefix("  -"))
        .map(|l| l.split([' ', '\t']).next().unwrap().to_owned())
        .collect()
}

#[test]
fn each_mode_help_lists_every_upstream_flag_in_go_order_with_its_default() {
    let registrar = run_as("csi-node-driver-registrar", &["--help"]);
    assert!(registrar.status.success());
    let help = text(&registrar.stdout);
    let names = help_names(&help);
    for (name, _) in REGISTRAR.iter().chain(LOGGING) {
        assert!(names.iter().any(|n| n == name), "-{name} missing:\n{help}");
    }
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "Go sorts flags by name");
    assert!(help.contains("  -csi-address string\n    \t"), "{help}");
    assert!(help.contains("(default \"/run/csi/socket\")\n"), "{help}");
    assert!(help.contains("  -timeout duration\n    \t"), "{help}");
    assert!(help.contains("(default 1s)\n"), "{help}");
    let probe = run_as("livenessprobe", &["-h"]);
    let help = text(&probe.stdout);
    let names = help_names(&help);
    for (name, _) in LIVENESSPROBE.iter().chain(LOGGING) {
        assert!(names.iter().any(|n| n == name), "-{name} missing:\n{help}");
    }
    assert!(help.contains("(default \"9808\")\n") && help.contains("(default 3s)\n"));
}

#[tokio::test(flavor = "current_thread")]
async fn livenessprobe_help_shows_a_usage_line_that_works_as_written() {
    let out = run_as("livenessprobe", &["--help"]);
    let help = text(&out.stdout);
    let usage = help.lines().next().unwrap();
    let command = usage
        .strip_prefix("Usage: ")
        .and_then(|u| u.strip_suffix(" [flags]"))
        .unwrap_or_else(|| panic!("{usage}"));
    assert_eq!(command, "livenessprobe", "{usage}");
    // The command as written, with flags: it serves.
    let dir = tempfile::tempdir().unwrap();
    let csi = dir.path().join("csi.sock");
    let driver = FakeDriver::start(&csi, "usage.example.io");
    *driver.behaviour.ready.lock().unwrap() = Some(true);
    let (_probe, address) = common::start_livenessprobe(dir.path(), &csi, &[]).await;
    assert_eq!(common::http_get(&address, "/healthz").await.0, 200);
}

#[test]
fn help_mode_shows_that_mode_help_and_the_top_help_names_each_mode() {
    let binary = common::binary();
    for (mode, words) in [
        ("registrar", vec!["registrar", "--help"]),
        ("node-server", vec!["node-server", "-help"]),
        ("probe", vec!["probe", "--help"]),
        ("livenessprobe", vec!["livenessprobe", "--help"]),
        ("probe", vec!["probe", "once", "--help"]),
    ] {
        let sub: Vec<&str> = words[1..words.len() - 1].to_vec();
        let help = Command::new(&binary)
            .args([&["help", mode][..], &sub].concat())
            .output()
            .unwrap();
        let direct = Command::new(&binary).args(&words).output().unwrap();
        assert!(help.status.success() && direct.status.success(), "{mode}");
        assert_eq!(
            text(&help.stdout),
            text(&direct.stdout),
            "help {mode} {sub:?}"
        );
        assert!(
            text(&help.stdout).starts_with("Usage: csi-nodekit "),
            "{mode}"
        );
    }
    let top = Command::new(&binary).arg("--help").output().unwrap();
    let top = text(&top.stdout);
    for mode in ["node-server", "registrar", "probe", "demo"] {
        let line = top
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{mode} ")))
            .unwrap_or_else(|| panic!("{mode} missing:\n{top}"));
        assert!(
            line.split_whitespace().count() > 3,
            "a line of what {mode} is for: {line}"
        );
    }
    let probe = Command::new(&binary)
        .args(["help", "probe"])
        .output()
        .unwrap();
    let probe = text(&probe.stdout);
    for sub in ["serve", "once", "registration", "kubelet", "doctor"] {
        assert!(probe.contains(&format!("\n  {sub} ")), "{sub}:\n{probe}");
    }
}

#[test]
fn a_help_request_is_not_confused_with_a_flag_error() {
    let stop = parse_mode_args::<csi_nodekit::registrar::Args>("registrar", &["-h".to_owned()])
        .unwrap_err();
    assert!(matches!(stop, ParseStop::Help(ref t) if t.starts_with("Usage: registrar")));
}
