//! `/healthz` (upstream's semantics), `/readyz` (registered or not, and why) and `/metrics`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::Settings;
use super::service::{Phase, Snapshot, Tracker};
use crate::http::Reply;
use crate::metrics::Metrics;
use crate::proto::registration::{InfoRequest, registration_client::RegistrationClient};

#[derive(Clone)]
pub struct Handler {
    pub settings: Arc<Settings>,
    pub tracker: Arc<Tracker>,
    pub metrics: Arc<Metrics>,
}

impl Handler {
    pub async fn answer(self, path: String) -> Reply {
        match path.as_str() {
            "/healthz" => self.healthz().await,
            "/readyz" => self.readyz(),
            "/metrics" => Reply {
                status: 200,
                content_type: crate::metrics::CONTENT_TYPE,
                body: self.metrics.encode(),
            },
            _ => Reply::not_found(),
        }
    }

    /// Upstream's check while our socket should exist: it must be there and answer GetInfo
    /// with the driver's name. While the registrar is waiting for the driver, backing off after
    /// a rejection, or re-creating its socket, there is no socket to check and the registrar is
    /// working as designed: liveness holds (a restart would only reset the back-off).
    async fn healthz(&self) -> Reply {
        let snapshot = self.tracker.snapshot();
        let (Some(socket), Some(driver), true) = (
            snapshot.socket.as_ref(),
            snapshot.driver.as_ref(),
            snapshot.phase.expects_socket(),
        ) else {
            return Reply::text(200, format!("ok: {}", self.why_not_ready(&snapshot)));
        };
        match std::fs::symlink_metadata(socket) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Reply::text(404, "registration socket does not exist");
            }
            Err(e) => return Reply::text(500, format!("stat {}: {e}", socket.display())),
            Ok(_) => {}
        }
        match self_check(socket, self.settings.timeout).await {
            Ok(name) if name == *driver => Reply::text(200, "ok"),
            Ok(name) => Reply::text(
                500,
                format!("registration socket answers for driver {name:?}, expected {driver:?}"),
            ),
            Err(e) => Reply::text(500, e.to_string()),
        }
    }

    fn readyz(&self) -> Reply {
        let snapshot = self.tracker.snapshot();
        match snapshot.phase {
            Phase::Registered => Reply::text(200, "ok"),
            // The predecessor keeps the driver registered until we take over: the node is
            // served, and a surge rollout waits for this pod to be Ready before it stops the
            // old one (a 503 here would stall the rollout for good).
            Phase::StandingBy => Reply::text(200, format!("ok: {}", self.why_not_ready(&snapshot))),
            _ => Reply::text(503, self.why_not_ready(&snapshot)),
        }
    }

    fn why_not_ready(&self, snapshot: &Snapshot) -> String {
        let driver = snapshot.driver.as_deref().unwrap_or("the driver");
        match &snapshot.phase {
            Phase::Registered => "registered".to_owned(),
            Phase::WaitingForDriver => {
                format!(
                    "waiting for the driver at {}",
                    self.settings.csi_address.display()
                )
            }
            Phase::WaitingForKubelet => format!("waiting for the kubelet to register {driver}"),
            Phase::Rejected(reason) => format!("the kubelet failed to register {driver}: {reason}"),
            Phase::Recreating(reason) => {
                format!("re-creating the registration socket of {driver}: {reason}")
            }
            Phase::StandingBy => format!(
                "standing by: another registrar holds or serves the registration socket of \
                 {driver}; taking over when it is gone"
            ),
        }
    }
}

/// Why our own registration socket failed the check `/healthz` makes.
#[derive(Debug, thiserror::Error)]
enum SelfCheckError {
    #[error(transparent)]
    Dial(#[from] crate::socket::DialError),
    #[error("GetInfo on {}: {}", socket.display(), status.message())]
    Call {
        socket: PathBuf,
        #[source]
        status: tonic::Status,
    },
    #[error("GetInfo on {}: no answer within {timeout:?}", socket.display())]
    TimedOut { socket: PathBuf, timeout: Duration },
}

/// Calls GetInfo on our own registration socket, as the kubelet would.
async fn self_check(socket: &Path, timeout: Duration) -> Result<String, SelfCheckError> {
    let call = async {
        let channel = crate::socket::connect(socket).await?;
        let info = RegistrationClient::new(channel)
            .get_info(InfoRequest {})
            .await
            .map_err(|status| SelfCheckError::Call {
                socket: socket.to_owned(),
                status,
            })?;
        Ok(info.into_inner().name)
    };
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| {
            Err(SelfCheckError::TimedOut {
                socket: socket.to_owned(),
                timeout,
            })
        })
}
