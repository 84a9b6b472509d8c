//! `probe serve`: a drop-in livenessprobe. It listens at once (answering 500 while the driver
//! is absent instead of refusing connections), keeps one connection to the driver while the
//! driver's socket stays the same and no call times out, lets simultaneous probes share one
//! in-flight Probe call, never exits because the driver is down, and answers the probes in
//! progress before it exits on SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use argh::{ArgsInfo, FromArgs};
use tokio::sync::{Mutex, watch};
use tokio::time::Instant;

use super::check::{self, ProbeError};
use crate::cli::values::{
    FlagValue, HttpEndpoint, MetricsPath, OrEmpty, PositiveDuration, SocketAddress, TcpPort,
};
use crate::gocompat::GoDuration;
use crate::http::Reply;
use crate::metrics::Metrics;
use crate::runtime::Threads;
use crate::shutdown::Shutdown;
use crate::{BoxError, UsageError, socket};

crate::mode_args! {
    upstream;
    #[derive(FromArgs, ArgsInfo, Debug)]
    #[argh(subcommand, name = "serve")]
    /// Serve /healthz by calling the driver's Probe (drop-in livenessprobe).
    pub struct Args {
        /// address of the CSI driver socket (default "/run/csi/socket")
        #[argh(option, default = "SocketAddress::known(\"/run/csi/socket\")")]
        pub csi_address: SocketAddress,
        /// deadline for connecting and calling Probe (default 3s)
        #[argh(option, default = "PositiveDuration::from_secs(3)", arg_name = "duration")]
        pub probe_timeout: PositiveDuration,
        /// deprecated: TCP port for /healthz on 0.0.0.0 (use --http-endpoint) (default "9808")
        #[argh(option, default = "TcpPort::known(\"9808\")")]
        pub health_port: TcpPort,
        /// address to listen on for /healthz and /metrics, e.g. :9808; if set, --health-port
        /// and --metrics-address cannot be
        #[argh(option, default = "OrEmpty::default()")]
        pub http_endpoint: OrEmpty<HttpEndpoint>,
        /// deprecated: a separate address for metrics, e.g. :8080 (use --http-endpoint)
        #[argh(option, default = "OrEmpty::default()")]
        pub metrics_address: OrEmpty<HttpEndpoint>,
        /// path of the metrics page, not /healthz (default "/metrics")
        #[argh(option, default = "MetricsPath::known(\"/metrics\")")]
        pub metrics_path: MetricsPath,
        /// accepted and ignored: livenessprobe v1's, without effect there either
        #[argh(option, arg_name = "duration")]
        pub connection_timeout: Option<GoDuration>,
        /// accepted and ignored: Go runtime tuning
        #[argh(switch)]
        pub automaxprocs: bool,
    }
    ignored {
        "--connection-timeout" => connection_timeout,
        "--automaxprocs" => automaxprocs,
    }
}

type Outcome = Option<Result<(), Arc<ProbeError>>>;

/// The one driver connection, and which socket file it was dialled to.
struct Dialled {
    channel: tonic::transport::Channel,
    socket: Option<socket::Identity>,
}

/// The driver connection and the probe in flight, shared by every HTTP request.
pub struct Prober {
    address: std::path::PathBuf,
    timeout: Duration,
    metrics: Arc<Metrics>,
    channel: Mutex<Option<Dialled>>,
    /// The driver's name, for the metrics label; empty until it has told us.
    driver: std::sync::Mutex<String>,
    in_flight: std::sync::Mutex<Option<watch::Receiver<Outcome>>>,
}

