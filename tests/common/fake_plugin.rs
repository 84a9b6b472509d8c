//! Test servers for the kubelet's side of registration: a plugin's registration socket
//! (`pluginregistration.Registration`) that answers GetInfo as the test says and records what
//! the kubelet notifies, and a CSI Node service whose NodeGetInfo answer the test chooses.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::eventually;

use csi_nodekit::proto::csi::node_server::{Node, NodeServer};
use csi_nodekit::proto::csi::*;
use csi_nodekit::proto::registration::registration_server::{Registration, RegistrationServer};
use csi_nodekit::proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use csi_nodekit::shutdown::{Shutdown, Trigger};
use tonic::service::Routes;
use tonic::{Request, Response, Status};

/// What upstream's registrar answers for a CSI driver.
pub fn csi_plugin(name: &str, endpoint: &str) -> PluginInfo {
    PluginInfo {
        r#type: "CSIPlugin".into(),
        name: name.into(),
        endpoint: endpoint.into(),
        supported_versions: vec!["1.0.0".into()],
    }
}

/// What the fake registration service answers, and what it was told.
#[derive(Debug, Default)]
pub struct Registrar {
    pub info: Mutex<PluginInfo>,
    /// GetInfo sleeps this long first (a plugin that hangs).
    pub get_info_delay: Mutex<Duration>,
    /// When each GetInfo arrived.
    pub get_info_calls: Mutex<Vec<Instant>>,
    pub statuses: Mutex<Vec<RegistrationStatus>>,
}

impl Registrar {
    pub fn get_info_count(&self) -> usize {
        self.get_info_calls.lock().unwrap().len()
    }

    /// The first `count` statuses, once that many arrived within `limit`.
    pub async fn statuses(&self, count: usize, limit: Duration) -> Vec<RegistrationStatus> {
        eventually(limit, || {
            let statuses = self.statuses.lock().unwrap();
            (statuses.len() >= count).then(|| statuses[..count].to_vec())
        })
        .await
        .unwrap_or_else(|| panic!("fewer than {count} NotifyRegistrationStatus calls in {limit:?}"))
    }
}

#[derive(Clone)]
struct RegistrationService(Arc<Registrar>);

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        self.0.get_info_calls.lock().unwrap().push(Instant::now());
        let delay = *self.0.get_info_delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        Ok(Response::new(self.0.info.lock().unwrap().clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        self.0.statuses.lock().unwrap().push(request.into_inner());
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// The NodeGetInfo answer: a response, or an error status.
#[derive(Debug, Default)]
pub struct NodeAnswer {
    pub response: Mutex<NodeGetInfoResponse>,
    pub error: Mutex<Option<Status>>,
    pub calls: Mutex<u32>,
}

impl NodeAnswer {
    pub fn new(node_id: &str, max_volumes: i64, topology: &[(&str, &str)]) -> Arc<Self> {
        let segments = topology
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let answer = Self::default();
        *answer.response.lock().unwrap() = NodeGetInfoResponse {
            node_id: node_id.into(),
            max_volumes_per_node: max_volumes,
            accessible_topology: (!topology.is_empty()).then_some(Topology { segments }),
        };
        Arc::new(answer)
    }
}

#[derive(Clone)]
struct NodeService(Arc<NodeAnswer>);

fn unused<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("the fake serves NodeGetInfo only"))
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        _: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        unused()
    }
    async fn node_unstage_volume(
        &self,
        _: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        unused()
    }
    async fn node_publish_volume(
        &self,
        _: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        unused()
    }
    async fn node_unpublish_volume(
        &self,
        _: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        unused()
    }
    async fn node_get_volume_stats(
        &self,
        _: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        unused()
    }
    async fn node_expand_volume(
        &self,
        _: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        unused()
    }
    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        unused()
    }
    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        *self.0.calls.lock().unwrap() += 1;
        if let Some(status) = self.0.error.lock().unwrap().clone() {
            return Err(status);
        }
        Ok(Response::new(self.0.response.lock().unwrap().clone()))
    }
}

/// How a fake's socket comes into being.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bind {
    /// `bind(2)` at the path, as a Go server does: the watcher sees `IN_CREATE`.
    AtPath,
    /// Our socket layer: a hidden name renamed into place (`IN_MOVED_TO`); the socket is
    /// removed when the server stops.
    Renamed,
}

/// A gRPC server on a Unix socket, until stopped or dropped.
pub struct Served {
    pub socket: PathBuf,
    stop: Option<Trigger>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Served {
    /// Serves `routes` on `socket` (inside a tokio runtime).
    pub fn start(socket: &Path, bind: Bind, routes: Routes) -> Self {
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let (listener, guard) = match bind {
            Bind::AtPath => (tokio::net::UnixListener::bind(socket).unwrap(), None),
            Bind::Renamed => {
                let perms = csi_nodekit::socket::Permissions {
                    mode: 0o600,
                    gid: None,
                };
                let (listener, guard) = csi_nodekit::socket::bind_tokio(socket, perms).unwrap();
                (listener, Some(guard))
            }
        };
        let (stop, stopped) = Shutdown::manual();
        let task = tokio::spawn(async move {
            let _guard = guard;
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
            let _ = tonic::transport::Server::builder()
                .add_routes(routes)
                .serve_with_incoming_shutdown(incoming, stopped.wait())
                .await;
        });
        Self {
            socket: socket.to_owned(),
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops serving; the socket file stays unless the server was bound with [`Bind::Renamed`].
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            stop.fire();
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            stop.fire();
        }
    }
}

/// A plugin's registration socket answering `info`.
pub fn registration(socket: &Path, bind: Bind, info: PluginInfo) -> (Served, Arc<Registrar>) {
    registration_with_node(socket, bind, info, None)
}

/// A registration socket that also serves the CSI Node service (a plugin whose endpoint is
/// its registration socket).
pub fn registration_with_node(
    socket: &Path,
    bind: Bind,
    info: PluginInfo,
    node: Option<Arc<NodeAnswer>>,
) -> (Served, Arc<Registrar>) {
    let registrar = Arc::new(Registrar {
        info: Mutex::new(info),
        ..Default::default()
    });
    let mut routes = Routes::new(RegistrationServer::new(RegistrationService(
        registrar.clone(),
    )));
    if let Some(node) = node {
        routes = routes.add_service(NodeServer::new(NodeService(node)));
    }
    (Served::start(socket, bind, routes), registrar)
}

/// The fake Node service, to be served beside others (a driver with an Identity service).
pub fn node_server(answer: Arc<NodeAnswer>) -> NodeServer<impl Node> {
    NodeServer::new(NodeService(answer))
}

/// A CSI driver socket whose NodeGetInfo gives `answer`.
pub fn node(socket: &Path, answer: Arc<NodeAnswer>) -> Served {
    let routes = Routes::new(NodeServer::new(NodeService(answer)));
    Served::start(socket, Bind::AtPath, routes)
}
