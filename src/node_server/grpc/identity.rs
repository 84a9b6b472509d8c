//! The CSI Identity service: who we are, what we can do, and whether we are ready.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::node_server::grpc::Backend;

use crate::proto::csi::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse,
    identity_server::Identity, plugin_capability,
};

/// Answers Identity calls for the driver (or for `--resizer-only`).
pub struct IdentityService(pub(in crate::node_server) Backend);

fn service_capability(kind: plugin_capability::service::Type) -> PluginCapability {
    PluginCapability {
        r#type: Some(plugin_capability::Type::Service(
            plugin_capability::Service {
                r#type: kind as i32,
            },
        )),
    }
}

/// Ready when the state directory exists and we may write to it: every volume call needs it.
fn readiness(state_dir: &std::path::Path) -> nix::Result<()> {
    nix::unistd::access(state_dir, nix::unistd::AccessFlags::W_OK)
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        log::trace!("GetPluginInfo");
        let name = match &self.0 {
            Backend::Driver(driver) => driver.config().driver_name.clone(),
            Backend::ResizerOnly { driver_name } => driver_name.clone(),
        };
        Ok(Response::new(GetPluginInfoResponse {
            name,
            vendor_version: crate::cli::VERSION.to_owned(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        use plugin_capability::{service::Type as Service, volume_expansion::Type as Expansion};
        let online = PluginCapability {
            r#type: Some(plugin_capability::Type::VolumeExpansion(
                plugin_capability::VolumeExpansion {
                    r#type: Expansion::Online as i32,
                },
            )),
        };
        // Behind --resizer-only, a Controller service (csi-resizer refuses to start without
        // one) and online expansion, nothing of a node.
        let Backend::Driver(driver) = &self.0 else {
            return Ok(Response::new(GetPluginCapabilitiesResponse {
                capabilities: vec![service_capability(Service::ControllerService), online],
            }));
        };
        let mut capabilities = vec![
            service_capability(Service::ControllerService),
            service_capability(Service::VolumeAccessibilityConstraints),
            service_capability(Service::GroupControllerService),
        ];
        // Served either way; csi-sanity fails on a service type it does not know.
        if driver.config().advertise_snapshot_metadata {
            capabilities.push(service_capability(Service::SnapshotMetadataService));
        }
        capabilities.push(online);
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        // --resizer-only has nothing to be unready for.
        let Backend::Driver(driver) = &self.0 else {
            return Ok(Response::new(ProbeResponse { ready: Some(true) }));
        };
        let state_dir = driver.state_dir();
        let ready = match readiness(state_dir) {
            Ok(()) => true,
            Err(e) => {
                log::warn!(
                    "not ready: state directory {} is not writable: {e}",
                    state_dir.display()
                );
                false
            }
        };
        log::trace!("Probe: ready={ready}");
        Ok(Response::new(ProbeResponse { ready: Some(ready) }))
    }
}

/// Identity while another node-server holds the state directory: every call, Probe included,
/// fails UNAVAILABLE saying why, so a liveness probe's answer and a registrar's log name the
/// holder instead of a missing socket. The other services are not served at all.
pub struct WaitingIdentity(pub Arc<str>);

impl WaitingIdentity {
    fn refuse(&self) -> Status {
        Status::unavailable(self.0.to_string())
    }
}

#[tonic::async_trait]
impl Identity for WaitingIdentity {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Err(self.refuse())
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Err(self.refuse())
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        log::trace!("Probe: waiting for the state directory");
        Err(self.refuse())
    }
}