impl Prober {
    pub fn new(address: std::path::PathBuf, timeout: Duration, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            address,
            timeout,
            metrics,
            channel: Mutex::new(None),
            driver: std::sync::Mutex::new(String::new()),
            in_flight: std::sync::Mutex::new(None),
        })
    }

    /// The connection to use, and whether it is new: the one we have while the address still
    /// holds the socket it was dialled to, else a new one. A restarted driver binds a new
    /// socket file while its hung predecessor may hold the old connection open for ever, so
    /// the driver is followed by its socket's identity, as the registrar does.
    async fn channel(
        &self,
        deadline: Instant,
    ) -> Result<(tonic::transport::Channel, bool), ProbeError> {
        let mut slot = self.channel.lock().await;
        let socket = socket::identity_of(&self.address);
        if let Some(dialled) = slot.as_ref()
            && dialled.socket == socket
        {
            return Ok((dialled.channel.clone(), false));
        }
        if slot.take().is_some() {
            log::info!(
                "driver socket {} changed; connecting again",
                self.address.display()
            );
        }
        let channel = check::connect(&self.address, deadline, self.timeout).await?;
        *slot = Some(Dialled {
            channel: channel.clone(),
            socket,
        });
        Ok((channel, true))
    }

    fn driver_name(&self) -> String {
        crate::mutex::lock(&self.driver).clone()
    }

    /// Asks the driver its name (upstream asks once at start; we ask on every new connection,
    /// since a re-created socket may be another driver).
    async fn learn_name(&self, channel: tonic::transport::Channel, timeout: Duration) {
        let mut client = crate::proto::csi::identity_client::IdentityClient::new(channel);
        let request = crate::proto::csi::GetPluginInfoRequest {};
        let Ok(Ok(info)) = tokio::time::timeout(timeout, client.get_plugin_info(request)).await
        else {
            return;
        };
        let name = info.into_inner().name;
        let mut known = crate::mutex::lock(&self.driver);
        if !name.is_empty() && *known != name {
            log::info!("probing CSI driver {name} at {}", self.address.display());
            *known = name;
        }
    }

    /// One probe under one deadline for connecting and calling Probe, as upstream. On a new
    /// connection the name is asked beside the Probe, and the Probe is recorded once both are
    /// done, so that no series without the driver's name appears. A call that timed out drops
    /// the connection: a wedged one is not waited on again.
    async fn probe_now(self: &Arc<Self>) -> Result<(), ProbeError> {
        let deadline = Instant::now() + self.timeout;
        let (channel, fresh) = self.channel(deadline).await?;
        let left = deadline.saturating_duration_since(Instant::now());
        let for_name = channel.clone();
        let ask = async {
            if fresh || self.driver_name().is_empty() {
                self.learn_name(for_name, left).await;
            }
        };
        let ((), (reply, took)) = tokio::join!(ask, check::call(channel, left));
        let driver = self.driver_name();
        if driver.is_empty() {
            log::debug!("Probe not recorded in the metrics: the driver has not told its name");
        } else {
            self.metrics
                .observe(&driver, check::PROBE, check::code(&reply), took);
        }
        if reply
            .as_ref()
            .is_err_and(|s| s.code() == tonic::Code::DeadlineExceeded)
        {
            *self.channel.lock().await = None;
        }
        check::verdict(reply)
    }

    /// Probes the driver; callers arriving while a probe runs share its result.
    pub async fn probe(self: &Arc<Self>) -> Result<(), Arc<ProbeError>> {
        let mut receiver = {
            let mut in_flight = crate::mutex::lock(&self.in_flight);
            match in_flight.as_ref() {
                Some(receiver) => receiver.clone(),
                None => {
                    let (sender, receiver) = watch::channel(None);
                    *in_flight = Some(receiver.clone());
                    let prober = self.clone();
                    tokio::spawn(async move {
                        let outcome = prober.probe_now().await.map_err(Arc::new);
                        *crate::mutex::lock(&prober.in_flight) = None;
                        sender.send_replace(Some(outcome));
                    });
                    receiver
                }
            }
        };
        match receiver.wait_for(Option::is_some).await {
            Ok(outcome) => outcome.clone().unwrap_or(Err(Arc::new(ProbeError::Lost))),
            Err(_) => Err(Arc::new(ProbeError::Lost)),
        }
    }
}

