//! Flags as an operator of the upstream sidecars expects them: every flag upstream
//! node-driver-registrar and livenessprobe (v2.0 and later) register, in every spelling Go's
//! flag package accepts; bad values refused with exit 2 before anything starts. `--help` is
//! in `flags_help`.

use crate::common;
use crate::common::fake_driver::FakeDriver;

use std::process::{Command, Output};
use std::time::Duration;

use csi_nodekit::cli::parse_mode_args;

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The logging flags of both logging eras of the sidecars, with a value each takes
/// (`None`: a boolean).
pub const LOGGING: &[(&str, Option<&str>)] = &[
    ("v", Some("5")),
    ("vmodule", Some("supervise=4,serve*=2")),
    ("logging-format", Some("text")),
    ("logtostderr", None),
    ("alsologtostderr", None),
    ("log_dir", Some("/var/log/x")),
    ("log_file", Some("/var/log/x/y.log")),
    ("log_file_max_size", Some("1800")),
    ("skip_headers", None),
    ("skip_log_headers", None),
    ("add_dir_header", None),
    ("stderrthreshold", Some("ERROR")),
    ("one_output", None),
    ("log_backtrace_at", Some("main.go:100")),
    ("log-flush-frequency", Some("5s")),
    ("log-json-split-stream", None),
    ("log-json-info-buffer-size", Some("1Ki")),
    ("log-text-split-stream", None),
    ("log-text-info-buffer-size", Some("512")),
];

/// node-driver-registrar's own flags (v2.0–v2.17), with values that go together.
pub const REGISTRAR: &[(&str, Option<&str>)] = &[
    ("csi-address", Some("/csi/csi.sock")),
    (
        "kubelet-registration-path",
        Some("/var/lib/kubelet/plugins/x/csi.sock"),
    ),
    ("plugin-registration-path", Some("/registration")),
    ("connection-timeout", Some("15s")),
    ("timeout", Some("2s")),
    ("health-port", Some("9809")),
    ("mode", Some("registration")),
    ("enable-pprof", None),
    ("automaxprocs", None),
];

/// livenessprobe's own flags (v2.0–v2.20, and v1's --connection-timeout).
pub const LIVENESSPROBE: &[(&str, Option<&str>)] = &[
    ("csi-address", Some("/csi/csi.sock")),
    ("probe-timeout", Some("3s")),
    ("health-port", Some("9808")),
    ("http-endpoint", Some(":9808")),
    ("metrics-path", Some("/metrics")),
    ("automaxprocs", None),
    ("connection-timeout", Some("3s")),
];

/// The ways Go's flag package accepts one flag: one or two dashes, `=value` or a separate
/// word; a boolean bare or with `=true`/`=false` (never a separate word).
fn spellings(name: &str, value: Option<&str>) -> Vec<Vec<String>> {
    let mut forms = Vec::new();
    for dashes in ["-", "--"] {
        match value {
            Some(value) => {
                forms.push(vec![format!("{dashes}{name}={value}")]);
                forms.push(vec![format!("{dashes}{name}"), value.to_owned()]);
            }
            None => {
                for suffix in ["", "=true", "=false", "=1", "=F"] {
                    forms.push(vec![format!("{dashes}{name}{suffix}")]);
                }
            }
        }
    }
    forms
}

fn must_parse<T: argh::FromArgs + argh::ArgsInfo>(program: &str, words: &[String]) -> T {
    parse_mode_args::<T>(program, words).unwrap_or_else(|stop| panic!("{words:?}: {stop:?}"))
}

#[test]
fn every_upstream_flag_is_accepted_in_every_go_spelling() {
    for (name, value) in REGISTRAR.iter().chain(LOGGING) {
        for words in spellings(name, *value) {
            let words = [vec!["--kubelet-registration-path=/k".to_owned()], words].concat();
            let args: csi_nodekit::registrar::Args = must_parse("registrar", &words);
            csi_nodekit::registrar::Settings::from_args(args)
                .unwrap_or_else(|e| panic!("registrar {words:?}: {e}"));
        }
    }
    for (name, value) in LIVENESSPROBE.iter().chain(LOGGING) {
        for words in spellings(name, *value) {
            let words = [vec!["serve".to_owned()], words].concat();
            let args: csi_nodekit::probe::Args = must_parse("livenessprobe", &words);
            let Some(csi_nodekit::probe::Command::Serve(serve)) = args.command else {
                panic!("{words:?}: not serve");
            };
            csi_nodekit::probe::serve::Settings::from_args(serve)
                .unwrap_or_else(|e| panic!("livenessprobe {words:?}: {e}"));
        }
    }
}

