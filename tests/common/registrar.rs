//! The registrar served in-process, on the test's own HTTP listener and with a shutdown the
//! test controls: its settings come from a real command line, so defaults and flag parsing are
//! the binary's. On a test's current-thread runtime its logs are kept for that test and shown
//! if it fails (see [`logs`](super::logs)).

use std::path::Path;

use csi_nodekit::BoxError;
use csi_nodekit::registrar::{Args, Settings, serve};
use csi_nodekit::shutdown::{Shutdown, Trigger};

/// What the kubelet is told to dial (the driver socket's host path).
pub const HOST_PATH: &str = "/var/lib/kubelet/plugins/fake.csi.example.io/csi.sock";

/// A running registrar; dropping it starts its shutdown.
pub struct Registrar {
    /// Where its `/healthz`, `/readyz` and `/metrics` answer.
    pub http: String,
    stop: Trigger,
    task: Option<tokio::task::JoinHandle<Result<(), BoxError>>>,
}

impl Registrar {
    /// Starts a registrar for the driver at `csi`, registering through `registry`, with the
    /// arguments real DaemonSets use plus `extra` (inside a tokio runtime).
    pub async fn start(csi: &Path, registry: &Path, extra: &[&str]) -> Self {
        let mut words = vec![
            "--v=2".to_owned(),
            format!("--csi-address={}", csi.display()),
            format!("--kubelet-registration-path={HOST_PATH}"),
            "-plugin-registration-path".to_owned(),
            registry.display().to_string(),
        ];
        words.extend(extra.iter().map(|w| w.to_string()));
        super::logs::capture();
        let args: Args = csi_nodekit::cli::parse_mode_args("registrar", &words)
            .unwrap_or_else(|stop| panic!("registrar flags: {stop:?}"));
        let settings = Settings::from_args(args)
            .expect("valid settings")
            .expect("not the probe mode");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind an HTTP listener");
        let http = listener.local_addr().expect("local address").to_string();
        let (stop, shutdown) = Shutdown::manual();
        let task = tokio::spawn(serve(Some(listener), settings, shutdown));
        Self {
            http,
            stop,
            task: Some(task),
        }
    }

    /// Whether it is still serving (it gives up only on fatal errors).
    pub fn is_running(&self) -> bool {
        self.task.as_ref().is_some_and(|task| !task.is_finished())
    }

    /// Shuts it down and waits for it to finish.
    pub async fn stop(mut self) -> Result<(), BoxError> {
        self.stop.fire();
        let task = self.task.take().expect("started");
        task.await.expect("registrar task")
    }
}

impl Drop for Registrar {
    fn drop(&mut self) {
        self.stop.fire();
        super::logs::finish();
    }
}
