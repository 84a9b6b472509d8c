//! The plugin manager's memory, as the kubelet has it: the *desired* state the watcher keeps
//! (socket path → identity, a fresh one for every create event), the *actual* state that
//! registrations build, the operations in flight and their back-off, and what the kubelet has
//! written about the node. The watcher, the reconciler and each registration share it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use super::csi_versions::Version;
use super::csinode::NodeState;
use super::output::NodeView;
use super::per_socket_backoff::Backoff;
use crate::flow::{Outcome, Party, Recorder, Stamp};

/// A plugin that passed validation; upstream records it before calling the CSI handler, so a
/// later failure (NodeGetInfo, the API writes) still leaves it here and it is not retried.
#[derive(Debug, Clone)]
pub struct Registered {
    pub identity: u64,
    pub driver: String,
}

/// Per socket path: an operation in flight, or the back-off left by failed ones.
#[derive(Debug, Default)]
pub(super) struct Operation {
    pending: bool,
    pub(super) backoff: Backoff,
}

#[derive(Debug, Default)]
pub struct State {
    /// Desired: what the watcher saw created and not yet removed.
    pub(super) desired: HashMap<PathBuf, u64>,
    /// Actual: validated plugins.
    pub registered: HashMap<PathBuf, Registered>,
    pub(super) operations: HashMap<PathBuf, Operation>,
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
    pub(super) fn try_start(&mut self, socket: &Path, now: Instant) -> bool {
        let operation = self.operations.entry(socket.to_owned()).or_default();
        if operation.pending || !operation.backoff.allows_retry(now) {
            return false;
        }
        operation.pending = true;
        true
    }

    /// Success forgets the path's back-off; failure lengthens it.
    pub(super) fn finish(&mut self, socket: &Path, ok: bool, now: Instant) {
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
    /// Every call and socket event, for `--flow`; off unless asked for.
    pub flow: Recorder,
    state: Mutex<State>,
}

impl Shared {
    pub fn new(node_name: String, host_root: Option<PathBuf>) -> Self {
        Self {
            node_name,
            host_root,
            flow: Recorder::off(),
            state: Mutex::new(State::default()),
        }
    }

    /// The same, drawing its flow into `flow`.
    pub fn drawn(self, flow: Recorder) -> Self {
        Self { flow, ..self }
    }

    /// A registration socket appeared (a create event, or found by the walk at start): the
    /// registrar's step 2 as the kubelet sees it.
    pub fn socket_found(&self, socket: &Path) -> u64 {
        let at = socket.display().to_string();
        let name = socket
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        self.flow.record(
            Stamp::now()
                .arrow(
                    2,
                    Party::Registrar,
                    Party::Registrar,
                    &format!("{name} appeared"),
                    format!("seen by the kubelet's watcher: {at}"),
                    Outcome::Ok,
                )
                .in_group(at),
        );
        self.lock().add_desired(socket)
    }

    /// Never held across an await; a panic elsewhere leaves the state usable.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        crate::mutex::lock(&self.state)
    }

    pub fn view(&self) -> NodeView {
        self.lock().view(&self.node_name)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
