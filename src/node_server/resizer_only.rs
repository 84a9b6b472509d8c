//! `node-server --resizer-only`: the endpoint a cluster-wide external-resizer talks to. Our
//! volumes live on their nodes and the resizer runs once per cluster (it has no per-node
//! mode), so it must never call ControllerExpandVolume on whichever node it happens to reach.
//! It picks its node-only "trivial resizer" — which records the size asked in the PV and
//! leaves the kubelet on the volume's node to call NodeExpandVolume, where node-server grows
//! the volume — when the driver has a Controller service that does not advertise
//! EXPAND_VOLUME and a Node service that does. This endpoint says exactly that and serves
//! nothing else: no state directory, no mounts, no privileges, so it runs beside the resizer
//! in an ordinary Deployment. ControllerModifyVolume, which the same resizer calls for a
//! changed VolumeAttributesClass, is refused with INVALID_ARGUMENT (the resizer marks the PVC
//! Infeasible and says why in an event): it cannot reach the volume's node either.

use tonic::{Request, Response, Status};

use super::grpc::field_limits;
use super::server::bounded_server;
use super::settings::Args;
use super::{grace, in_flight};
use crate::proto::csi::controller_server::{Controller, ControllerServer};
use crate::proto::csi::identity_server::{Identity, IdentityServer};
use crate::proto::csi::node_server::{Node, NodeServer};
use crate::proto::csi::{
    ControllerGetCapabilitiesRequest, ControllerGetCapabilitiesResponse,
    ControllerModifyVolumeRequest, ControllerModifyVolumeResponse, GetPluginCapabilitiesRequest,
    GetPluginCapabilitiesResponse, GetPluginInfoRequest, GetPluginInfoResponse,
    NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse, NodeServiceCapability,
    PluginCapability, ProbeRequest, ProbeResponse, node_service_capability, plugin_capability,
};
use crate::runtime::Threads;
use crate::{BoxError, UsageError, socket};

/// Serves the resizer's endpoint at `--endpoint` until SIGTERM or SIGINT.
pub fn main(args: Args) -> Result<(), BoxError> {
    crate::csi_spec::driver_name::validate(&args.driver_name)
        .map_err(|e| UsageError::new(format!("--driver-name: {e}")))?;
    let endpoint = args.endpoint.into_path();
    let perms = socket::Permissions {
        mode: args.socket_mode.bits(),
        gid: args.socket_group.map(crate::cli::values::GroupId::get),
    };
    let name = args.driver_name;
    crate::runtime::serve(Threads::Current, |shutdown| async move {
        let (listener, _guard) = socket::bind_tokio(&endpoint, perms)?;
        log::info!(
            "serving CSI driver {name}'s resizer endpoint on {} (node-only expansion)",
            endpoint.display()
        );
        serve(listener, name, shutdown).await
    })
}

/// Serves the three services on `listener` until `shutdown`; as node-server's own server,
/// the calls in flight then finish within the grace period and idle connections (a resizer
/// keeps its one open for good) are not waited for.
pub async fn serve(
    listener: tokio::net::UnixListener,
    driver_name: String,
    shutdown: crate::shutdown::Shutdown,
) -> Result<(), BoxError> {
    let max = field_limits::MAX_REQUEST;
    let endpoint = ResizerEndpoint { driver_name };
    let grace = crate::shutdown::GRACE_PERIOD;
    let calls = in_flight::InFlight::default();
    let cut = grace::CutAtGraceEnd::new(shutdown.later(grace), grace, calls.clone());
    let server = bounded_server()
        .layer(cut)
        .add_service(IdentityServer::new(endpoint.clone()).max_decoding_message_size(max))
        .add_service(ControllerServer::new(endpoint.clone()).max_decoding_message_size(max))
        .add_service(NodeServer::new(endpoint).max_decoding_message_size(max))
        .serve_with_incoming_shutdown(socket::grpc_incoming(listener), shutdown.clone().wait());
    let answered = grace + std::time::Duration::from_secs(1);
    match crate::shutdown::run_with_grace(server, shutdown, answered, calls.quiet()).await {
        Some(result) => result.map_err(Into::into),
        None => Ok(()),
    }
}

/// The endpoint's three services.
#[derive(Clone)]
struct ResizerEndpoint {
    driver_name: String,
}

#[tonic::async_trait]
impl Identity for ResizerEndpoint {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.driver_name.clone(),
            vendor_version: crate::cli::VERSION.to_owned(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        use plugin_capability::{service::Type as Service, volume_expansion::Type as Expansion};
        let controller = plugin_capability::Type::Service(plugin_capability::Service {
            r#type: Service::ControllerService as i32,
        });
        let online = plugin_capability::Type::VolumeExpansion(plugin_capability::VolumeExpansion {
            r#type: Expansion::Online as i32,
        });
        let capabilities = [controller, online]
            .into_iter()
            .map(|kind| PluginCapability { r#type: Some(kind) })
            .collect();
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Controller for ResizerEndpoint {
    /// None: without EXPAND_VOLUME the resizer expands on the node only.
    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(ControllerGetCapabilitiesResponse::default()))
    }

    async fn controller_modify_volume(
        &self,
        request: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        let id = super::grpc::validate::clip(&request.get_ref().volume_id);
        Err(Status::invalid_argument(format!(
            "volume {id:?} lives on its node, which this cluster-wide resizer cannot reach: \
             {} cannot change a bound volume's VolumeAttributesClass (set it back to the \
             current class); give a new class to a clone made on the same node, or call \
             ControllerModifyVolume on the node-server of the volume's node",
            self.driver_name
        )))
    }
}

#[tonic::async_trait]
impl Node for ResizerEndpoint {
    /// EXPAND_VOLUME: the kubelet on the volume's node grows it (node-server's
    /// NodeExpandVolume), asked by its own node-server's capabilities, not these.
    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let expand = node_service_capability::Rpc {
            r#type: node_service_capability::rpc::Type::ExpandVolume as i32,
        };
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![NodeServiceCapability {
                r#type: Some(node_service_capability::Type::Rpc(expand)),
            }],
        }))
    }
}
