//! Keeps the driver registered: learns the driver's name (`ask_driver`, waiting and retrying as
//! long as it takes), waits for the registration socket to be ours (`stand_by`), serves it,
//! and re-creates it whenever the kubelet must run the registration again — socket deleted or
//! replaced, driver restarted or renamed, or the kubelet reporting a failure (it never retries
//! that by itself).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::Settings;
use super::ask_driver::{Driver, learn_driver};
use super::service::{Phase, RegistrationService, Tracker, Verdict, plugin_info};
use super::stand_by::{stand_by, take_claim};
use super::steps::{FIRST_BACKOFF, GiveUp, MAX_DRIVER_BACKOFF, Next, sleep_or_stop};
use crate::backoff::Doubling;
use crate::metrics::Metrics;
use crate::proto::registration::registration_server::RegistrationServer;
use crate::shutdown::{Shutdown, Trigger};
use crate::socket::{self, Claim, SocketError, SocketGuard};

/// How often the sockets are looked at while ours is up: a deleted registration socket is back
/// within this. Two `lstat`s every half second cost nothing and, unlike inotify, see through
/// every kind of host path mount. (Taking over from a predecessor is woken by inotify, with a
/// poll behind it: see `stand_by`.)
const CHECK_EVERY: Duration = Duration::from_millis(500);
const MAX_REJECT_BACKOFF: Duration = Duration::from_secs(300);
/// How long a stopping registration server may take to finish its calls.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// One generation of the registration socket and the server behind it.
struct Served {
    guard: SocketGuard,
    stop: Trigger,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Served {
    fn start(
        settings: &Settings,
        path: &Path,
        service: RegistrationService,
    ) -> Result<Self, SocketError> {
        let (listener, guard) = socket::bind_tokio(path, settings.socket_perms)?;
        let (stop, stopped) = Shutdown::manual();
        let incoming = socket::grpc_incoming(listener);
        let task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(service))
                .serve_with_incoming_shutdown(incoming, stopped.wait()),
        );
        Ok(Self { guard, stop, task })
    }

    /// Removes the socket first (if it is still ours), so nobody dials a server that no longer
    /// accepts, and tells the server to stop; [`Draining::finish`] lets it finish its calls.
    fn withdraw(self) -> Draining {
        drop(self.guard);
        self.stop.fire();
        Draining(self.task)
    }
}

/// A registration server told to stop, finishing the calls in flight.
struct Draining(tokio::task::JoinHandle<Result<(), tonic::transport::Error>>);

impl Draining {
    /// Waits for the calls in flight for a moment, then drops them.
    async fn finish(self) {
        let abort = self.0.abort_handle();
        if tokio::time::timeout(STOP_GRACE, self.0).await.is_err() {
            abort.abort();
        }
    }
}

/// The registration life cycle and its state.
pub struct Supervisor {
    settings: Arc<Settings>,
    tracker: Arc<Tracker>,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
    verdict_tx: UnboundedSender<Verdict>,
    verdicts: UnboundedReceiver<Verdict>,
    generation: u64,
    /// Whether a registration socket was ever created: before that, a non-socket in its place
    /// is a configuration error (as upstream treats it); after, it is someone's file that we
    /// must not touch, so we wait it out.
    served_once: bool,
    /// The registration socket we serve (or are about to) and our claim on it: only its holder
    /// looks at, unlinks or binds the path. No claim where the filesystem takes no locks.
    claim: Option<(PathBuf, Option<Claim>)>,
}

impl Supervisor {
    pub fn new(
        settings: Arc<Settings>,
        tracker: Arc<Tracker>,
        metrics: Arc<Metrics>,
        shutdown: Shutdown,
    ) -> Self {
        let (verdict_tx, verdicts) = unbounded_channel();
        Self {
            settings,
            tracker,
            metrics,
            shutdown,
            verdict_tx,
            verdicts,
            generation: 0,
            served_once: false,
            claim: None,
        }
    }

    /// Runs until shutdown.
    pub async fn run(mut self) -> Result<(), GiveUp> {
        loop {
            self.tracker.set_phase(Phase::WaitingForDriver);
            let Some(driver) = learn_driver(&self.settings, &self.metrics, &self.shutdown).await?
            else {
                return Ok(());
            };
            let path = crate::plugin_registry::socket_path(
                &self.settings.plugin_registration_path,
                &driver.name,
            );
            if path.as_os_str().len() > socket::MAX_PATH_BYTES {
                return Err(GiveUp::SocketPathTooLong {
                    dir: self.settings.plugin_registration_path.clone(),
                    driver: driver.name.clone(),
                    path,
                });
            }
            if self.claim.as_ref().map(|(claimed, _)| claimed) != Some(&path) {
                self.claim = None; // a renamed driver's old path is free for others
                let Some(claim) = take_claim(&path, &driver, &self.tracker, &self.shutdown).await
                else {
                    return Ok(());
                };
                self.claim = Some((path.clone(), claim));
                // The driver restarted while we waited (a rollout of both): ask it again
                // before the kubelet is sent to it, keeping the claim.
                if socket::identity_of(&self.settings.csi_address) != driver.socket {
                    continue;
                }
            }
            match self.keep_registered(&driver, &path).await? {
                Next::AskDriver => continue,
                Next::Shutdown | Next::Recreate(_) => return Ok(()),
            }
        }
    }

