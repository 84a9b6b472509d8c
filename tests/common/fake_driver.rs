//! A small CSI driver for tests of the sidecars: Identity only, with a name that can change,
//! GetPluginInfo failures on demand, and a Probe answer chosen by the test.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_nodekit::proto::csi::identity_server::{Identity, IdentityServer};
use csi_nodekit::proto::csi::*;
use csi_nodekit::shutdown::{Shutdown, Trigger};
use tonic::{Request, Response, Status};

/// What the fake answers; tests change it while it runs.
#[derive(Debug, Default)]
pub struct Behaviour {
    pub name: Mutex<String>,
    /// GetPluginInfo fails with UNAVAILABLE while this is above zero, counting down.
    pub failures_left: AtomicU32,
    /// Probe's `ready`: None leaves it unset.
    pub ready: Mutex<Option<bool>>,
    /// Probe sleeps this long first (a hanging driver).
    pub probe_delay: Mutex<Duration>,
    pub plugin_info_calls: AtomicU32,
    pub probe_calls: AtomicU32,
}

#[derive(Clone)]
struct FakeIdentity(Arc<Behaviour>);

#[tonic::async_trait]
impl Identity for FakeIdentity {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        self.0.plugin_info_calls.fetch_add(1, Ordering::SeqCst);
        let failing = self
            .0
            .failures_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(Status::unavailable("not ready yet"));
        }
        let name = self.0.name.lock().unwrap().clone();
        Ok(Response::new(GetPluginInfoResponse {
            name,
            vendor_version: "0.0.1".into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(GetPluginCapabilitiesResponse::default()))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        self.0.probe_calls.fetch_add(1, Ordering::SeqCst);
        let delay = *self.0.probe_delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        Ok(Response::new(ProbeResponse {
            ready: *self.0.ready.lock().unwrap(),
        }))
    }
}

/// The fake's Identity service, to be served beside others (a driver with a Node service).
pub fn identity_server(behaviour: Arc<Behaviour>) -> IdentityServer<impl Identity> {
    IdentityServer::new(FakeIdentity(behaviour))
}

/// A running fake driver; dropping it stops the server and removes its socket.
pub struct FakeDriver {
    pub socket: PathBuf,
    pub behaviour: Arc<Behaviour>,
    stop: Option<Trigger>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl FakeDriver {
    /// Starts serving `name` on `socket` (inside a tokio runtime).
    pub fn start(socket: &Path, name: &str) -> Self {
        let behaviour = Arc::new(Behaviour {
            name: Mutex::new(name.into()),
            ..Default::default()
        });
        Self::start_with(socket, behaviour)
    }

    pub fn start_with(socket: &Path, behaviour: Arc<Behaviour>) -> Self {
        let perms = csi_nodekit::socket::Permissions {
            mode: 0o660,
            gid: None,
        };
        let (listener, guard) =
            csi_nodekit::socket::bind_tokio(socket, perms).expect("bind fake driver");
        let (stop, stopped) = Shutdown::manual();
        let service = IdentityServer::new(FakeIdentity(behaviour.clone()));
        let task = tokio::spawn(async move {
            let _guard = guard;
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, stopped.wait())
                .await;
        });
        Self {
            socket: socket.to_owned(),
            behaviour,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops serving and removes the socket, as a dying driver container would.
    pub async fn stop(mut self) -> Arc<Behaviour> {
        self.shutdown().await;
        self.behaviour.clone()
    }

    async fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            stop.fire();
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for FakeDriver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            stop.fire();
        }
    }
}
