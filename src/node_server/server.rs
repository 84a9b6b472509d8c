//! The gRPC server of node-server: the five CSI services on one listener with every HTTP/2
//! bound stated, the grace period for calls in flight at shutdown, and the heap trimmed after
//! bursts. [`Plugin`] is the opened driver it serves.

use std::sync::Arc;

use tower::layer::util::{Identity, Stack};
use tower::util::MapResponseLayer;

use super::config::Config;
use super::driver::{Driver, OpenError, Seams};
use super::grpc::{
    Backend, controller, field_limits, group_controller, identity, node, snapshot_metadata,
};
use super::state::owner::Owner;
use super::{burst_trim, grace, in_flight};
use crate::proto::csi::controller_server::ControllerServer;
use crate::proto::csi::group_controller_server::GroupControllerServer;
use crate::proto::csi::identity_server::IdentityServer;
use crate::proto::csi::node_server::NodeServer;
use crate::proto::csi::snapshot_metadata_server::SnapshotMetadataServer;
use crate::shutdown::Shutdown;
use crate::{BoxError, socket};

/// The four services, ready to serve.
pub struct Plugin {
    driver: Arc<Driver>,
}

impl Plugin {
    /// Opens the state directory `owner` holds, its syscalls through `seams` (the kernel's:
    /// [`Seams::linux`]): see [`Driver::open`].
    pub fn open(config: Config, owner: Owner, seams: Seams) -> Result<Self, OpenError> {
        let driver = Driver::open(config, owner, seams)?;
        Ok(Self {
            driver: Arc::new(driver),
        })
    }

    /// The driver, for what runs beside the server (the quota patrol, `/metrics`).
    pub(super) fn driver(&self) -> &Arc<Driver> {
        &self.driver
    }
}

/// Serves the CSI services on `listener` until `shutdown`, then lets the calls in flight finish
/// within the grace period; those still running then are answered UNAVAILABLE (`grace`).
pub async fn serve(
    listener: tokio::net::UnixListener,
    plugin: Plugin,
    shutdown: Shutdown,
) -> Result<(), BoxError> {
    // The listener is bound: calls are answered while what interrupted operations left goes.
    let _orphans = plugin.driver.remove_orphans_in_background();
    serve_backend(listener, Backend::Driver(plugin.driver), shutdown).await
}

/// [`serve`] for `backend`: Identity, Node and Controller always; GroupController and
/// SnapshotMetadata where there is a driver (not behind `--resizer-only`, whose endpoint this
/// serves too).
pub(super) async fn serve_backend(
    listener: tokio::net::UnixListener,
    backend: Backend,
    shutdown: Shutdown,
) -> Result<(), BoxError> {
    let max = field_limits::MAX_REQUEST;
    let driver = match &backend {
        Backend::Driver(driver) => Some(Arc::clone(driver)),
        Backend::ResizerOnly { .. } => None,
    };
    let identity = IdentityServer::new(identity::IdentityService(backend.clone()));
    let node = NodeServer::new(node::NodeService(backend.clone()));
    let controller = ControllerServer::new(controller::ControllerService(backend));
    let group = (driver.clone()).map(|driver| {
        let groups = group_controller::GroupControllerService(driver);
        GroupControllerServer::new(groups).max_decoding_message_size(max)
    });
    let metadata = driver.map(|driver| {
        let maps = snapshot_metadata::SnapshotMetadataService(driver);
        SnapshotMetadataServer::new(maps).max_decoding_message_size(max)
    });
    let grace = crate::shutdown::GRACE_PERIOD;
    let calls = in_flight::InFlight::default();
    // Stopped with the server: in-process tests serve many times on one runtime.
    let trimmer = tokio::spawn(burst_trim::trim_after_bursts(calls.clone()));
    let cut = grace::CutAtGraceEnd::new(shutdown.later(grace), grace, calls.clone());
    let server = bounded_server()
        .layer(cut)
        .add_service(identity.max_decoding_message_size(max))
        .add_service(node.max_decoding_message_size(max))
        .add_optional_service(group)
        .add_optional_service(metadata)
        .add_service(controller.max_decoding_message_size(max))
        .serve_with_incoming_shutdown(socket::grpc_incoming(listener), shutdown.clone().wait());
    // A moment beyond the grace period for the UNAVAILABLE answers to go out.
    let answered = grace + std::time::Duration::from_secs(1);
    // Done once no call runs: connections whose clients never answer the GOAWAY are not
    // waited for (`in_flight`).
    let served = crate::shutdown::run_with_grace(server, shutdown, answered, calls.quiet()).await;
    trimmer.abort();
    match served {
        Some(result) => result.map_err(Into::into),
        None => Ok(()),
    }
}

/// The gRPC server with every HTTP/2 bound stated, not left to library defaults: what one
/// stream may have in flight is one largest request; a connection, four of them; a header
/// list, 16 KiB; 64 streams at once per connection (gRPC clients queue the rest).
pub(super) fn bounded_server()
-> tonic::transport::Server<Stack<MapResponseLayer<MapGrpc>, Identity>> {
    let window = u32::try_from(field_limits::MAX_REQUEST).unwrap_or(u32::MAX);
    tonic::transport::Server::builder()
        .initial_stream_window_size(window)
        .initial_connection_window_size(window.saturating_mul(4))
        .max_frame_size(16 << 10)
        .http2_max_header_list_size(16 << 10)
        .max_concurrent_streams(64)
        .layer(MapResponseLayer::new(
            too_large_is_resource_exhausted as MapGrpc,
        ))
}

type GrpcResponse = tonic::codegen::http::Response<tonic::body::Body>;
type MapGrpc = fn(GrpcResponse) -> GrpcResponse;

/// tonic refuses a request over `max_decoding_message_size` from its length prefix, before
/// buffering it, but with OUT_OF_RANGE; gRPC's code for a message over the receiver's limit
/// is RESOURCE_EXHAUSTED (what grpc-go answers, and what clients retry on or report as such).
/// No handler of ours answers OUT_OF_RANGE with tonic's wording.
fn too_large_is_resource_exhausted(mut response: GrpcResponse) -> GrpcResponse {
    const TONIC_TOO_LARGE: &[u8] = b"Error,%20decoded%20message%20length%20too%20large";
    let headers = response.headers_mut();
    let too_large = headers.get("grpc-status").is_some_and(|code| code == "11")
        && headers
            .get("grpc-message")
            .is_some_and(|message| message.as_bytes().starts_with(TONIC_TOO_LARGE));
    if too_large {
        let code = tonic::Code::ResourceExhausted as i32;
        headers.insert("grpc-status", code.into());
    }
    response
}
