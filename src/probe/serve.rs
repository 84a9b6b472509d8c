//! `probe serve`: a drop-in livenessprobe. It listens at once (answering 500 while the driver
//! is absent instead of refusing connections), keeps one connection to the driver, lets
//! simultaneous probes share one in-flight Probe call, and never exits because the driver is
//! down.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use argh::{ArgsInfo, FromArgs};
use tokio::sync::{Mutex, watch};
use tokio::time::Instant;

use super::check::{self, ProbeError};
use crate::gocompat::GoDuration;
use crate::http::Reply;
use crate::metrics::Metrics;
use crate::runtime::Threads;
use crate::shutdown::Shutdown;
use crate::{BoxError, UsageError, socket};

crate::mode_args! {
    #[derive(FromArgs, ArgsInfo, Debug)]
    #[argh(subcommand, name = "serve")]
    /// Serve /healthz by calling the driver's Probe (drop-in livenessprobe).
    pub struct Args {
        /// address of the CSI driver socket
        #[argh(option, default = "String::from(\"/run/csi/socket\")")]
        pub csi_address: String,
        /// deadline for connecting and calling Probe (Go duration)
        #[argh(option, default = "GoDuration(Duration::from_secs(3))")]
        pub probe_timeout: GoDuration,
        /// deprecated: TCP port for /healthz on 0.0.0.0 (use --http-endpoint)
        #[argh(option, default = "String::from(\"9808\")")]
        pub health_port: String,
        /// address to listen on for /healthz and /metrics, e.g. :9808
        #[argh(option, default = "String::new()")]
        pub http_endpoint: String,
        /// deprecated: a separate address for metrics
        #[argh(option, default = "String::new()")]
        pub metrics_address: String,
        /// path of the metrics page
        #[argh(option, default = "String::from(\"/metrics\")")]
        pub metrics_path: String,
    }
}

type Outcome = Option<Result<(), Arc<ProbeError>>>;

/// The driver connection and the probe in flight, shared by every HTTP request.
pub struct Prober {
    address: std::path::PathBuf,
    timeout: Duration,
    metrics: Arc<Metrics>,
    channel: Mutex<Option<tonic::transport::Channel>>,
    driver: std::sync::Mutex<String>,
    /// A GetPluginInfo for the name is under way.
    learning: AtomicBool,
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
            learning: AtomicBool::new(false),
            in_flight: std::sync::Mutex::new(None),
        })
    }

    /// The one connection, dialled on first use (tonic re-dials it after failures).
    async fn channel(&self, deadline: Instant) -> Result<tonic::transport::Channel, ProbeError> {
        let mut slot = self.channel.lock().await;
        if let Some(channel) = slot.as_ref() {
            return Ok(channel.clone());
        }
        let channel = check::connect(&self.address, deadline, self.timeout).await?;
        *slot = Some(channel.clone());
        Ok(channel)
    }

    /// Learns the driver's name for the metrics label (upstream asks once at start) in the
    /// background, so that no probe waits for it, and asks again while it is unknown.
    fn learn_driver_name(self: &Arc<Self>, channel: tonic::transport::Channel) {
        let known = !self
            .driver
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty();
        if known || self.learning.swap(true, Ordering::SeqCst) {
            return;
        }
        let prober = self.clone();
        tokio::spawn(async move {
            let mut client = crate::proto::csi::identity_client::IdentityClient::new(channel);
            let request = crate::proto::csi::GetPluginInfoRequest {};
            let asked = tokio::time::timeout(prober.timeout, client.get_plugin_info(request));
            if let Ok(Ok(info)) = asked.await {
                let name = info.into_inner().name;
                log::info!("probing CSI driver {name} at {}", prober.address.display());
                *prober.driver.lock().unwrap_or_else(|p| p.into_inner()) = name;
            }
            prober.learning.store(false, Ordering::SeqCst);
        });
    }

    /// One probe under one deadline for connecting and calling Probe, as upstream.
    async fn probe_now(self: &Arc<Self>) -> Result<(), ProbeError> {
        let deadline = Instant::now() + self.timeout;
        let channel = self.channel(deadline).await?;
        self.learn_driver_name(channel.clone());
        let driver = self
            .driver
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let left = deadline.saturating_duration_since(Instant::now());
        check::probe(channel, left, &driver, Some(&self.metrics)).await
    }

    /// Probes the driver; callers arriving while a probe runs share its result.
    pub async fn probe(self: &Arc<Self>) -> Result<(), Arc<ProbeError>> {
        let mut receiver = {
            let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            match in_flight.as_ref() {
                Some(receiver) => receiver.clone(),
                None => {
                    let (sender, receiver) = watch::channel(None);
                    *in_flight = Some(receiver.clone());
                    let prober = self.clone();
                    tokio::spawn(async move {
                        let outcome = prober.probe_now().await.map_err(Arc::new);
                        *prober.in_flight.lock().unwrap_or_else(|p| p.into_inner()) = None;
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

/// The command line, validated.
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
    pub fn from_args(args: Args) -> Result<Self, BoxError> {
        let http_endpoint = match args.http_endpoint.as_str() {
            "" => format!("0.0.0.0:{}", args.health_port),
            given => given.to_owned(),
        };
        Ok(Self {
            csi_address: socket::parse_address(&args.csi_address).map_err(UsageError::new)?,
            probe_timeout: args.probe_timeout.0,
            http_endpoint,
            metrics_address: Some(args.metrics_address).filter(|a| !a.is_empty()),
            metrics_path: args.metrics_path,
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
    if let Some(listener) = metrics_listener {
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
        tokio::spawn(crate::http::serve(listener, only_metrics, shutdown.clone()));
    }
    let handler = move |path: String| answer(prober.clone(), metrics_path.clone(), path);
    crate::http::serve(listener, handler, shutdown).await;
}
