//! Asking the driver its name: GetPluginInfo on the driver's socket, retried with back-off
//! until it answers with a valid name, which socket file answered noted (a restarted driver
//! binds a new one).

use std::time::{Duration, Instant};

use super::Settings;
use super::steps::{GiveUp, MAX_DRIVER_BACKOFF, sleep_or_stop};
use crate::backoff::Doubling;
use crate::metrics::Metrics;
use crate::proto::csi::identity_client::IdentityClient;
use crate::shutdown::Shutdown;
use crate::socket::{self, Identity};

/// The first pause after a failed GetPluginInfo is short: in a rollout the new node-server
/// answers UNAVAILABLE for the moment it waits for the old one's state directory, and every
/// moment here is one the driver is unregistered. It still doubles to the cap.
const FIRST_DRIVER_BACKOFF: Duration = Duration::from_millis(50);
const GET_PLUGIN_INFO: &str = "/csi.v1.Identity/GetPluginInfo";

/// The driver as last seen: its name, and which socket file answered (a restarted driver binds
/// a new one).
pub(super) struct Driver {
    pub name: String,
    pub socket: Option<Identity>,
}

/// Asks the driver its name, retrying with back-off until it answers with a valid one.
/// Returns `None` on shutdown; an error when `--driver-wait-limit` runs out.
pub(super) async fn learn_driver(
    settings: &Settings,
    metrics: &Metrics,
    shutdown: &Shutdown,
) -> Result<Option<Driver>, GiveUp> {
    let started = Instant::now();
    let give_up = settings.driver_wait_limit;
    let attempt_timeout = settings.timeout.max(Duration::from_secs(1));
    let channel = tokio::select! {
        biased;
        () = shutdown.clone().wait() => return Ok(None),
        dialled = socket::dial(&settings.csi_address, attempt_timeout, give_up) => dialled?,
    };
    let mut client = IdentityClient::new(channel);
    let mut backoff = Doubling::new(FIRST_DRIVER_BACKOFF, MAX_DRIVER_BACKOFF);
    loop {
        let delay = backoff.next_delay();
        // Read before asking: a restart during the call then shows as a change later.
        let socket = socket::identity_of(&settings.csi_address);
        let asked = Instant::now();
        let request = tonic::Request::new(crate::proto::csi::GetPluginInfoRequest {});
        let reply = tokio::time::timeout(settings.timeout, client.get_plugin_info(request))
            .await
            .unwrap_or_else(|_| {
                let message = format!("no answer within {:?}", settings.timeout);
                Err(tonic::Status::deadline_exceeded(message))
            });
        let code = reply
            .as_ref()
            .map_or_else(|s| s.code(), |_| tonic::Code::Ok);
        let name = reply
            .as_ref()
            .map(|r| r.get_ref().name.clone())
            .unwrap_or_default();
        metrics.observe(&name, GET_PLUGIN_INFO, code, asked.elapsed());
        let address = settings.csi_address.display();
        match reply {
            Ok(_) if name.is_empty() => {
                log::warn!("driver at {address} returned an empty name")
            }
            Ok(_) => {
                crate::csi_spec::driver_name::validate(&name)?;
                return Ok(Some(Driver { name, socket }));
            }
            Err(status) => log::warn!(
                "GetPluginInfo on {address}: {}: {}; retrying in {delay:?}",
                crate::gocompat::code_name(status.code()),
                status.message()
            ),
        }
        if give_up.is_some_and(|limit| started.elapsed() >= limit) {
            let limit = give_up.unwrap_or_default();
            return Err(GiveUp::NoName {
                address: settings.csi_address.clone(),
                limit,
            });
        }
        if !sleep_or_stop(delay, shutdown).await {
            return Ok(None);
        }
    }
}
