//! What the registrar's tests share: a temporary plugin directory and registry, the registrar
//! on it (in process, or the real binary with the arguments real DaemonSets use), and its
//! HTTP endpoint.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::common;
use common::fake_driver::FakeDriver;
use common::registrar::{HOST_PATH, Registrar};
use common::{is_socket, wait_until};

pub const DRIVER: &str = "fake.csi.example.io";
pub const WAIT: Duration = Duration::from_secs(10);

pub struct Setup {
    _dir: tempfile::TempDir,
    pub csi: PathBuf,
    pub registry: PathBuf,
}

impl Setup {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let csi = dir.path().join("plugin/csi.sock");
        let registry = dir.path().join("plugins_registry");
        Self {
            csi,
            registry,
            _dir: dir,
        }
    }

    pub fn reg_socket(&self) -> PathBuf {
        self.registry.join(format!("{DRIVER}-reg.sock"))
    }

    /// A driver and a registrar, once the registration socket is up.
    pub async fn running(&self) -> (FakeDriver, Registrar) {
        let driver = FakeDriver::start(&self.csi, DRIVER);
        let registrar = self.start_registrar().await;
        assert!(
            wait_until(WAIT, || is_socket(&self.reg_socket())).await,
            "no registration socket"
        );
        (driver, registrar)
    }

    pub async fn start_registrar(&self) -> Registrar {
        Registrar::start(&self.csi, &self.registry, &[]).await
    }

    /// The real binary with the arguments real DaemonSets use.
    pub fn registrar_command(&self) -> Command {
        let mut command = Command::new(common::binary());
        command
            .arg("registrar")
            .arg(format!("--csi-address={}", self.csi.display()))
            .arg(format!("--kubelet-registration-path={HOST_PATH}"))
            .arg(format!(
                "--plugin-registration-path={}",
                self.registry.display()
            ));
        command
    }
}

/// Waits until `/healthz` answers a plain `ok`: the registrar has its own socket and its
/// self-check passed (a bare 200 may also be `ok: re-creating …`).
pub async fn until_healthy(address: &str) {
    let healthy = async {
        while http(address, "/healthz").await != (200, "ok".to_owned()) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let within = tokio::time::timeout(WAIT, healthy).await;
    assert!(within.is_ok(), "/healthz never answered ok");
}

pub async fn http(address: &str, path: &str) -> (u16, String) {
    csi_nodekit::http::get(address, path, Duration::from_secs(5))
        .await
        .expect("HTTP answer")
}
