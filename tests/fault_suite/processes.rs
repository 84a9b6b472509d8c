//! The three modes as real processes, started the way DaemonSets start them, and the calls
//! the kubelet makes on them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::{self, KillOnDrop, spawn, wait_until};
use csi_nodekit::proto::csi::ProbeRequest;
use csi_nodekit::proto::csi::identity_client::IdentityClient;
use csi_nodekit::proto::registration::InfoRequest;
use csi_nodekit::proto::registration::registration_client::RegistrationClient;

/// How long a process may take to come back.
pub const BACK_WITHIN: Duration = Duration::from_secs(10);
pub const DRIVER: &str = "faults.nodekit.io";
/// What the registrar tells the kubelet to dial.
pub const HOST_PATH: &str = "/var/lib/kubelet/plugins/faults.nodekit.io/csi.sock";

/// Where one case's processes keep their sockets and state.
pub struct Node {
    pub dir: tempfile::TempDir,
}

impl Node {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("create node directory"),
        }
    }

    pub fn csi(&self) -> PathBuf {
        self.dir.path().join("plugin/csi.sock")
    }

    pub fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn registry(&self) -> PathBuf {
        self.dir.path().join("plugins_registry")
    }

    pub fn reg_socket(&self) -> PathBuf {
        self.registry().join(format!("{DRIVER}-reg.sock"))
    }

    pub fn node_server_command(&self) -> Command {
        std::fs::create_dir_all(self.csi().parent().unwrap()).unwrap();
        let mut command = Command::new(common::binary());
        command
            .arg("node-server")
            .arg(format!("--endpoint=unix://{}", self.csi().display()))
            .arg(format!("--state-dir={}", self.state().display()))
            .arg(format!("--driver-name={DRIVER}"))
            .arg("--node-id=node-a")
            // This machine has no project quotas: directory volumes whose sizes do not hold
            // are meant here (`--quota=auto` refuses to make them).
            .arg("--quota=off");
        command
    }

    /// node-server, once it answers Probe ready.
    pub async fn node_server(&self) -> Option<KillOnDrop> {
        let process = spawn(&mut self.node_server_command(), "node-server");
        probe_ready(&self.csi()).await.then_some(process)
    }

    pub fn registrar_command(&self, http: &str) -> Command {
        let mut command = self.registrar_command_without_health_port();
        command.arg(format!("--http-endpoint={http}"));
        command
    }

    /// The registrar without a health port: for cases that start many, since a port found
    /// free may be taken by another test before the registrar binds it (it then exits).
    pub fn registrar_command_without_health_port(&self) -> Command {
        let mut command = Command::new(common::binary());
        command
            .arg("registrar")
            .arg(format!("--csi-address={}", self.csi().display()))
            .arg(format!("--kubelet-registration-path={HOST_PATH}"))
            .arg(format!(
                "--plugin-registration-path={}",
                self.registry().display()
            ));
        command
    }

    /// The registrar, once its registration socket answers GetInfo with the driver's name.
    pub async fn registrar(&self, http: &str) -> Option<KillOnDrop> {
        let process = spawn(&mut self.registrar_command(http), "registrar");
        registered(&self.reg_socket()).await.then_some(process)
    }

    /// livenessprobe under its upstream name, on `http`, once `/healthz` answers 200.
    pub async fn livenessprobe(&self, http: &str) -> Option<KillOnDrop> {
        let process = self.livenessprobe_process(http);
        healthz_within(http, 200, BACK_WITHIN)
            .await
            .then_some(process)
    }

    /// livenessprobe under its upstream name, on `http`, started (whatever the driver does).
    pub fn livenessprobe_process(&self, http: &str) -> KillOnDrop {
        let program = self.dir.path().join("livenessprobe");
        if !program.exists() {
            common::symlink_as(self.dir.path(), "livenessprobe");
        }
        spawn(
            Command::new(program)
                .arg(format!("--csi-address={}", self.csi().display()))
                .arg(format!("--http-endpoint={http}"))
                .arg("--probe-timeout=1s"),
            "livenessprobe",
        )
    }
}

/// Whether the CSI socket at `csi` answers Probe (ready) within [`BACK_WITHIN`].
pub async fn probe_ready(csi: &Path) -> bool {
    let deadline = tokio::time::Instant::now() + BACK_WITHIN;
    while tokio::time::Instant::now() < deadline {
        if let Ok(channel) = csi_nodekit::socket::connect(csi).await {
            let reply = IdentityClient::new(channel).probe(ProbeRequest {}).await;
            if reply.is_ok_and(|r| r.into_inner().ready != Some(false)) {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// The driver name GetInfo answers on a registration socket, if it answers within 2 s.
pub async fn get_info(socket: &Path) -> Option<String> {
    let call = async {
        let channel = csi_nodekit::socket::connect(socket).await.ok()?;
        let reply = RegistrationClient::new(channel)
            .get_info(InfoRequest {})
            .await;
        Some(reply.ok()?.into_inner().name)
    };
    tokio::time::timeout(Duration::from_secs(2), call)
        .await
        .ok()
        .flatten()
}

/// Whether the registration socket at `socket` answers GetInfo with our driver's name within
/// [`BACK_WITHIN`].
pub async fn registered(socket: &Path) -> bool {
    let deadline = tokio::time::Instant::now() + BACK_WITHIN;
    while tokio::time::Instant::now() < deadline {
        if get_info(socket).await.as_deref() == Some(DRIVER) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// The status of one GET of `/healthz` (0: no answer within 2 s).
pub async fn healthz(address: &str) -> u16 {
    csi_nodekit::http::get(address, "/healthz", Duration::from_secs(2))
        .await
        .map_or(0, |(status, _)| status)
}

/// Whether `/healthz` answers `status` within `limit`.
pub async fn healthz_within(address: &str, status: u16, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if healthz(address).await == status {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Kills `process` with SIGKILL (no clean-up of its own) and reaps it.
pub fn kill(mut process: KillOnDrop) {
    common::send_signal(&process.0, nix::sys::signal::Signal::SIGKILL);
    let _ = process.0.wait();
}

/// Whether `process` exited within `limit` with a failure code (it refused to run).
pub async fn refused(process: &mut KillOnDrop, limit: Duration) -> bool {
    let exited = wait_until(limit, || matches!(process.0.try_wait(), Ok(Some(_)))).await;
    exited
        && process
            .0
            .try_wait()
            .ok()
            .flatten()
            .is_some_and(|s| !s.success())
}