    /// Serves registration sockets for `driver` at `path` (holding its claim), one generation
    /// after another, until shutdown or until the driver restarts.
    async fn keep_registered(&mut self, driver: &Driver, path: &Path) -> Result<Next, GiveUp> {
        log::info!(
            "driver {} found at {}; registering through {}",
            driver.name,
            self.settings.csi_address.display(),
            path.display()
        );
        let mut reject_backoff = Doubling::new(FIRST_BACKOFF, MAX_REJECT_BACKOFF);
        let mut bind_backoff = Doubling::new(FIRST_BACKOFF, MAX_DRIVER_BACKOFF);
        loop {
            if self.shutdown.is_started() {
                return Ok(Next::Shutdown);
            }
            self.generation += 1;
            let service = RegistrationService {
                info: plugin_info(&driver.name, &self.settings.kubelet_registration_path),
                generation: self.generation,
                verdicts: self.verdict_tx.clone(),
            };
            let served = match Served::start(&self.settings, path, service) {
                Ok(served) => served,
                Err(e @ SocketError::NotASocket { .. }) if !self.served_once => {
                    return Err(e.into());
                }
                Err(SocketError::InUse(_)) => {
                    let address = &self.settings.csi_address;
                    match stand_by(path, driver, address, &self.tracker, &self.shutdown).await {
                        Some(next) => return Ok(next),
                        None => continue,
                    }
                }
                Err(e) => {
                    let pause = bind_backoff.next_delay();
                    log::error!(
                        "cannot create the registration socket: {e}; retrying in {pause:?}"
                    );
                    self.tracker.record_error(&e.to_string());
                    self.tracker.set_phase(Phase::Recreating(e.to_string()));
                    if !sleep_or_stop(pause, &self.shutdown).await {
                        return Ok(Next::Shutdown);
                    }
                    continue;
                }
            };
            self.served_once = true;
            bind_backoff.reset();
            self.tracker.socket_created(&driver.name, path);
            let next = self.watch(&served, driver, &mut reject_backoff).await;
            let draining = served.withdraw();
            if matches!(next, Next::Shutdown) {
                // Our socket is gone: the next registrar may bind at once, while our calls in
                // flight finish on the unlinked one.
                self.claim = None;
            }
            draining.finish().await;
            match next {
                Next::Recreate(pause) if sleep_or_stop(pause, &self.shutdown).await => {}
                Next::Recreate(_) => return Ok(Next::Shutdown),
                other => return Ok(other),
            }
        }
    }

    /// Watches one generation of the registration socket until something calls for a new one.
    async fn watch(
        &mut self,
        served: &Served,
        driver: &Driver,
        reject_backoff: &mut Doubling,
    ) -> Next {
        let address = &self.settings.csi_address;
        let mut driver_gone = false;
        let mut ticker = tokio::time::interval(CHECK_EVERY);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = self.shutdown.clone().wait() => return Next::Shutdown,
                Some(verdict) = self.verdicts.recv() => {
                    if verdict.generation != self.generation {
                        continue; // about a socket we already replaced
                    }
                    if verdict.registered {
                        self.tracker.set_phase(Phase::Registered);
                        reject_backoff.reset();
                        continue;
                    }
                    let pause = reject_backoff.next_delay();
                    log::warn!("re-creating the registration socket in {pause:?} so the kubelet tries again");
                    self.tracker.record_error(&verdict.error);
                    self.tracker.set_phase(Phase::Rejected(verdict.error));
                    return Next::Recreate(pause);
                }
                _ = ticker.tick() => {
                    if !served.guard.is_ours() {
                        let why = "the socket was deleted or replaced";
                        log::warn!("registration socket {}: {why}; re-creating it", served.guard.path().display());
                        self.tracker.set_phase(Phase::Recreating(why.to_owned()));
                        return Next::Recreate(Duration::ZERO);
                    }
                    match socket::identity_of(address) {
                        None if !driver_gone => {
                            log::warn!("driver socket {} is gone; waiting for the driver to come back", address.display());
                            driver_gone = true;
                        }
                        Some(now) if driver_gone || Some(now) != driver.socket => {
                            log::info!("driver socket {} was re-created; registering again", address.display());
                            return Next::AskDriver;
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}
