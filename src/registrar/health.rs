//! `/healthz` (upstream's semantics), `/readyz` (registered or not, and why) and `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use super::Config;
use super::service::{Phase, Tracker};
use crate::http::Reply;
use crate::metrics::Metrics;
use crate::proto::registration::{InfoRequest, registration_client::RegistrationClient};

#[derive(Clone)]
pub struct Handler {
    pub config: Arc<Config>,
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

    /// Upstream's check once our socket exists: it must be there and answer GetInfo with the
    /// driver's name. Before the driver has first answered there is no socket to check, and
    /// waiting is the registrar working as designed, so liveness holds.
    async fn healthz(&self) -> Reply {
        let snapshot = self.tracker.snapshot();
        let (Some(socket), Some(driver)) = (snapshot.socket, snapshot.driver) else {
            return Reply::text(
                200,
                format!(
                    "ok: waiting for the driver at {}",
                    self.config.csi_address.display()
                ),
            );
        };
        match std::fs::symlink_metadata(&socket) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Reply::text(404, "registration socket does not exist");
            }
            Err(e) => return Reply::text(500, format!("stat {}: {e}", socket.display())),
            Ok(_) => {}
        }
        match self_check(&socket, self.config.timeout).await {
            Ok(name) if name == driver => Reply::text(200, "ok"),
            Ok(name) => Reply::text(
                500,
                format!("registration socket answers for driver {name:?}, expected {driver:?}"),
            ),
            Err(e) => Reply::text(500, e),
        }
    }

    fn readyz(&self) -> Reply {
        let snapshot = self.tracker.snapshot();
        let driver = snapshot.driver.as_deref().unwrap_or("the driver");
        match snapshot.phase {
            Phase::Registered => Reply::text(200, "ok"),
            Phase::WaitingForDriver => Reply::text(
                503,
                format!(
                    "waiting for the driver at {}",
                    self.config.csi_address.display()
                ),
            ),
            Phase::WaitingForKubelet => {
                Reply::text(503, format!("waiting for the kubelet to register {driver}"))
            }
            Phase::Rejected(reason) => Reply::text(
                503,
                format!("the kubelet failed to register {driver}: {reason}"),
            ),
        }
    }
}

/// Calls GetInfo on our own registration socket, as the kubelet would.
async fn self_check(socket: &std::path::Path, timeout: Duration) -> Result<String, String> {
    let call = async {
        let channel = crate::socket::connect(socket)
            .await
            .map_err(|e| format!("connect to {}: {e}", socket.display()))?;
        let info = RegistrationClient::new(channel)
            .get_info(InfoRequest {})
            .await
            .map_err(|s| format!("GetInfo on {}: {}", socket.display(), s.message()))?;
        Ok(info.into_inner().name)
    };
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "GetInfo on {}: no answer within {timeout:?}",
                socket.display()
            ))
        })
}
