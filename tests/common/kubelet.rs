//! The kubelet emulator run in process for tests: start it on a registry, read its events.

use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_nodekit::probe::kubelet::{Config, Event, Failure, NodeView, Registration, Retry, watch};
use csi_nodekit::shutdown::{Shutdown, Trigger};
use tokio::sync::mpsc;

/// A running emulator and the events it reports.
pub struct Kubelet {
    events: mpsc::UnboundedReceiver<Event>,
    _stop: Trigger,
}

impl Kubelet {
    pub fn start(registry: &Path, host_root: Option<&Path>) -> Self {
        let config = Config {
            registry: registry.to_owned(),
            host_root: host_root.map(Path::to_owned),
            node_name: "node-a".into(),
        };
        let (sender, events) = mpsc::unbounded_channel();
        let (stop, shutdown) = Shutdown::manual();
        tokio::spawn(async move {
            if let Err(e) = watch(config, sender, shutdown).await {
                panic!("the emulator stopped: {e}");
            }
        });
        Self {
            events,
            _stop: stop,
        }
    }

    pub async fn next(&mut self) -> Event {
        match tokio::time::timeout(Duration::from_secs(10), self.events.recv()).await {
            Ok(Some(event)) => event,
            other => panic!("no event within 10 s: {other:?}"),
        }
    }

    pub async fn assert_quiet_for(&mut self, period: Duration) {
        if let Ok(event) = tokio::time::timeout(period, self.events.recv()).await {
            panic!("expected no event, got {event:?}");
        }
    }
}

pub fn registered(event: Event) -> (PathBuf, Registration, NodeView) {
    match event {
        Event::Registered {
            socket,
            registration,
            node,
            ..
        } => (socket, registration, node),
        other => panic!("expected a registration, got {other:?}"),
    }
}

pub fn failed(event: Event) -> (PathBuf, Failure, Retry) {
    match event {
        Event::Failed {
            socket,
            failure,
            retry,
            ..
        } => (socket, failure, retry),
        other => panic!("expected a failure, got {other:?}"),
    }
}

/// A temp dir holding `registry/` and a driver socket outside it.
pub struct Dirs {
    _dir: tempfile::TempDir,
    pub registry: PathBuf,
    pub root: PathBuf,
}

pub fn dirs() -> Dirs {
    let dir = tempfile::tempdir().unwrap();
    Dirs {
        registry: dir.path().join("registry"),
        root: dir.path().to_owned(),
        _dir: dir,
    }
}

/// Long enough for any one step; tests finish far sooner.
pub const WAIT: Duration = Duration::from_secs(10);
