//! Mode dispatch and flag errors, through the real binary and symlinks to it.

use crate::common;

use std::process::{Command, Output};

fn run(program: &std::path::Path, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .expect("run binary")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn every_symlink_name_answers_version_with_its_own_name() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "csi-node-server",
        "csi-node-driver-registrar",
        "node-driver-registrar",
        "livenessprobe",
    ] {
        let link = common::symlink_as(dir.path(), name);
        let out = run(&link, &["--version"]);
        assert!(out.status.success(), "{name}: {out:?}");
        assert_eq!(
            text(&out.stdout),
            format!("{name} {}\n", env!("CARGO_PKG_VERSION"))
        );
    }
}

#[test]
fn every_subcommand_answers_version() {
    for mode in [
        "node-server",
        "csi-node-server",
        "registrar",
        "csi-node-driver-registrar",
        "probe",
        "livenessprobe",
        "demo",
    ] {
        let out = run(&common::binary(), &[mode, "-version"]);
        assert!(out.status.success(), "{mode}: {out:?}");
        assert_eq!(
            text(&out.stdout),
            format!("csi-nodekit {mode} {}\n", env!("CARGO_PKG_VERSION"))
        );
    }
}

#[test]
fn every_probe_subcommand_answers_version() {
    for sub in ["serve", "once", "registration", "kubelet", "doctor"] {
        let out = run(&common::binary(), &["probe", sub, "--version"]);
        assert!(out.status.success(), "{sub}: {out:?}");
        assert_eq!(
            text(&out.stdout),
            format!("csi-nodekit probe {}\n", env!("CARGO_PKG_VERSION"))
        );
    }
}

#[test]
fn the_binary_itself_answers_version() {
    let out = run(&common::binary(), &["--version"]);
    assert!(out.status.success());
    assert_eq!(
        text(&out.stdout),
        format!("csi-nodekit {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn no_mode_prints_a_usage_line_listing_the_modes_and_exits_2() {
    let out = run(&common::binary(), &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    for mode in ["node-server", "registrar", "probe"] {
        assert!(err.contains(mode), "{err}");
    }
}

#[test]
fn an_unknown_mode_is_named_and_exits_2() {
    let out = run(&common::binary(), &["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("unknown mode \"frobnicate\""));
}

#[test]
fn an_unknown_flag_prints_gos_line_naming_it_then_the_usage_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let link = common::symlink_as(dir.path(), "csi-node-server");
    let out = run(&link, &["--no-such-flag=1"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    let mut lines = err.lines();
    assert_eq!(
        lines.next(),
        Some("flag provided but not defined: -no-such-flag"),
        "{err}"
    );
    assert_eq!(lines.next(), Some("Usage of csi-node-server:"), "{err}");
}

#[test]
fn a_bad_flag_value_prints_one_line_naming_the_flag_and_exits_2() {
    let out = run(&common::binary(), &["node-server", "--logging-format=xml"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--logging-format") && err.contains("xml"),
        "{err}"
    );
}

#[test]
fn help_goes_to_stdout_and_succeeds() {
    let out = run(&common::binary(), &["node-server", "-h"]);
    assert!(out.status.success());
    assert!(text(&out.stdout).contains("\n  -endpoint string\n"));
}

#[test]
fn a_bad_socket_mode_is_a_bad_flag_in_every_mode_that_binds() {
    let modes: [&[&str]; 2] = [
        &["node-server"],
        &["registrar", "--kubelet-registration-path=/x"],
    ];
    for words in modes {
        let mode = words[0];
        let out = run(&common::binary(), &[words, &["--socket-mode=rwx"]].concat());
        assert_eq!(out.status.code(), Some(2), "{mode}: {out:?}");
        let err = text(&out.stderr);
        assert!(
            err.contains("--socket-mode") && err.contains("rwx"),
            "{mode}: {err}"
        );
    }
}
