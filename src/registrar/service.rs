//! The kubelet-facing side: the `pluginregistration.Registration` service on
//! `<driver>-reg.sock`, and the registration status it feeds (`/readyz`, `/metrics`).

use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::mpsc::UnboundedSender;
use tonic::{Request, Response, Status};

use crate::proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
    registration_server::Registration,
};

/// Where registration stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    WaitingForDriver,
    /// Our socket is up; the kubelet has not reported yet.
    WaitingForKubelet,
    Registered,
    /// The kubelet said no, with this reason; the socket is re-created after a back-off.
    Rejected(String),
    /// Our socket is gone (deleted, replaced, or could not be created), for this reason; a new
    /// one is on its way.
    Recreating(String),
    /// Another registrar holds the claim on our registration socket, or another process
    /// serves it — the previous registrar during a surge rollout, which keeps the driver
    /// registered — and we take over once it is gone.
    StandingBy,
}

impl Phase {
    /// Metric label values, in the order of [`Phase::index`].
    const LABELS: [&'static str; 6] = [
        "waiting_for_driver",
        "waiting_for_kubelet",
        "registered",
        "rejected",
        "recreating",
        "standing_by",
    ];

    fn index(&self) -> usize {
        match self {
            Self::WaitingForDriver => 0,
            Self::WaitingForKubelet => 1,
            Self::Registered => 2,
            Self::Rejected(_) => 3,
            Self::Recreating(_) => 4,
            Self::StandingBy => 5,
        }
    }

    /// True while our registration socket should be at its path, answering GetInfo.
    pub fn expects_socket(&self) -> bool {
        matches!(self, Self::WaitingForKubelet | Self::Registered)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabel {
    error: String,
}

/// The registrar's status, shared by the supervisor, the gRPC service and the HTTP handlers.
#[derive(Debug)]
pub struct Tracker {
    inner: Mutex<Snapshot>,
    state: Family<StateLabel, Gauge>,
    attempts: Counter,
    last_error: Family<ErrorLabel, Gauge>,
}

/// A consistent copy of the status.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub phase: Phase,
    /// The driver name once GetPluginInfo answered.
    pub driver: Option<String>,
    /// The registration socket once it was first created.
    pub socket: Option<std::path::PathBuf>,
}

impl Tracker {
    /// Creates the tracker and registers its metrics.
    pub fn new(metrics: &mut crate::metrics::Metrics) -> Arc<Self> {
        let tracker = Self {
            inner: Mutex::new(Snapshot {
                phase: Phase::WaitingForDriver,
                driver: None,
                socket: None,
            }),
            state: Family::default(),
            attempts: Counter::default(),
            last_error: Family::default(),
        };
        metrics.register(
            "csi_nodekit_registrar_state",
            "Registration state (1 for the current one)",
            tracker.state.clone(),
        );
        metrics.register(
            "csi_nodekit_registrar_registration_attempts",
            "Registration sockets created for the kubelet",
            tracker.attempts.clone(),
        );
        metrics.register(
            "csi_nodekit_registrar_last_error",
            "The last registration error (1, the error as label)",
            tracker.last_error.clone(),
        );
        tracker.publish(&Phase::WaitingForDriver);
        Arc::new(tracker)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Snapshot> {
        crate::mutex::lock(&self.inner)
    }

    pub fn snapshot(&self) -> Snapshot {
        self.lock().clone()
    }

    fn publish(&self, phase: &Phase) {
        for (index, label) in Phase::LABELS.into_iter().enumerate() {
            let value = i64::from(index == phase.index());
            self.state
                .get_or_create(&StateLabel {
                    state: label.to_owned(),
                })
                .set(value);
        }
    }

    pub fn set_phase(&self, phase: Phase) {
        self.publish(&phase);
        self.lock().phase = phase;
    }

    /// A fresh registration socket is up for `driver` at `socket`.
    pub fn socket_created(&self, driver: &str, socket: &std::path::Path) {
        self.attempts.inc();
        self.publish(&Phase::WaitingForKubelet);
        let mut inner = self.lock();
        inner.phase = Phase::WaitingForKubelet;
        inner.driver = Some(driver.to_owned());
        inner.socket = Some(socket.to_owned());
    }

    pub fn record_error(&self, error: &str) {
        self.last_error.clear();
        self.last_error
            .get_or_create(&ErrorLabel {
                error: error.to_owned(),
            })
            .set(1);
    }
}

/// What the kubelet told one generation of our socket.
#[derive(Debug)]
pub struct Verdict {
    pub generation: u64,
    pub registered: bool,
    pub error: String,
}

/// The Registration service for one generation of the registration socket.
#[derive(Debug, Clone)]
pub struct RegistrationService {
    pub info: PluginInfo,
    pub generation: u64,
    pub verdicts: UnboundedSender<Verdict>,
}

/// What we tell the kubelet about a CSI driver.
pub fn plugin_info(driver: &str, endpoint: &str) -> PluginInfo {
    PluginInfo {
        r#type: "CSIPlugin".to_owned(),
        name: driver.to_owned(),
        endpoint: endpoint.to_owned(),
        supported_versions: vec!["1.0.0".to_owned()],
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        log::trace!("GetInfo: answering {:?}", self.info);
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            log::info!("the kubelet registered driver {}", self.info.name);
        } else {
            log::error!(
                "the kubelet failed to register driver {}: {}",
                self.info.name,
                status.error
            );
        }
        let verdict = Verdict {
            generation: self.generation,
            registered: status.plugin_registered,
            error: status.error,
        };
        // The supervisor may have moved on to a newer socket; it ignores old generations.
        let _ = self.verdicts.send(verdict);
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
