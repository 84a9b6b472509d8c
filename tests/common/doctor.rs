//! Staging a node for `probe doctor`: a temporary kubelet root with registration sockets and
//! drivers (fakes where a misbehaviour must be staged), the real binary run against it, and a
//! snapshot of every file to prove the doctor changed nothing.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use csi_nodekit::proto::registration::PluginInfo;
use serde_json::Value;
use tonic::service::Routes;

use super::fake_driver::{Behaviour, identity_server};
use super::fake_plugin::{self, Bind, NodeAnswer, Registrar, Served, csi_plugin, node_server};
use super::{KillOnDrop, is_socket, wait_until};

/// A temporary kubelet root: `<root>/plugins_registry` and `<root>/plugins`.
pub struct KubeletRoot {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
}

impl KubeletRoot {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_owned();
        std::fs::create_dir_all(root.join("plugins_registry")).unwrap();
        std::fs::create_dir_all(root.join("plugins")).unwrap();
        Self { _dir: dir, root }
    }

    pub fn registry(&self) -> PathBuf {
        self.root.join("plugins_registry")
    }

    pub fn reg_socket(&self, driver: &str) -> PathBuf {
        self.registry().join(format!("{driver}-reg.sock"))
    }

    pub fn driver_socket(&self, driver: &str) -> PathBuf {
        self.root.join("plugins").join(driver).join("csi.sock")
    }
}

/// A fake driver at `socket`: Identity (name, Probe answer from `behaviour`) and Node
/// (NodeGetInfo gives `answer`).
pub fn fake_driver(socket: &Path, behaviour: Arc<Behaviour>, answer: Arc<NodeAnswer>) -> Served {
    let routes = Routes::new(identity_server(behaviour)).add_service(node_server(answer));
    Served::start(socket, Bind::AtPath, routes)
}

pub fn behaviour(name: &str) -> Arc<Behaviour> {
    let behaviour = Behaviour::default();
    *behaviour.name.lock().unwrap() = name.into();
    Arc::new(behaviour)
}

/// A healthy fake plugin: driver `name` at `plugins/<name>/csi.sock` and a registration socket
/// announcing it.
pub struct FakePlugin {
    pub driver: Served,
    pub registration: Served,
    pub registrar: Arc<Registrar>,
    pub behaviour: Arc<Behaviour>,
    pub answer: Arc<NodeAnswer>,
}

pub fn fake_plugin(node: &KubeletRoot, name: &str) -> FakePlugin {
    let socket = node.driver_socket(name);
    let behaviour = behaviour(name);
    let answer = NodeAnswer::new("node-a", 0, &[]);
    let driver = fake_driver(&socket, behaviour.clone(), answer.clone());
    let info = csi_plugin(name, &socket.display().to_string());
    let (registration, registrar) =
        fake_plugin::registration(&node.reg_socket(name), Bind::AtPath, info);
    FakePlugin {
        driver,
        registration,
        registrar,
        behaviour,
        answer,
    }
}

/// Our node-server and our registrar on a temporary kubelet root, as a DaemonSet would run
/// them on the host, and the registrar's HTTP address.
pub async fn our_plugin(node: &KubeletRoot, driver: &str) -> (KillOnDrop, KillOnDrop, String) {
    let socket = node.driver_socket(driver);
    let server = super::spawn_node_server(
        &socket,
        &node.root.join("state"),
        &[
            &format!("--driver-name={driver}"),
            "--node-id=node-a",
            "--max-volumes-per-node=7",
        ],
    );
    let http = super::free_local_address();
    let registrar = super::spawn(
        Command::new(super::binary())
            .arg("registrar")
            .arg(format!("--csi-address={}", socket.display()))
            .arg(format!("--kubelet-registration-path={}", socket.display()))
            .arg(format!(
                "--plugin-registration-path={}",
                node.registry().display()
            ))
            .arg(format!("--http-endpoint={http}")),
        "registrar",
    );
    let reg_socket = node.reg_socket(driver);
    assert!(
        wait_until(Duration::from_secs(10), || is_socket(&reg_socket)).await,
        "the registrar did not create {reg_socket:?}"
    );
    (server, registrar, http)
}

/// A registration socket announcing `info`.
pub fn registration(socket: &Path, info: PluginInfo) -> (Served, Arc<Registrar>) {
    fake_plugin::registration(socket, Bind::AtPath, info)
}

