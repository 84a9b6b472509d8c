//! The plugin manager's reconciler, as the kubelet has it: every second it first deregisters
//! what is no longer desired (socket gone, or re-created under a new identity), then starts
//! registrations for what is desired but not registered. At most one operation runs per socket
//! path, and a failed one blocks the next for the back-off (the memory it works on is in
//! [`state`](super::state)).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use super::handshake;
use super::output::{Event, Retry};
use super::state::Shared;

/// How often the kubelet's reconciler runs.
pub const PERIOD: Duration = Duration::from_secs(1);

/// Runs the reconciler every [`PERIOD`] until the future is dropped.
pub async fn run(shared: Arc<Shared>, events: UnboundedSender<Event>) {
    let mut ticks = tokio::time::interval(PERIOD);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        reconcile(&shared, &events);
    }
}

fn reconcile(shared: &Arc<Shared>, events: &UnboundedSender<Event>) {
    let now = Instant::now();
    let mut state = shared.lock();
    let stale: Vec<PathBuf> = state
        .registered
        .iter()
        .filter(|(path, r)| state.desired.get(*path) != Some(&r.identity))
        .map(|(path, _)| path.clone())
        .collect();
    // Upstream's deregistration runs as its own goroutine and is still in flight when the
    // same pass reaches the registrations, so a re-created socket registers one pass later.
    let mut deregistered = HashSet::new();
    for socket in stale {
        if !state.try_start(&socket, now) {
            continue;
        }
        if let Some(plugin) = state.registered.remove(&socket) {
            log::info!("deregistering {} ({})", plugin.driver, socket.display());
            state.forget_driver(&plugin.driver);
            let event = Event::Deregistered {
                socket: socket.clone(),
                driver: plugin.driver,
                node: state.view(&shared.node_name),
            };
            let _ = events.send(event);
        }
        state.finish(&socket, true, now);
        deregistered.insert(socket);
    }
    let mut wanted: Vec<(PathBuf, u64)> = state
        .desired
        .iter()
        .filter(|(path, id)| {
            state.registered.get(*path).map(|r| r.identity) != Some(**id)
                && !deregistered.contains(*path)
        })
        .map(|(path, id)| (path.clone(), *id))
        .collect();
    wanted.sort();
    for (socket, identity) in wanted {
        if !state.try_start(&socket, now) {
            log::trace!("{}: operation in flight or backing off", socket.display());
            continue;
        }
        log::debug!("registering {}", socket.display());
        let (shared, events) = (shared.clone(), events.clone());
        tokio::spawn(async move {
            let mut calls = Vec::new();
            let result = handshake::register(&shared, &socket, identity, &mut calls).await;
            shared.flow.extend(calls.iter().cloned());
            let event = {
                let mut state = shared.lock();
                state.finish(&socket, result.is_ok(), Instant::now());
                match result {
                    Ok(registration) => Event::Registered {
                        socket,
                        registration,
                        node: state.view(&shared.node_name),
                        calls,
                    },
                    Err(failure) => {
                        log::info!("failed {}: {}", socket.display(), failure.reason);
                        let validated = state
                            .registered
                            .get(&socket)
                            .is_some_and(|r| r.identity == identity);
                        let retry = match state.operations.get(&socket) {
                            Some(op) if !validated && state.desired.contains_key(&socket) => {
                                Retry::After(op.backoff.wait)
                            }
                            _ => Retry::Never,
                        };
                        Event::Failed {
                            socket,
                            failure,
                            retry,
                            calls,
                        }
                    }
                }
            };
            let _ = events.send(event);
        });
    }
}