#[test]
fn logging_flags_with_a_meaning_get_it_and_the_others_are_reported_as_ignored() {
    use csi_nodekit::cli::ModeArgs;
    let words: Vec<String> = LOGGING
        .iter()
        .map(|(name, value)| match value {
            Some(value) => format!("--{name}={value}"),
            None => format!("--{name}"),
        })
        .chain(["--enable-pprof".to_owned()])
        .collect();
    let args: csi_nodekit::registrar::Args = must_parse("registrar", &words);
    let logging = args.logging();
    assert_eq!(logging.verbosity, 5);
    assert_eq!(
        logging.vmodule.0,
        [("supervise".into(), 4), ("serve*".into(), 2)]
    );
    assert!(logging.skip_headers && logging.add_dir_header);
    let ignored = args.ignored();
    let meaningful = [
        "v",
        "vmodule",
        "logging-format",
        "skip_headers",
        "add_dir_header",
    ];
    for (name, _) in LOGGING.iter().filter(|(n, _)| !meaningful.contains(n)) {
        assert!(
            ignored.contains(&format!("--{name}").as_str()),
            "{name}: {ignored:?}"
        );
    }
    assert!(ignored.contains(&"--enable-pprof"), "{ignored:?}");
    assert_eq!(
        ignored.len(),
        LOGGING.len() - meaningful.len() + 1,
        "{ignored:?}"
    );
}

