//! Keeps the driver registered: learns the driver's name (waiting and retrying as long as it
//! takes), serves the registration socket, and re-creates it whenever the kubelet must run the
//! registration again — socket deleted or replaced, driver restarted or renamed, or the
//! kubelet reporting a failure (it never retries that by itself).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::Config;
use super::service::{Phase, RegistrationService, Tracker, Verdict, plugin_info};
use crate::BoxError;
use crate::metrics::Metrics;
use crate::proto::csi::identity_client::IdentityClient;
use crate::proto::registration::registration_server::RegistrationServer;
use crate::shutdown::{Shutdown, Trigger};
use crate::socket::{self, SocketError, SocketGuard};

/// How often the sockets are looked at: a deleted registration socket is back within this.
const CHECK_EVERY: Duration = Duration::from_millis(500);
/// Back-off after the kubelet rejects us, and between failed driver calls.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_REJECT_BACKOFF: Duration = Duration::from_secs(300);
const MAX_DRIVER_BACKOFF: Duration = Duration::from_secs(30);
const GET_PLUGIN_INFO: &str = "/csi.v1.Identity/GetPluginInfo";

fn doubled(delay: Duration, max: Duration) -> Duration {
    (delay * 2).min(max)
}

/// Sleeps unless shutdown begins first; returns false on shutdown.
async fn sleep_or_stop(delay: Duration, shutdown: &Shutdown) -> bool {
    tokio::select! {
        () = tokio::time::sleep(delay) => true,
        () = shutdown.clone().wait() => false,
    }
}

/// Asks the driver its name, retrying with back-off until it answers with a valid one.
/// Returns `None` on shutdown or when `--driver-wait-limit` runs out.
async fn learn_driver_name(
    config: &Config,
    metrics: &Metrics,
    shutdown: &Shutdown,
) -> Result<Option<String>, BoxError> {
    let started = Instant::now();
    let give_up = config.driver_wait_limit;
    let over_limit = || give_up.is_some_and(|limit| started.elapsed() >= limit);
    let channel = tokio::select! {
        dialled = socket::dial(&config.csi_address, config.timeout.max(Duration::from_secs(1)), give_up) => dialled?,
        () = shutdown.clone().wait() => return Ok(None),
    };
    let mut client = IdentityClient::new(channel);
    let mut delay = FIRST_BACKOFF;
    loop {
        let asked = Instant::now();
        let request = tonic::Request::new(crate::proto::csi::GetPluginInfoRequest {});
        let reply = tokio::time::timeout(config.timeout, client.get_plugin_info(request))
            .await
            .unwrap_or_else(|_| {
                Err(tonic::Status::deadline_exceeded(format!(
                    "no answer within {:?}",
                    config.timeout
                )))
            });
        let code = reply
            .as_ref()
            .map(|_| tonic::Code::Ok)
            .unwrap_or_else(|s| s.code());
        let name = reply
            .as_ref()
            .map(|r| r.get_ref().name.clone())
            .unwrap_or_default();
        metrics.observe(&name, GET_PLUGIN_INFO, code, asked.elapsed());
        match reply {
            Ok(_) if name.is_empty() => log::warn!(
                "driver at {} returned an empty name",
                config.csi_address.display()
            ),
            Ok(_) => {
                crate::driver_name::validate(&name)?;
                return Ok(Some(name));
            }
            Err(status) => log::warn!(
                "GetPluginInfo on {}: {}: {}; retrying in {delay:?}",
                config.csi_address.display(),
                crate::metrics::go_code_name(status.code()),
                status.message()
            ),
        }
        if over_limit() {
            return Err(format!(
                "driver at {} gave no name within {:?}",
                config.csi_address.display(),
                give_up.unwrap_or_default()
            )
            .into());
        }
        if !sleep_or_stop(delay, shutdown).await {
            return Ok(None);
        }
        delay = doubled(delay, MAX_DRIVER_BACKOFF);
    }
}

/// One generation of the registration socket and the server behind it.
struct Served {
    guard: SocketGuard,
    stop: Trigger,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Served {
    fn start(
        config: &Config,
        path: &Path,
        service: RegistrationService,
    ) -> Result<Self, SocketError> {
        let (listener, guard) = socket::bind_tokio(path, config.socket_perms)?;
        let (stop, stopped) = Shutdown::manual();
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(service))
                .serve_with_incoming_shutdown(incoming, stopped.wait()),
        );
        Ok(Self { guard, stop, task })
    }

    /// Stops serving, then removes the socket if it is still ours.
    async fn stop(self) {
        self.stop.fire();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.task).await;
        drop(self.guard);
    }
}

