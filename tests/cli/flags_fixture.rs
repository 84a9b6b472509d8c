//! The argument lists of real DaemonSets and Helm charts (tests/fixtures/upstream-sidecar-args.json,
//! 58 of them, each with its source) start the binary under the upstream name, as the image
//! does, and it works: the registrar answers the kubelet's GetInfo for a real driver socket,
//! the exec probe exits 0, livenessprobe answers /healthz 200.
//!
//! The arguments are used as written, with what the kubelet (and, for two OpenShift entries,
//! the operator) does to them first: `$(VAR)` expanded from the container's env. Then the
//! least that lets 58 of them run side by side on a shared test machine: container paths of
//! the driver socket (and the registrar's `/registration`, a volume mount upstream too) are
//! re-rooted in a temporary directory, and fixed ports become free ones; a list that relies
//! on a default path or port gets that default written out, re-rooted or re-ported.

use crate::common;
use crate::common::fake_driver::FakeDriver;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use csi_nodekit::proto::registration::{InfoRequest, registration_client::RegistrationClient};
use serde_json::Value;

const FIXTURE: &str = include_str!("../fixtures/upstream-sidecar-args.json");
const WAIT: Duration = Duration::from_secs(10);
const DRIVER: &str = "fixture.csi.example.io";

/// Kubelet's `$(VAR)` expansion: a defined variable is replaced, `$$` is a `$`, anything
/// else stays as written.
fn kubelet_expand(text: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        if let Some(after) = rest.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some((name, after)) = rest
            .strip_prefix("$(")
            .and_then(|r| r.split_once(')'))
            .filter(|(name, _)| env.contains_key(*name))
        {
            out.push_str(&env[name]);
            rest = after;
        } else {
            out.push('$');
            rest = &rest[1..];
        }
    }
    out.push_str(rest);
    out
}

/// One fixture entry, ready to run in `root`.
struct Prepared {
    name: String,
    source: String,
    args: Vec<String>,
    /// Where the fake driver listens (the re-rooted --csi-address).
    csi: PathBuf,
    /// The address /healthz answers on, if any.
    health: Option<String>,
    kubelet_path: Option<String>,
    exec_probe: bool,
}

fn flag_value<'a>(arg: &'a str, flag: &str) -> Option<&'a str> {
    let body = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-'))?;
    body.strip_prefix(flag)?.strip_prefix('=')
}

fn free_port() -> String {
    let address = common::free_local_address();
    address.rsplit_once(':').unwrap().1.to_owned()
}

/// Where a client reaches a listen address: the wildcard and empty hosts mean loopback.
fn reach(host: &str, port: &str) -> String {
    match host {
        "" | "0.0.0.0" | "[::]" => format!("127.0.0.1:{port}"),
        host => format!("{host}:{port}"),
    }
}