#[test]
fn the_registrar_binary_takes_every_upstream_flag_at_once() {
    // The exec-probe mode exits 0 once the flags are checked, so every flag goes through the
    // real binary without a driver.
    let words: Vec<String> = REGISTRAR
        .iter()
        .filter(|(name, _)| *name != "mode")
        .chain(LOGGING)
        .map(|(name, value)| match value {
            Some(value) => format!("-{name}={value}"),
            None => format!("--{name}"),
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(common::symlink_as(dir.path(), "csi-node-driver-registrar"))
        .args(&words)
        .arg("--mode=kubelet-registration-probe")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn the_livenessprobe_binary_takes_every_upstream_flag_at_once_and_serves() {
    let dir = tempfile::tempdir().unwrap();
    let csi = dir.path().join("csi.sock");
    let driver = FakeDriver::start(&csi, "every.flag.example.io");
    *driver.behaviour.ready.lock().unwrap() = Some(true);
    let words: Vec<String> = LIVENESSPROBE
        .iter()
        .filter(|(name, _)| !["csi-address", "http-endpoint"].contains(name))
        .chain(LOGGING)
        .flat_map(|(name, value)| match value {
            Some(value) => vec![format!("--{name}"), (*value).to_owned()],
            None => vec![format!("-{name}=true")],
        })
        .collect();
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let (_probe, address) = common::start_livenessprobe(dir.path(), &csi, &words).await;
    assert_eq!(common::http_get(&address, "/healthz").await.0, 200);
}

/// Runs the binary as `name` with `args`, expecting it to stop at once.
pub fn run_as(name: &str, args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(common::symlink_as(dir.path(), name))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_exit(&mut child, Duration::from_secs(10));
    child.wait_with_output().unwrap()
}

/// Bad values of the upstream sidecars' and node-server's flags: (name invoked as, arguments,
/// the flag the one-line error must name).
pub type BadFlag = (&'static str, &'static [&'static str], &'static str);

pub fn bad_flag_values() -> Vec<BadFlag> {
    const REG: &str = "--kubelet-registration-path=/var/lib/kubelet/plugins/x/csi.sock";
    vec![
        (
            "csi-node-driver-registrar",
            &[REG, "--http-endpoint=:99999"],
            "--http-endpoint",
        ),
        (
            "csi-node-driver-registrar",
            &[REG, "--http-endpoint=banana"],
            "--http-endpoint",
        ),
        (
            "csi-node-driver-registrar",
            &[REG, "--http-endpoint=:0"],
            "--http-endpoint",
        ),
        (
            "csi-node-driver-registrar",
            &[REG, "--health-port=-1"],
            "--health-port",
        ),
        (
            "csi-node-driver-registrar",
            &[REG, "--csi-address="],
            "--csi-address",
        ),
        (
            "csi-node-driver-registrar",
            &[REG, "--plugin-registration-path="],
            "--plugin-registration-path",
        ),
        (
            "csi-node-driver-registrar",
            &[REG, "--timeout=0s"],
            "--timeout",
        ),
        (
            "csi-node-driver-registrar",
            &[REG, "--mode=probe"],
            "--mode",
        ),
        (
            "csi-node-driver-registrar",
            &[REG, "--stderrthreshold=LOUD"],
            "--stderrthreshold",
        ),
        (
            "csi-node-driver-registrar",
            &[REG, "--log_backtrace_at=nowhere"],
            "--log_backtrace_at",
        ),
        (
            "csi-node-driver-registrar",
            &[REG, "--vmodule=supervise"],
            "--vmodule",
        ),
        (
            "csi-node-driver-registrar",
            &[REG, "--log-json-info-buffer-size=lots"],
            "--log-json-info-buffer-size",
        ),
        (
            "csi-node-driver-registrar",
            &[REG, "--logtostderr=maybe"],
            "--logtostderr",
        ),
        ("csi-node-driver-registrar", &[REG, "--v=-1"], "--v"),
        (
            "livenessprobe",
            &["--http-endpoint=:99999"],
            "--http-endpoint",
        ),
        (
            "livenessprobe",
            &["--http-endpoint=banana"],
            "--http-endpoint",
        ),
        ("livenessprobe", &["--health-port=-1"], "--health-port"),
        ("livenessprobe", &["--health-port=banana"], "--health-port"),
        ("livenessprobe", &["--csi-address="], "--csi-address"),
        ("livenessprobe", &["--probe-timeout=0s"], "--probe-timeout"),
        (
            "livenessprobe",
            &["--metrics-address=x"],
            "--metrics-address",
        ),
        (
            "livenessprobe",
            &["--log-flush-frequency=often"],
            "--log-flush-frequency",
        ),
        ("csi-node-server", &["--endpoint="], "--endpoint"),
        ("csi-node-server", &["--state-dir="], "--state-dir"),
    ]
}

/// Flags that upstream takes and then cannot work with: a relative, over-long or `/`-ended
/// socket path handed to the kubelet, a relative registry or state directory, no capacity at
/// all, special bits on a socket, the group ID chown takes as "unchanged", node-server's
/// socket where its start-up takes files for leftovers, an IPv4 address that is none, a
/// metrics page hidden by the health check.
pub fn unusable_flag_values() -> Vec<BadFlag> {
    const REG: &str = "--kubelet-registration-path=/var/lib/kubelet/plugins/x/csi.sock";
    /// 109 bytes: longer than a socket address holds.
    const LONG: &str = "--kubelet-registration-path=/var/lib/kubelet/plugins/hostpath.csi.example.com/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx/csi.sock";
    vec![
        (
            "csi-node-driver-registrar",
            &["--kubelet-registration-path=plugins/x/csi.sock"],
            "--kubelet-registration-path",
        ),
        (
            "csi-node-driver-registrar",
            &[LONG],
            "--kubelet-registration-path",
        ),
        (
            "csi-node-driver-registrar",
            &[REG, "--plugin-registration-path=registration"],
            "--plugin-registration-path",
        ),
        (
            "csi-node-driver-registrar",
            &[REG, "--socket-mode=07777"],
            "--socket-mode",
        ),
        (
            "csi-node-driver-registrar",
            &[REG, "--http-endpoint=999.1.1.1:80"],
            "--http-endpoint",
        ),
        (
            "csi-node-driver-registrar",
            &["--kubelet-registration-path=/var/lib/kubelet/plugins/x/"],
            "--kubelet-registration-path",
        ),
        (
            "csi-node-driver-registrar",
            &[REG, "--socket-group=4294967295"],
            "--socket-group",
        ),
        ("csi-node-server", &["--capacity=0"], "--capacity"),
        ("csi-node-server", &["--capacity=1"], "--capacity"),
        ("csi-node-server", &["--capacity=1023Ki"], "--capacity"),
        ("csi-node-server", &["--state-dir=/"], "--state-dir"),
        ("csi-node-server", &["--state-dir=/tmp"], "--state-dir"),
        ("csi-node-server", &["--state-dir=state"], "--state-dir"),
        (
            "csi-node-server",
            &["--socket-group=4294967295"],
            "--socket-group",
        ),
        (
            "csi-node-server",
            &[
                "--state-dir=/var/lib/x",
                "--endpoint=unix:///var/lib/x/volumes/csi.sock",
            ],
            "--endpoint",
        ),
        (
            "csi-nodekit",
            &["probe", "kubelet", "--plugins-registry=plugins_registry"],
            "--plugins-registry",
        ),
        ("csi-node-server", &["--socket-mode=07777"], "--socket-mode"),
        ("csi-node-server", &["--socket-mode=4660"], "--socket-mode"),
        (
            "livenessprobe",
            &["--http-endpoint=999.1.1.1:80"],
            "--http-endpoint",
        ),
        (
            "livenessprobe",
            &["--metrics-address=999.1.1.1:8080"],
            "--metrics-address",
        ),
        (
            "livenessprobe",
            &["--metrics-path=/healthz"],
            "--metrics-path",
        ),
    ]
}

/// Whether `out` is a refusal as upstream gives it: exit 2, one line naming `flag` on stderr,
/// nothing on stdout.
pub fn refused_naming(out: &Output, flag: &str) -> bool {
    let err = text(&out.stderr);
    out.status.code() == Some(2)
        && err.lines().count() == 1
        && err.contains(flag)
        && out.stdout.is_empty()
}

#[test]
fn every_bad_flag_value_exits_2_with_one_line_naming_the_flag_before_anything_starts() {
    for (name, args, flag) in bad_flag_values().into_iter().chain(unusable_flag_values()) {
        let out = run_as(name, args);
        let err = text(&out.stderr);
        assert!(
            refused_naming(&out, flag),
            "{name} {args:?} should exit 2 naming {flag}: {:?} {err}",
            out.status
        );
    }
}

#[test]
fn an_unknown_flag_gets_gos_words_and_the_usage_at_every_level_and_exit_2() {
    // As Go's flag package: `flag provided but not defined: -bogus` (one dash however it was
    // spelled), then the usage, all on stderr, nothing on stdout.
    let top = run_as("csi-nodekit", &["--bogus"]);
    assert_eq!(top.status.code(), Some(2));
    let err = text(&top.stderr);
    let mut lines = err.lines();
    assert_eq!(
        lines.next(),
        Some("flag provided but not defined: -bogus"),
        "{err}"
    );
    assert!(
        lines
            .next()
            .is_some_and(|l| l.starts_with("usage: csi-nodekit <mode>")),
        "{err}"
    );
    assert!(top.stdout.is_empty());
    for (name, usage, flag) in [
        (
            "csi-node-driver-registrar",
            "Usage of csi-node-driver-registrar:",
            "  -kubelet-registration-path string",
        ),
        (
            "livenessprobe",
            "Usage of livenessprobe:",
            "  -probe-timeout duration",
        ),
        (
            "csi-node-server",
            "Usage of csi-node-server:",
            "  -endpoint string",
        ),
    ] {
        let out = run_as(name, &["-bogus=1"]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(out.stdout.is_empty(), "{name}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(
            lines[..2],
            ["flag provided but not defined: -bogus", usage],
            "{name}: {err}"
        );
        assert!(lines.contains(&flag), "{name}: {err}");
    }
    let sub = run_as("csi-nodekit", &["probe", "once", "--bogus"]);
    let err = text(&sub.stderr);
    assert_eq!(sub.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with(
            "flag provided but not defined: -bogus\nUsage of csi-nodekit probe once:\n"
        ),
        "{err}"
    );
}
