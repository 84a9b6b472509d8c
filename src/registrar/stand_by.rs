//! Waiting for the registration socket to be ours: taking the claim on it, standing by while
//! another registrar holds the claim, and standing by while a process that takes no claim (an
//! older registrar, or upstream's) still serves the socket.

use std::path::Path;
use std::time::Instant;

use super::ask_driver::Driver;
use super::service::{Phase, Tracker};
use super::steps::{FIRST_BACKOFF, MAX_DRIVER_BACKOFF, Next, sleep_or_stop};
use crate::backoff::Doubling;
use crate::shutdown::Shutdown;
use crate::socket::{self, Claim};

/// Takes the claim on the registration socket `path` (see [`socket::claim`]), standing by
/// while another registrar holds it: in a surge rollout the previous one, which keeps the
/// driver registered until its pod stops; with an operator's extra copy, whichever came
/// first. The kernel wakes us the moment the holder exits, however it exits. `None` on
/// shutdown; `Some(None)` where the filesystem takes no locks (we then go on without, as
/// before claims: the live-socket check alone keeps us off a served socket).
pub(super) async fn take_claim(
    path: &Path,
    driver: &Driver,
    tracker: &Tracker,
    shutdown: &Shutdown,
) -> Option<Option<Claim>> {
    let mut backoff = Doubling::new(FIRST_BACKOFF, MAX_DRIVER_BACKOFF);
    loop {
        let held = match Claim::try_take(path) {
            Ok(Ok(claim)) => return Some(Some(claim)),
            Ok(Err(held)) => held,
            Err(e) if socket::claim::unsupported(&e) => {
                log::warn!("{e}: serving the registration socket without a claim on it");
                return Some(None);
            }
            Err(e) => {
                let pause = backoff.next_delay();
                log::error!("cannot claim the registration socket: {e}; retrying in {pause:?}");
                tracker.record_error(&e.to_string());
                tracker.set_phase(Phase::Recreating(e.to_string()));
                if !sleep_or_stop(pause, shutdown).await {
                    return None;
                }
                continue;
            }
        };
        log::info!(
            "registration socket {} of driver {} is held by another registrar ({}); \
             standing by until it exits",
            path.display(),
            driver.name,
            held.holder
        );
        tracker.set_phase(Phase::StandingBy);
        let since = Instant::now();
        let waiting = match Claim::wait_on_thread(path) {
            Ok(waiting) => waiting,
            Err(e) => {
                log::error!("cannot start waiting for the registration socket: {e}");
                if !sleep_or_stop(backoff.next_delay(), shutdown).await {
                    return None;
                }
                continue;
            }
        };
        let taken = tokio::select! {
            biased;
            () = shutdown.clone().wait() => return None,
            taken = waiting => taken,
        };
        match taken {
            Ok(Ok(claim)) => {
                log::info!(
                    "took over registration socket {} after standing by {} ms",
                    path.display(),
                    since.elapsed().as_millis()
                );
                return Some(Some(claim));
            }
            Ok(Err(e)) => log::error!("waiting for the registration socket: {e}"),
            Err(_) => log::error!("the registration socket's lock waiter is gone"),
        }
        if !sleep_or_stop(backoff.next_delay(), shutdown).await {
            return None;
        }
    }
}

/// Waits, holding the claim, while a process that takes no claim serves our registration
/// socket: a previous registrar of an older version, or upstream's, in a surge rollout. Its
/// exit removes the socket, or (SIGKILL) ends the connection we hold to it; either wakes us at
/// once (no back-off: every
/// moment between its exit and our socket is a moment the driver is unregistered).
/// `None`: the path is free, bind now. If the driver socket changed meanwhile (the new
/// node-server took over from the old one), the driver is asked again first, so that the
/// kubelet's NodeGetInfo finds a driver behind the endpoint.
pub(super) async fn stand_by(
    path: &Path,
    driver: &Driver,
    csi_address: &Path,
    tracker: &Tracker,
    shutdown: &Shutdown,
) -> Option<Next> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let mut watch = socket::DirWatch::new(dir);
    if socket::is_served(path) {
        log::info!(
            "registration socket {} is served by another process (the previous registrar \
             in a rolling update?); standing by until it is gone",
            path.display()
        );
        tracker.set_phase(Phase::StandingBy);
    }
    while socket::is_served(path) {
        tokio::select! {
            biased;
            () = shutdown.clone().wait() => return Some(Next::Shutdown),
            () = watch.changed() => {}
            // A holder killed with its socket left behind changes no entry: its listener
            // closing ends the connection held to it.
            () = socket::until_unserved(path) => {}
        }
    }
    log::info!(
        "registration socket {} is free; taking over",
        path.display()
    );
    if socket::identity_of(csi_address) != driver.socket {
        return Some(Next::AskDriver);
    }
    None
}
