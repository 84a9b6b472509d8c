//! `registrar`: a drop-in `node-driver-registrar` that asks the driver its name, serves the
//! kubelet's plugin-registration API on `<driver>-reg.sock`, and keeps the driver registered
//! through late starts, restarts, deleted sockets and rejected registrations.
//!
//! `service` is the registration service the kubelet calls; `supervise` the life cycle of the
//! registration socket, `ask_driver` and `stand_by` the waits in it (for the driver's name,
//! for the socket to be ours), `steps` what those three share (back-offs, what comes next, why
//! the registrar gives up); `health` the health port.

mod ask_driver;
mod health;
mod service;
mod stand_by;
mod steps;
mod supervise;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use argh::{ArgsInfo, FromArgs};

pub use service::{Phase, RegistrationService, Tracker, Verdict, plugin_info};

use crate::cli::values::{
    self, AbsolutePath, FlagValue, GroupId, HostSocketPath, HttpEndpoint, OrEmpty,
    PositiveDuration, Refusal, SocketAddress, SocketMode,
};
use crate::gocompat::GoDuration;
use crate::runtime::Threads;
use crate::shutdown::Shutdown;
use crate::{BoxError, UsageError, socket};

crate::mode_args! {
    upstream;
    #[derive(FromArgs, ArgsInfo, Debug)]
    /// Registers a CSI driver with the kubelet and keeps it registered (drop-in node-driver-registrar).
    pub struct Args {
        /// path of the CSI driver socket the registrar connects to (default "/run/csi/socket")
        #[argh(option, default = "SocketAddress::known(\"/run/csi/socket\")")]
        pub csi_address: SocketAddress,
        /// absolute path of the CSI driver socket on the Kubernetes host, handed to the
        /// kubelet (required)
        #[argh(option)]
        pub kubelet_registration_path: Option<HostSocketPath>,
        /// absolute path of the directory where <driver>-reg.sock is created (default
        /// "/registration")
        #[argh(option, default = "AbsolutePath::known(\"/registration\")")]
        pub plugin_registration_path: AbsolutePath,
        /// deadline of each GetPluginInfo call and of the /healthz self-check (default 1s)
        #[argh(option, default = "PositiveDuration::from_secs(1)", arg_name = "duration")]
        pub timeout: PositiveDuration,
        /// address of the HTTP server for /healthz, /readyz and /metrics, e.g. :9809; empty
        /// means no server
        #[argh(option, default = "OrEmpty::default()")]
        pub http_endpoint: OrEmpty<HttpEndpoint>,
        /// deprecated: TCP port for /healthz on every interface; 0 means none (use
        /// --http-endpoint)
        #[argh(option, default = "0", arg_name = "int")]
        pub health_port: u16,
        /// deprecated: kubelet-registration-probe exits 0 at once, as upstream v2.9 and later
        #[argh(option, default = "Mode::Registration")]
        pub mode: Mode,
        /// accepted and ignored: deprecated upstream, without effect there either
        #[argh(option, arg_name = "duration")]
        pub connection_timeout: Option<GoDuration>,
        /// give up if the driver has not answered within this long (default: wait forever)
        #[argh(option, arg_name = "duration")]
        pub driver_wait_limit: Option<GoDuration>,
        /// file mode of the registration socket, octal permission bits (default 0700)
        #[argh(option, default = "SocketMode::from_bits(0o700)", arg_name = "value")]
        pub socket_mode: SocketMode,
        /// numeric group ID to own the registration socket
        #[argh(option, arg_name = "int")]
        pub socket_group: Option<GroupId>,
        /// accepted and ignored: Go's profiling endpoints
        #[argh(switch)]
        pub enable_pprof: bool,
        /// accepted and ignored: Go runtime tuning
        #[argh(switch)]
        pub automaxprocs: bool,
    }
    ignored {
        "--connection-timeout" => connection_timeout,
        "--enable-pprof" => enable_pprof,
        "--automaxprocs" => automaxprocs,
    }
}

/// `--mode`: `registration` (or empty), or `kubelet-registration-probe`, which exits 0 at
/// once, as upstream v2.9 and later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `registration`, or empty: register the driver.
    Registration,
    /// `kubelet-registration-probe`: exit 0 at once.
    KubeletRegistrationProbe,
}