/// Why the watch over one registration socket ended.
enum Next {
    Shutdown,
    /// Re-create the socket (after the given pause).
    Recreate(Duration),
    /// The driver restarted: ask its name again, then re-create.
    AskDriver,
}

/// The registration socket path for a driver.
pub fn registration_socket(dir: &Path, driver: &str) -> PathBuf {
    dir.join(format!("{driver}-reg.sock"))
}

/// Runs until shutdown: the whole registration life cycle.
pub async fn supervise(
    config: Arc<Config>,
    tracker: Arc<Tracker>,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
) -> Result<(), BoxError> {
    let (verdict_tx, mut verdicts) = mpsc::channel::<Verdict>(8);
    let mut generation = 0u64;
    'driver: loop {
        tracker.set_phase(Phase::WaitingForDriver);
        let Some(driver) = learn_driver_name(&config, &metrics, &shutdown).await? else {
            return Ok(());
        };
        let driver_identity = socket::identity_of(&config.csi_address);
        let path = registration_socket(&config.plugin_registration_path, &driver);
        log::info!(
            "driver {driver} found at {}; registering through {}",
            config.csi_address.display(),
            path.display()
        );
        let mut reject_backoff = FIRST_BACKOFF;
        let mut bind_backoff = FIRST_BACKOFF;
        loop {
            generation += 1;
            let service = RegistrationService {
                info: plugin_info(&driver, &config.kubelet_registration_path),
                generation,
                verdicts: verdict_tx.clone(),
            };
            let served = match Served::start(&config, &path, service) {
                Ok(served) => served,
                // At start-up a non-socket in the way is a configuration error, as upstream
                // treats it; later it is someone's file that we must not touch, so wait it out.
                Err(e @ SocketError::NotASocket { .. }) if generation == 1 => return Err(e.into()),
                Err(e) => {
                    log::error!(
                        "cannot create the registration socket: {e}; retrying in {bind_backoff:?}"
                    );
                    tracker.record_error(&e.to_string());
                    if !sleep_or_stop(bind_backoff, &shutdown).await {
                        return Ok(());
                    }
                    bind_backoff = doubled(bind_backoff, MAX_DRIVER_BACKOFF);
                    continue;
                }
            };
            bind_backoff = FIRST_BACKOFF;
            tracker.socket_created(&driver, &path);
            let next = watch(
                &config,
                &tracker,
                &served,
                generation,
                driver_identity,
                &mut verdicts,
                &mut reject_backoff,
                &shutdown,
            )
            .await;
            served.stop().await;
            match next {
                Next::Shutdown => return Ok(()),
                Next::Recreate(pause) => {
                    if !sleep_or_stop(pause, &shutdown).await {
                        return Ok(());
                    }
                }
                Next::AskDriver => continue 'driver,
            }
        }
    }
}

/// Watches one generation of the registration socket until something calls for a new one.
#[allow(clippy::too_many_arguments)]
async fn watch(
    config: &Config,
    tracker: &Tracker,
    served: &Served,
    generation: u64,
    driver_identity: Option<socket::Identity>,
    verdicts: &mut mpsc::Receiver<Verdict>,
    reject_backoff: &mut Duration,
    shutdown: &Shutdown,
) -> Next {
    let mut driver_gone = false;
    let mut ticker = tokio::time::interval(CHECK_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.clone().wait() => return Next::Shutdown,
            Some(verdict) = verdicts.recv() => {
                if verdict.generation != generation {
                    continue; // about a socket we already replaced
                }
                if verdict.registered {
                    tracker.set_phase(Phase::Registered);
                    *reject_backoff = FIRST_BACKOFF;
                } else {
                    let pause = *reject_backoff;
                    log::warn!("re-creating the registration socket in {pause:?} so the kubelet tries again");
                    tracker.record_error(&verdict.error);
                    tracker.set_phase(Phase::Rejected(verdict.error));
                    *reject_backoff = doubled(pause, MAX_REJECT_BACKOFF);
                    return Next::Recreate(pause);
                }
            }
            _ = ticker.tick() => {
                if !served.guard.is_ours() {
                    log::warn!("registration socket {} was deleted or replaced; re-creating it", served.guard.path().display());
                    return Next::Recreate(Duration::ZERO);
                }
                match socket::identity_of(&config.csi_address) {
                    None if !driver_gone => {
                        log::warn!("driver socket {} is gone; waiting for the driver to come back", config.csi_address.display());
                        driver_gone = true;
                    }
                    Some(now) if driver_gone || Some(now) != driver_identity => {
                        log::info!("driver socket {} was re-created; registering again", config.csi_address.display());
                        return Next::AskDriver;
                    }
                    _ => {}
                }
            }
        }
    }
}