/// Answers one HTTP request.
async fn answer(prober: Arc<Prober>, metrics_path: Arc<str>, path: String) -> Reply {
    if path == "/healthz" {
        return match prober.probe().await {
            Ok(()) => {
                log::trace!("health check passed");
                Reply::text(200, "ok")
            }
            Err(reason) => {
                log::debug!("health check failed: {reason}");
                Reply::text(500, reason.to_string())
            }
        };
    }
    if *path == *metrics_path {
        return Reply {
            status: 200,
            content_type: crate::metrics::CONTENT_TYPE,
            body: prober.metrics.encode(),
        };
    }
    Reply::not_found()
}

/// The command line, as the server uses it (its values were checked while parsing).
#[derive(Debug, Clone)]
pub struct Settings {
    pub csi_address: std::path::PathBuf,
    /// One deadline for connecting and calling Probe.
    pub probe_timeout: Duration,
    /// Where `/healthz` (and `/metrics`, unless `metrics_address` is given) is served.
    pub http_endpoint: String,
    pub metrics_address: Option<String>,
    pub metrics_path: String,
}

impl Settings {
    /// Assembles the settings; flags that exclude each other are a usage error.
    pub fn from_args(args: Args) -> Result<Self, BoxError> {
        let metrics_address = args.metrics_address.into_option();
        let http_endpoint = match args.http_endpoint.into_option() {
            None => format!("0.0.0.0:{}", args.health_port.as_str()),
            // As upstream: --health-port=9808 written out next to --http-endpoint is allowed.
            Some(_) if args.health_port.as_str() != "9808" => {
                let why = "only one of --http-endpoint and --health-port may be set";
                return Err(UsageError::new(why).into());
            }
            Some(_) if metrics_address.is_some() => {
                let why = "only one of --http-endpoint and --metrics-address may be set";
                return Err(UsageError::new(why).into());
            }
            Some(given) => given.into_string(),
        };
        Ok(Self {
            csi_address: args.csi_address.into_path(),
            probe_timeout: args.probe_timeout.get(),
            http_endpoint,
            metrics_address: metrics_address.map(HttpEndpoint::into_string),
            metrics_path: args.metrics_path.into_string(),
        })
    }
}

/// Binds the HTTP listeners and serves until SIGTERM or SIGINT.
pub fn run(settings: Settings) -> Result<(), BoxError> {
    crate::runtime::serve(Threads::Current, |shutdown| async move {
        let listener = crate::http::bind(&settings.http_endpoint).await?;
        let metrics_listener = match &settings.metrics_address {
            Some(address) => Some(crate::http::bind(address).await?),
            None => None,
        };
        log::info!(
            "serving /healthz on {} for the driver at {}",
            settings.http_endpoint,
            settings.csi_address.display()
        );
        serve(listener, metrics_listener, settings, shutdown).await;
        Ok(())
    })
}

/// Serves `/healthz` (and metrics) on `listener`, metrics alone on `metrics_listener` if
/// given, until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics_listener: Option<tokio::net::TcpListener>,
    settings: Settings,
    shutdown: Shutdown,
) {
    let metrics_path: Arc<str> = settings.metrics_path.into();
    let prober = Prober::new(
        settings.csi_address,
        settings.probe_timeout,
        Arc::new(Metrics::new()),
    );
    let metrics_server = metrics_listener.map(|listener| {
        let (prober, path) = (prober.clone(), metrics_path.clone());
        let only_metrics = move |requested: String| {
            let (prober, path) = (prober.clone(), path.clone());
            async move {
                if requested == *path {
                    answer(prober, path, requested).await
                } else {
                    Reply::not_found()
                }
            }
        };
        tokio::spawn(crate::http::serve(listener, only_metrics, shutdown.clone()))
    });
    let handler = move |path: String| answer(prober.clone(), metrics_path.clone(), path);
    // Each server answers the requests in progress before it returns.
    crate::http::serve(listener, handler, shutdown).await;
    if let Some(task) = metrics_server {
        let _ = task.await;
    }
}
