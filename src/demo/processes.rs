//! The demo's three processes: this very binary, started in each mode as a DaemonSet would.

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::Layout;
use crate::BoxError;

/// A child process of the demo, stopped by SIGTERM (as Kubernetes stops containers).
pub struct Child {
    name: &'static str,
    process: std::process::Child,
    http: Option<String>,
}

fn this_binary() -> Result<std::path::PathBuf, BoxError> {
    std::env::current_exe().map_err(|e| format!("find our own binary: {e}").into())
}

/// Starts one process; its logs show only when the demo itself was asked for them (`--v`).
fn spawn(
    name: &'static str,
    args: &[String],
    stdout: Stdio,
) -> Result<std::process::Child, BoxError> {
    let verbose = args.iter().any(|a| a.starts_with("--v=") && a != "--v=0");
    Command::new(this_binary()?)
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(if verbose {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .spawn()
        .map_err(|e| format!("start {name}: {e}").into())
}

fn free_local_port() -> Result<u16, BoxError> {
    Ok(
        std::net::TcpListener::bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))?
            .local_addr()?
            .port(),
    )
}

impl Child {
    pub fn node_server(
        layout: &Layout,
        driver: &str,
        node: &str,
        log_flags: &[String],
    ) -> Result<Self, BoxError> {
        let args = [
            "node-server".to_owned(),
            format!("--endpoint=unix://{}", layout.csi_socket().display()),
            format!("--state-dir={}", layout.state().display()),
            format!("--driver-name={driver}"),
            format!("--node-id={node}"),
            "--capacity=1Gi".to_owned(),
            // The demo's volume is a directory in a scratch directory of /tmp, removed at the
            // end: its size is not meant to hold there.
            "--quota=off".to_owned(),
        ]
        .into_iter()
        .chain(log_flags.iter().cloned())
        .collect::<Vec<_>>();
        Ok(Self {
            name: "node-server",
            process: spawn("node-server", &args, Stdio::null())?,
            http: None,
        })
    }

    /// The registrar as a DaemonSet runs it; outside a container the driver socket's host path
    /// is its own path.
    pub fn registrar(layout: &Layout, log_flags: &[String]) -> Result<Self, BoxError> {
        let http = format!("127.0.0.1:{}", free_local_port()?);
        let args = [
            "registrar".to_owned(),
            format!("--csi-address={}", layout.csi_socket().display()),
            format!(
                "--kubelet-registration-path={}",
                layout.csi_socket().display()
            ),
            format!("--plugin-registration-path={}", layout.registry().display()),
            format!("--http-endpoint={http}"),
        ]
        .into_iter()
        .chain(log_flags.iter().cloned())
        .collect::<Vec<_>>();
        Ok(Self {
            name: "registrar",
            process: spawn("registrar", &args, Stdio::null())?,
            http: Some(http),
        })
    }

    /// What the registrar's `/readyz` says.
    pub async fn readyz(&self) -> String {
        let Some(http) = &self.http else {
            return String::new();
        };
        for _ in 0..50 {
            if let Ok((200, body)) = crate::http::get(http, "/readyz", Duration::from_secs(2)).await
            {
                return format!("200 {body}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        match crate::http::get(http, "/readyz", Duration::from_secs(2)).await {
            Ok((code, body)) => format!("{code} {body}"),
            Err(e) => e.to_string(),
        }
    }

    /// SIGTERM, then wait for a clean exit.
    pub fn stop(mut self) -> Result<(), BoxError> {
        let pid = nix::unistd::Pid::from_raw(self.process.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
        let status = self.process.wait()?;
        if !status.success() {
            return Err(format!("{} exited with {status}", self.name).into());
        }
        Ok(())
    }
}

impl Drop for Child {
    /// On an early error, still take the process down.
    fn drop(&mut self) {
        if let Ok(None) = self.process.try_wait() {
            let pid = nix::unistd::Pid::from_raw(self.process.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let _ = self.process.wait();
        }
    }
}

/// `probe kubelet` with its JSON event lines read on a thread.
pub struct Kubelet {
    child: Child,
    events: tokio::sync::mpsc::UnboundedReceiver<serde_json::Value>,
}

impl Kubelet {
    pub fn start(layout: &Layout, node: &str, log_flags: &[String]) -> Result<Self, BoxError> {
        let args = [
            "probe".to_owned(),
            "kubelet".to_owned(),
            format!("--plugins-registry={}", layout.registry().display()),
            format!("--node-name={node}"),
            "--output=json".to_owned(),
        ]
        .into_iter()
        .chain(log_flags.iter().cloned())
        .collect::<Vec<_>>();
        let mut process = spawn("probe kubelet", &args, Stdio::piped())?;
        let stdout = process.stdout.take().ok_or("probe kubelet has no stdout")?;
        let (send, events) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if let Ok(event) = serde_json::from_str(&line) {
                    let _ = send.send(event);
                }
            }
        });
        Ok(Self {
            child: Child {
                name: "probe kubelet",
                process,
                http: None,
            },
            events,
        })
    }

    pub async fn next_event(&mut self, limit: Duration) -> Result<serde_json::Value, BoxError> {
        match tokio::time::timeout(limit, self.events.recv()).await {
            Ok(Some(event)) => Ok(event),
            Ok(None) => Err("probe kubelet stopped unexpectedly".into()),
            Err(_) => Err(format!("no event from probe kubelet within {limit:?}").into()),
        }
    }

    pub fn stop(self) -> Result<(), BoxError> {
        self.child.stop()
    }
}

pub async fn wait_for_socket(path: &Path, limit: Duration) -> Result<(), BoxError> {
    let deadline = tokio::time::Instant::now() + limit;
    while crate::socket::identity_of(path).is_none() {
        if tokio::time::Instant::now() > deadline {
            return Err(format!("{} did not appear within {limit:?}", path.display()).into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