fn prepare(entry: &Value, substitutions: &Value, root: &Path) -> Prepared {
    let env: BTreeMap<String, String> = entry["env"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect();
    let livenessprobe = entry["container"] == "livenessprobe";
    let name = match entry["argv0"].as_str() {
        Some(argv0) => argv0.rsplit('/').next().unwrap().to_owned(),
        None if livenessprobe => "livenessprobe".to_owned(),
        None => "csi-node-driver-registrar".to_owned(),
    };
    let reroot = |path: &str| root.join(path.trim_start_matches('/'));
    let mut csi = reroot("/run/csi/socket");
    let (mut health, mut kubelet_path, mut csi_given, mut port_given) = (None, None, false, false);
    let mut args = Vec::new();
    for arg in entry["args"].as_array().unwrap() {
        let mut arg = arg.as_str().unwrap().to_owned();
        for (template, value) in substitutions.as_object().unwrap() {
            arg = arg.replace(template.as_str(), value.as_str().unwrap());
        }
        let arg = kubelet_expand(&arg, &env);
        if let Some(path) = flag_value(&arg, "csi-address") {
            csi = reroot(path);
            csi_given = true;
            args.push(format!("--csi-address={}", csi.display()));
        } else if flag_value(&arg, "health-port").is_some() {
            let port = free_port();
            health = Some(reach("", &port));
            port_given = true;
            args.push(format!("--health-port={port}"));
        } else if let Some(endpoint) = flag_value(&arg, "http-endpoint") {
            let host = endpoint.rsplit_once(':').unwrap().0;
            let port = free_port();
            health = Some(reach(host, &port));
            port_given = true;
            args.push(format!("--http-endpoint={host}:{port}"));
        } else {
            if let Some(path) = flag_value(&arg, "kubelet-registration-path") {
                kubelet_path = Some(path.to_owned());
            }
            args.push(arg);
        }
    }
    if !csi_given {
        args.push(format!("--csi-address={}", csi.display()));
    }
    if livenessprobe && !port_given {
        // livenessprobe's default: --health-port=9808 on every interface.
        let port = free_port();
        health = Some(reach("", &port));
        args.push(format!("--health-port={port}"));
    }
    if !livenessprobe {
        let registry = root.join("registration");
        std::fs::create_dir_all(&registry).unwrap();
        args.push(format!("--plugin-registration-path={}", registry.display()));
    }
    let exec_probe = args
        .iter()
        .any(|a| a.ends_with("mode=kubelet-registration-probe"));
    Prepared {
        name,
        source: format!("{} ({})", entry["source"], entry["container"]),
        args,
        csi,
        health,
        kubelet_path,
        exec_probe,
    }
}

fn entries() -> (Vec<Value>, Value) {
    let fixture: Value = serde_json::from_str(FIXTURE).expect("the fixture is JSON");
    let entries = fixture["entries"].as_array().unwrap().clone();
    (entries, fixture["operator_substitutions"]["values"].clone())
}

#[test]
fn kubelet_expansion_replaces_defined_variables_and_keeps_the_rest() {
    let env = BTreeMap::from([("ADDRESS".to_owned(), "/csi/csi.sock".to_owned())]);
    assert_eq!(
        kubelet_expand("--csi-address=$(ADDRESS)", &env),
        "--csi-address=/csi/csi.sock"
    );
    assert_eq!(
        kubelet_expand("$(UNKNOWN)/$$(ADDRESS)", &env),
        "$(UNKNOWN)/$(ADDRESS)"
    );
}

/// Runs one entry to the point where it works, and says how long that took.
async fn works(entry: &Value, substitutions: &Value) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let run = prepare(entry, substitutions, dir.path());
    std::fs::create_dir_all(run.csi.parent().unwrap()).unwrap();
    let driver = FakeDriver::start(&run.csi, DRIVER);
    *driver.behaviour.ready.lock().unwrap() = Some(true);
    let program = common::symlink_as(dir.path(), &run.name);
    let started = Instant::now();
    let mut child = common::spawn(Command::new(program).args(&run.args), &run.name);
    let what = format!("{}: {} {:?}", run.source, run.name, run.args);
    if run.exec_probe {
        let status = common::wait_exit(&mut child.0, WAIT);
        assert!(status.success(), "{what}: {status}\n{}", child.stderr());
        return started.elapsed();
    }
    if run.name.contains("registrar") {
        let reg = dir.path().join(format!("registration/{DRIVER}-reg.sock"));
        let up = common::wait_until(WAIT, || common::is_socket(&reg)).await;
        assert!(up, "{what}: no registration socket\n{}", child.stderr());
        let channel = csi_nodekit::socket::connect(&reg).await.expect("dial");
        let info = RegistrationClient::new(channel)
            .get_info(InfoRequest {})
            .await
            .unwrap_or_else(|e| panic!("{what}: GetInfo: {e}"))
            .into_inner();
        assert_eq!(info.name, DRIVER, "{what}");
        assert_eq!(Some(info.endpoint), run.kubelet_path, "{what}");
    }
    if let Some(address) = &run.health {
        let answered = common::wait_until(WAIT, || std::net::TcpStream::connect(address).is_ok());
        assert!(
            answered.await,
            "{what}: nothing listens on {address}\n{}",
            child.stderr()
        );
        let (status, body) = common::http_get(address, "/healthz").await;
        assert_eq!(status, 200, "{what}: {body}\n{}", child.stderr());
    }
    let elapsed = started.elapsed();
    let stderr = child.stderr();
    assert!(
        !stderr.lines().any(|l| l.starts_with('E')),
        "{what}:\n{stderr}"
    );
    if run.args.iter().any(|a| a.contains("connection-timeout")) {
        let said = stderr.contains("ignored (no effect here): --connection-timeout");
        assert!(said, "{what}: an ignored flag is named\n{stderr}");
    }
    elapsed
}

async fn all_work(container: &str) {
    let (entries, substitutions) = entries();
    let mine: Vec<&Value> = entries
        .iter()
        .filter(|e| e["container"] == container)
        .collect();
    assert!(mine.len() > 20, "{container}: {} entries", mine.len());
    let mut slowest = Duration::ZERO;
    for entry in &mine {
        slowest = slowest.max(works(entry, &substitutions).await);
    }
    eprintln!(
        "{container}: {} real argument lists worked; slowest {slowest:?}",
        mine.len()
    );
}

#[tokio::test(flavor = "current_thread")]
async fn every_real_registrar_argument_list_registers_or_probes() {
    all_work("registrar").await;
}

#[tokio::test(flavor = "current_thread")]
async fn every_real_livenessprobe_argument_list_answers_healthz() {
    all_work("livenessprobe").await;
}

#[test]
fn the_fixture_names_a_source_for_every_entry_and_holds_58_of_them() {
    let (entries, _) = entries();
    assert_eq!(entries.len(), 58);
    for entry in &entries {
        let source = entry["source"].as_str().unwrap();
        assert!(source.contains('/') && source.contains('@'), "{source}");
    }
}
