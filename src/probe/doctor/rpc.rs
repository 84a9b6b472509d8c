//! Every call the doctor makes, each under the one `--timeout`: dialling a socket (classified
//! by errno: nobody listens, backlog full, denied, missing), and the read-only gRPC calls —
//! GetInfo on a registration socket; GetPluginInfo, Probe, GetPluginCapabilities,
//! ControllerGetCapabilities and NodeGetInfo on a driver. NotifyRegistrationStatus is not here
//! on purpose: the doctor never tells a plugin anything.

use std::future::Future;
use std::io;
use std::path::Path;
use std::time::Duration;

use tonic::transport::Channel;

use crate::proto::csi::controller_client::ControllerClient;
use crate::proto::csi::identity_client::IdentityClient;
use crate::proto::csi::node_client::NodeClient;
use crate::proto::csi::{
    ControllerGetCapabilitiesRequest, GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse,
    GetPluginInfoRequest, GetPluginInfoResponse, NodeGetInfoRequest, NodeGetInfoResponse,
    ProbeRequest, controller_service_capability, plugin_capability,
};
use crate::proto::registration::registration_client::RegistrationClient;
use crate::proto::registration::{InfoRequest, PluginInfo};
use crate::{gocompat, socket};

/// Why a socket could not be dialled, by what it tells about the process behind it.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The path holds a socket nobody listens on (`ECONNREFUSED`).
    #[error("connection refused: nobody listens on it")]
    Stale,
    /// Something listens but its queue is full: it is not accepting (`EAGAIN`).
    #[error("its listen queue is full: the process behind it is not accepting connections")]
    Busy,
    #[error("permission denied ({0})")]
    Denied(#[source] io::Error),
    #[error("no such file")]
    Missing,
    #[error("no connection within {0:?}")]
    Timeout(Duration),
    #[error("{}", crate::deepest_cause(.0))]
    Other(#[source] socket::DialError),
}

impl From<socket::DialError> for DialError {
    fn from(error: socket::DialError) -> Self {
        let socket::DialError::Connect { path, source } = error else {
            return Self::Other(error);
        };
        match source.kind() {
            io::ErrorKind::ConnectionRefused => Self::Stale,
            io::ErrorKind::WouldBlock => Self::Busy,
            io::ErrorKind::NotFound => Self::Missing,
            io::ErrorKind::PermissionDenied => Self::Denied(source),
            _ => Self::Other(socket::DialError::Connect { path, source }),
        }
    }
}

/// A failed call.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("{}", gocompat::status_with_cause(.0))]
    Status(#[source] tonic::Status),
}

impl CallError {
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout(_))
    }

    pub fn is_unimplemented(&self) -> bool {
        matches!(self, Self::Status(s) if s.code() == tonic::Code::Unimplemented)
    }
}

/// Dials `path` (a path in the doctor's own filesystem); the connect's errno says what is
/// behind the socket.
pub async fn dial(path: &Path, limit: Duration) -> Result<Channel, DialError> {
    match tokio::time::timeout(limit, socket::connect(path)).await {
        Ok(connected) => Ok(connected?),
        Err(_) => Err(DialError::Timeout(limit)),
    }
}

/// A unary call under `limit`. The deadline is ours, not grpc-timeout: a hung server must cost
/// exactly one timeout.
async fn within<T>(
    limit: Duration,
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(limit, call).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(CallError::Status(status)),
        Err(_) => Err(CallError::Timeout(limit)),
    }
}

pub async fn get_info(channel: Channel, limit: Duration) -> Result<PluginInfo, CallError> {
    log::trace!("GetInfo");
    within(
        limit,
        RegistrationClient::new(channel).get_info(InfoRequest {}),
    )
    .await
}

pub async fn plugin_info(
    channel: Channel,
    limit: Duration,
) -> Result<GetPluginInfoResponse, CallError> {
    within(
        limit,
        IdentityClient::new(channel).get_plugin_info(GetPluginInfoRequest {}),
    )
    .await
}

/// Probe, read as `probe once` reads it: `Ok(false)` when the driver responded but is not
/// ready (an unset `ready` means ready).
pub async fn probe(channel: Channel, limit: Duration) -> Result<bool, CallError> {
    let response = within(limit, IdentityClient::new(channel).probe(ProbeRequest {})).await?;
    Ok(response.ready != Some(false))
}

/// The plugin capabilities that matter to registration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    pub controller_service: bool,
    pub accessibility_constraints: bool,
}

impl From<&GetPluginCapabilitiesResponse> for Capabilities {
    fn from(response: &GetPluginCapabilitiesResponse) -> Self {
        use plugin_capability::service::Type;
        let services: Vec<i32> = response
            .capabilities
            .iter()
            .filter_map(|c| match &c.r#type {
                Some(plugin_capability::Type::Service(service)) => Some(service.r#type),
                _ => None,
            })
            .collect();
        Self {
            controller_service: services.contains(&(Type::ControllerService as i32)),
            accessibility_constraints: services
                .contains(&(Type::VolumeAccessibilityConstraints as i32)),
        }
    }
}

pub async fn capabilities(channel: Channel, limit: Duration) -> Result<Capabilities, CallError> {
    let request = GetPluginCapabilitiesRequest {};
    let response = within(
        limit,
        IdentityClient::new(channel).get_plugin_capabilities(request),
    )
    .await?;
    Ok(Capabilities::from(&response))
}

/// Whether the Controller service on this socket implements ControllerPublishVolume.
pub async fn controller_publish(channel: Channel, limit: Duration) -> Result<bool, CallError> {
    use controller_service_capability::{Type, rpc::Type as Rpc};
    let request = ControllerGetCapabilitiesRequest {};
    let response = within(
        limit,
        ControllerClient::new(channel).controller_get_capabilities(request),
    )
    .await?;
    Ok(response.capabilities.iter().any(|c| {
        matches!(&c.r#type, Some(Type::Rpc(rpc)) if rpc.r#type == Rpc::PublishUnpublishVolume as i32)
    }))
}

pub async fn node_info(
    channel: Channel,
    limit: Duration,
) -> Result<NodeGetInfoResponse, CallError> {
    within(
        limit,
        NodeClient::new(channel).node_get_info(NodeGetInfoRequest {}),
    )
    .await
}
