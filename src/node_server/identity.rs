//! The CSI Identity service: who we are, what we can do, and whether we are ready.

use tonic::{Request, Response, Status};

use crate::proto::csi::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse,
    identity_server::Identity, plugin_capability,
};

/// Answers Identity calls for one driver.
#[derive(Debug, Clone)]
pub struct IdentityService {
    pub driver_name: String,
    /// Readiness: the state directory must be usable for any volume call to succeed.
    pub state_dir: std::path::PathBuf,
}

fn service_capability(kind: plugin_capability::service::Type) -> PluginCapability {
    PluginCapability {
        r#type: Some(plugin_capability::Type::Service(
            plugin_capability::Service {
                r#type: kind as i32,
            },
        )),
    }
}

/// Ready when the state directory exists and we may write to it.
fn readiness(state_dir: &std::path::Path) -> Result<(), String> {
    nix::unistd::access(state_dir, nix::unistd::AccessFlags::W_OK).map_err(|e| {
        format!(
            "state directory {} is not writable: {e}",
            state_dir.display()
        )
    })
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        log::trace!("GetPluginInfo");
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
        let online = PluginCapability {
            r#type: Some(plugin_capability::Type::VolumeExpansion(
                plugin_capability::VolumeExpansion {
                    r#type: Expansion::Online as i32,
                },
            )),
        };
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: vec![
                service_capability(Service::ControllerService),
                service_capability(Service::VolumeAccessibilityConstraints),
                online,
            ],
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        let ready = match readiness(&self.state_dir) {
            Ok(()) => true,
            Err(why) => {
                log::warn!("not ready: {why}");
                false
            }
        };
        log::trace!("Probe: ready={ready}");
        Ok(Response::new(ProbeResponse { ready: Some(ready) }))
    }
}
