//! The plugin manager's memory and its reconciler, as the kubelet has them: the watcher keeps a
//! *desired* state (socket path → identity, a fresh one for every create event), registrations
//! build an *actual* state, and every second the reconciler first deregisters what is no longer
//! desired (socket gone, or re-created under a new identity), then starts registrations for what
//! is desired but not registered. At most one operation runs per socket path, and a failed one
//! blocks the next for the back-off.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use super::backoff::Backoff;
use super::csinode::NodeState;
use super::register;
use super::report::{Event, NodeView, Retry};
use super::validate::Version;

/// How often the kubelet's reconciler runs.
pub const PERIOD: Duration = Duration::from_secs(1);

/// A plugin that passed validation; upstream records it before calling the CSI handler, so a
/// later failure (NodeGetInfo, the API writes) still leaves it here and it is not retried.
#[derive(Debug, Clone)]
pub struct Registered {
    pub identity: u64,
    pub driver: String,
}

/// Per socket path: an operation in flight, or the back-off left by failed ones.
#[derive(Debug, Default)]
struct Operation {
    pending: bool,
    backoff: Backoff,
}

#[derive(Debug, Default)]
pub struct State {
    /// Desired: what the watcher saw created and not yet removed.
    desired: HashMap<PathBuf, u64>,
    /// Actual: validated plugins.
    pub registered: HashMap<PathBuf, Registered>,
    operations: HashMap<PathBuf, Operation>,
    /// The CSI handler's drivers by name, with their highest supported version.
    pub drivers: HashMap<String, Version>,
    pub node: NodeState,
    next_identity: u64,
}

impl State {
    /// A create event: a new identity, even for a path already desired.
    pub fn add_desired(&mut self, socket: &Path) -> u64 {
        self.next_identity += 1;
        self.desired.insert(socket.to_owned(), self.next_identity);
        self.next_identity
    }

    pub fn remove_desired(&mut self, socket: &Path) {
        self.desired.remove(socket);
    }

    /// The CSI handler's `unregisterDriver`: by name, as upstream does.
    pub fn forget_driver(&mut self, driver: &str) {
        self.drivers.remove(driver);
        self.node.uninstall(driver);
    }

    /// What the kubelet would have written so far.
    pub fn view(&self, node_name: &str) -> NodeView {
        NodeView {
            name: node_name.to_owned(),
            annotation: self.node.annotation(),
            labels: self.node.labels().clone(),
            csi_node: self.node.csi_node(node_name),
        }
    }

    /// goroutinemap's `Run`: refused while an operation is in flight or backing off.
    fn try_start(&mut self, socket: &Path, now: Instant) -> bool {
        let operation = self.operations.entry(socket.to_owned()).or_default();
        if operation.pending || !operation.backoff.allows_retry(now) {
            return false;
        }
        operation.pending = true;
        true
    }

    /// Success forgets the path's back-off; failure lengthens it.
    fn finish(&mut self, socket: &Path, ok: bool, now: Instant) {
        if ok {
            self.operations.remove(socket);
        } else if let Some(operation) = self.operations.get_mut(socket) {
            operation.pending = false;
            operation.backoff.record_failure(now);
        }
    }
}

/// Everything the watcher, the reconciler and the registrations share.
#[derive(Debug)]
pub struct Shared {
    pub node_name: String,
    /// Prefix for host paths that plugins give as their endpoint.
    pub host_root: Option<PathBuf>,
    state: Mutex<State>,
}

impl Shared {
    pub fn new(node_name: String, host_root: Option<PathBuf>) -> Self {
        Self {
            node_name,
            host_root,
            state: Mutex::new(State::default()),
        }
    }

    /// Never held across an await; a panic elsewhere leaves the state usable.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn view(&self) -> NodeView {
        self.lock().view(&self.node_name)
    }
}

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
            let result = register::register(&shared, &socket, identity).await;
            let event = {
                let mut state = shared.lock();
                state.finish(&socket, result.is_ok(), Instant::now());
                match result {
                    Ok(registration) => Event::Registered {
                        socket,
                        registration,
                        node: state.view(&shared.node_name),
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
                        }
                    }
                }
            };
            let _ = events.send(event);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_create_gets_a_fresh_identity() {
        let mut state = State::default();
        let a = state.add_desired(Path::new("/r/a.sock"));
        let b = state.add_desired(Path::new("/r/a.sock"));
        assert_ne!(a, b);
        assert_eq!(state.desired.get(Path::new("/r/a.sock")), Some(&b));
    }

    #[test]
    fn operations_on_one_path_are_exclusive_and_back_off_after_failure() {
        let mut state = State::default();
        let path = Path::new("/r/a.sock");
        let t0 = Instant::now();
        assert!(state.try_start(path, t0));
        assert!(!state.try_start(path, t0), "one operation at a time");
        state.finish(path, false, t0);
        assert!(!state.try_start(path, t0 + Duration::from_millis(500)));
        assert!(state.try_start(path, t0 + Duration::from_millis(501)));
        state.finish(path, false, t0 + Duration::from_secs(1));
        assert!(!state.try_start(path, t0 + Duration::from_secs(2)));
        assert!(state.try_start(path, t0 + Duration::from_millis(2_001)));
        state.finish(path, true, t0 + Duration::from_secs(3));
        assert!(
            state.try_start(path, t0 + Duration::from_secs(3)),
            "success resets"
        );
    }
}