/// A live registration socket for `driver` outside `host` (in its own temporary directory),
/// linked from `host`'s `/var/lib/kubelet/plugins_registry`: what the doctor must never call
/// through `--host-root`.
pub fn bait_behind_a_registry_link(
    host: &Path,
    driver: &str,
) -> (tempfile::TempDir, Served, Arc<Registrar>) {
    let registry = host.join("var/lib/kubelet/plugins_registry");
    std::fs::create_dir_all(&registry).unwrap();
    let outside = tempfile::tempdir().unwrap();
    let bait = outside.path().join("bait-reg.sock");
    let (served, registrar) = registration(
        &bait,
        super::fake_plugin::csi_plugin(driver, "/csi/csi.sock"),
    );
    std::os::unix::fs::symlink(&bait, registry.join(format!("{driver}-reg.sock"))).unwrap();
    (outside, served, registrar)
}

/// A socket file nobody listens on (what a SIGKILLed server leaves).
pub fn stale_socket(path: &Path) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    drop(std::os::unix::net::UnixListener::bind(path).unwrap());
}

/// What one doctor run gave.
#[derive(Debug)]
pub struct Outcome {
    pub code: Option<i32>,
    pub report: Value,
    pub stderr: String,
    pub took: Duration,
}

impl Outcome {
    /// Every finding, node-wide and per plugin, as (severity, check, saw).
    pub fn findings(&self) -> Vec<(String, String, String)> {
        let plugin_findings = self.report["plugins"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|p| p["findings"].as_array().into_iter().flatten());
        let node_findings = self.report["findings"].as_array().into_iter().flatten();
        node_findings
            .chain(plugin_findings)
            .map(|f| {
                let text = |k: &str| f[k].as_str().unwrap_or_default().to_owned();
                (text("severity"), text("check"), text("saw"))
            })
            .collect()
    }

    /// The findings of one check, as (severity, saw).
    pub fn of(&self, check: &str) -> Vec<(String, String)> {
        self.findings()
            .into_iter()
            .filter(|(_, c, _)| c == check)
            .map(|(s, _, saw)| (s, saw))
            .collect()
    }

    /// The checks that reported an error.
    pub fn errors(&self) -> Vec<String> {
        self.findings()
            .into_iter()
            .filter(|(s, _, _)| s == "error")
            .map(|(_, c, _)| c)
            .collect()
    }

    pub fn plugin(&self, socket: &Path) -> &Value {
        self.report["plugins"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["socket"].as_str() == Some(&socket.display().to_string()))
            .unwrap_or_else(|| panic!("no plugin {socket:?} in {}", self.report))
    }
}

/// The doctor command without API access, reading processes from `proc_root`, plus `extra`.
pub fn base_command(proc_root: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new(super::binary());
    command
        .args([
            "probe",
            "doctor",
            "--output=json",
            "--no-api",
            "--node-name=node-a",
        ])
        .arg(format!("--proc-root={}", proc_root.display()))
        .args(extra)
        .stdin(Stdio::null());
    command
}

/// An empty process table (a `--proc-root` must exist), shared by every run.
pub fn empty_proc() -> PathBuf {
    let dir = std::env::temp_dir().join("csi-nodekit-tests-empty-proc");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The doctor command against a kubelet root, with an empty process table (so the machine's
/// own processes play no part), plus `extra`.
pub fn command(root: &Path, extra: &[&str]) -> Command {
    let root_flag = format!("--kubelet-root={}", root.display());
    let mut all = vec![root_flag.as_str()];
    all.extend_from_slice(extra);
    base_command(&empty_proc(), &all)
}

/// Runs a prepared command to its end off the async threads (the fakes are served there).
pub async fn run(mut command: Command) -> Outcome {
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let output = command.output().expect("run csi-nodekit probe doctor");
        let took = started.elapsed();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let report = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("not one JSON document ({e}): {stdout}"));
        Outcome {
            code: output.status.code(),
            report,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            took,
        }
    })
    .await
    .unwrap()
}

pub async fn doctor(root: &Path, extra: &[&str]) -> Outcome {
    run(command(root, extra)).await
}

/// Every file and directory under `dir` with its mode, owner, inode, size and modification
/// time (a file created and removed again still changes its directory's mtime).
pub fn snapshot(dir: &Path) -> Vec<(PathBuf, u32, u32, u64, u64, i64, i64)> {
    super::tree_fixture::walk(dir)
        .into_iter()
        .map(|path| {
            let meta = std::fs::symlink_metadata(dir.join(&path)).unwrap();
            let (mode, uid, ino, size) = (meta.mode(), meta.uid(), meta.ino(), meta.size());
            (path, mode, uid, ino, size, meta.mtime(), meta.mtime_nsec())
        })
        .collect()
}