impl FlagValue for Mode {
    fn parse(text: &str) -> Result<Self, Refusal> {
        match text {
            "" | "registration" => Ok(Self::Registration),
            "kubelet-registration-probe" => Ok(Self::KubeletRegistrationProbe),
            _ => Err(Refusal::new(
                "expected registration or kubelet-registration-probe",
            )),
        }
    }
}

values::flag_value!(Mode);

/// The command line, assembled (argh refused bad values while parsing; the flags that need
/// each other are checked here).
#[derive(Debug, Clone)]
pub struct Settings {
    pub csi_address: PathBuf,
    pub kubelet_registration_path: String,
    pub plugin_registration_path: PathBuf,
    pub timeout: Duration,
    pub http_endpoint: Option<String>,
    pub driver_wait_limit: Option<Duration>,
    pub socket_perms: socket::Permissions,
}

impl Settings {
    /// Assembles the settings (a missing or excluded flag is a usage error, exit 2); `None`
    /// means "exit at once, successfully" (upstream's probe mode).
    pub fn from_args(args: Args) -> Result<Option<Self>, BoxError> {
        let Some(kubelet_registration_path) = args.kubelet_registration_path else {
            return Err(UsageError::new("--kubelet-registration-path is required").into());
        };
        if args.mode == Mode::KubeletRegistrationProbe {
            log::info!(
                "--mode=kubelet-registration-probe is a no-op, as upstream; use `probe registration`"
            );
            return Ok(None);
        }
        let http_endpoint = match (args.http_endpoint.into_option(), args.health_port) {
            (None, 0) => None,
            (Some(endpoint), 0) => Some(endpoint.into_string()),
            (None, port) => Some(format!(":{port}")),
            (Some(_), _) => {
                return Err(UsageError::new(
                    "only one of --http-endpoint and --health-port may be set",
                )
                .into());
            }
        };
        Ok(Some(Self {
            csi_address: args.csi_address.into_path(),
            kubelet_registration_path: kubelet_registration_path.into_string(),
            plugin_registration_path: args.plugin_registration_path.into_path(),
            timeout: args.timeout.get(),
            http_endpoint,
            driver_wait_limit: args.driver_wait_limit.map(|d| d.0).filter(|d| !d.is_zero()),
            socket_perms: socket::Permissions {
                mode: args.socket_mode.bits(),
                gid: args.socket_group.map(GroupId::get),
            },
        }))
    }
}

/// The mode's entry from the command line.
pub fn main(args: Args) -> Result<(), BoxError> {
    match Settings::from_args(args)? {
        Some(settings) => run(settings),
        None => Ok(()),
    }
}

/// Binds the HTTP endpoint (if any) and runs the registrar until SIGTERM or SIGINT.
pub fn run(settings: Settings) -> Result<(), BoxError> {
    crate::runtime::serve(Threads::Current, |shutdown| async move {
        let http = match &settings.http_endpoint {
            Some(endpoint) => Some(crate::http::bind(endpoint).await?),
            None => None,
        };
        serve(http, settings, shutdown).await
    })
}

/// Serves `/healthz`, `/readyz` and `/metrics` on `http` (if given) and keeps the driver
/// registered until `shutdown`. The registration socket is not passed in: the registrar
/// creates it, and creates it again whenever the kubelet must register anew. Returns once the
/// HTTP requests in progress at shutdown are answered too (a `/healthz` self-check takes up to
/// `--timeout`), within the grace period.
pub async fn serve(
    http: Option<tokio::net::TcpListener>,
    settings: Settings,
    shutdown: Shutdown,
) -> Result<(), BoxError> {
    let mut metrics = crate::metrics::Metrics::new();
    let tracker = Tracker::new(&mut metrics);
    let metrics = Arc::new(metrics);
    let settings = Arc::new(settings);
    let http_server = http.map(|listener| {
        let handler = health::Handler {
            settings: settings.clone(),
            tracker: tracker.clone(),
            metrics: metrics.clone(),
        };
        tokio::spawn(crate::http::serve(
            listener,
            move |path| handler.clone().answer(path),
            shutdown.clone(),
        ))
    });
    let supervised = supervise::Supervisor::new(settings, tracker, metrics, shutdown)
        .run()
        .await;
    if let Some(task) = http_server {
        if supervised.is_err() {
            // Giving up is no shutdown: the HTTP server is told to stop here.
            task.abort();
        }
        let _ = task.await;
    }
    supervised.map_err(Into::into)
}
