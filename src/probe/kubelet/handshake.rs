//! One registration, step for step as the kubelet's operation generator and CSI handler do it:
//! dial the registration socket (10 s), GetInfo (1 s), the plugin type, CSI validation,
//! NodeGetInfo on the driver's endpoint (2 min), the API writes, and NotifyRegistrationStatus
//! (5 s). Every failure text is the kubelet's own.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::timeout;
use tonic::transport::Channel;

use super::csi_versions::{validate_plugin, validate_versions};
use super::output::{Failure, Registration};
use super::state::{Registered, Shared};
use crate::flow::{Arrow, Outcome, Party, Stamp};
use crate::gocompat;
use crate::proto::csi::node_client::NodeClient;
use crate::proto::csi::{NodeGetInfoRequest, NodeGetInfoResponse};
use crate::proto::registration::registration_client::RegistrationClient;
use crate::proto::registration::{InfoRequest, RegistrationStatus};
use crate::socket;

const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
const GET_INFO_TIMEOUT: Duration = Duration::from_secs(1);
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);
const NODE_GET_INFO_TIMEOUT: Duration = Duration::from_secs(120);

/// The only plugin type this emulator has a handler for.
const CSI_PLUGIN: &str = "CSIPlugin";

/// A unary call under a deadline; errors as grpc-go prints them.
async fn call<T>(
    limit: Duration,
    request: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    match timeout(limit, request).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(gocompat::status(&status)),
        Err(_) => Err(gocompat::deadline_exceeded()),
    }
}

/// The registration client, the text for this socket in error messages, and the calls made.
struct Plugin<'a> {
    client: RegistrationClient<Channel>,
    socket: String,
    calls: &'a mut Vec<Arrow>,
}

impl Plugin<'_> {
    /// `notifyPlugin`: a failed call yields `"<errStr>: <call error>"`.
    async fn notify(&mut self, registered: bool, error: &str) -> Result<(), String> {
        log::trace!("NotifyRegistrationStatus({registered}) to {}", self.socket);
        let status = RegistrationStatus {
            plugin_registered: registered,
            error: error.to_owned(),
        };
        let stamp = Stamp::now();
        let result = call(
            NOTIFY_TIMEOUT,
            self.client.notify_registration_status(status),
        )
        .await
        .map(drop)
        .map_err(|e| format!("{error}: {e}"));
        let (shown, outcome) = match (&result, registered) {
            (Err(e), _) => (format!("the call failed: {e}"), Outcome::Failed),
            (Ok(()), true) => ("registered".to_owned(), Outcome::Ok),
            (Ok(()), false) => (error.to_owned(), Outcome::Failed),
        };
        let name = format!("NotifyRegistrationStatus({registered})");
        self.record(stamp.arrow(7, Party::Kubelet, Party::Registrar, &name, shown, outcome));
        result
    }

    fn record(&mut self, arrow: Arrow) {
        self.calls.push(arrow.in_group(self.socket.clone()));
    }

    /// Tells the plugin why it was refused; the reason reported is what it was told, or why
    /// telling it failed.
    async fn refuse(&mut self, driver: Option<&str>, reason: String) -> Failure {
        let reason = match self.notify(false, &reason).await {
            Ok(()) => reason,
            Err(e) => format!(
                "RegisterPlugin error -- failed to send error at socket {}, err: {e}",
                self.socket
            ),
        };
        Failure {
            driver: driver.map(str::to_owned),
            reason,
        }
    }
}

fn failure(reason: String) -> Failure {
    Failure {
        driver: None,
        reason,
    }
}

/// Registers the plugin behind `socket`, recording it under `identity` once validated; every
/// call made is added to `calls`, timed, in the order made.
pub async fn register(
    shared: &Shared,
    socket: &Path,
    identity: u64,
    calls: &mut Vec<Arrow>,
) -> Result<Registration, Failure> {
    let at = socket.display().to_string();
    // The dial is part of GetInfo's arrow: it is how the kubelet reaches the registrar.
    let stamp = Stamp::now();
    let get_info = |result: String, outcome| {
        stamp
            .arrow(
                4,
                Party::Kubelet,
                Party::Registrar,
                "GetInfo",
                result,
                outcome,
            )
            .in_group(at.clone())
    };
    // grpc-go's blocking dial keeps trying until its deadline, as `socket::dial` does.
    let channel = timeout(DIAL_TIMEOUT, socket::dial(socket, DIAL_TIMEOUT, None))
        .await
        .map_err(|_| "context deadline exceeded".to_owned())
        .and_then(|dialled| dialled.map_err(|e| e.to_string()))
        .map_err(|e| {
            let reason = format!(
                "RegisterPlugin error -- dial failed at socket {at}, err: failed to dial socket {at}, err: {e}"
            );
            calls.push(get_info(reason.clone(), Outcome::Failed));
            failure(reason)
        })?;
    log::trace!("GetInfo from {at}");
    let mut client = RegistrationClient::new(channel);
    let info = call(GET_INFO_TIMEOUT, client.get_info(InfoRequest {}))
        .await
        .map_err(|e| {
            let reason = format!(
                "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {at}, err: {e}"
            );
            calls.push(get_info(reason.clone(), Outcome::Failed));
            failure(reason)
        })?;
    let shown = format!(
        "{} {}, endpoint {}, versions {}",
        info.r#type,
        info.name,
        if info.endpoint.is_empty() {
            "(this socket)"
        } else {
            &info.endpoint
        },
        info.supported_versions.join(",")
    );
    calls.push(get_info(shown, Outcome::Ok));
    let mut plugin = Plugin {
        client,
        socket: at.clone(),
        calls,
    };
    log::trace!(
        "GetInfo from {at}: type {:?}, name {:?}, endpoint {:?}, versions {:?}",
        info.r#type,
        info.name,
        info.endpoint,
        info.supported_versions
    );
    let driver = info.name.as_str();
    if info.r#type != CSI_PLUGIN {
        let reason = format!(
            "RegisterPlugin error -- no handler registered for plugin type: {} at socket {at}",
            info.r#type
        );
        return Err(plugin.refuse(Some(driver), reason).await);
    }
    let endpoint = if info.endpoint.is_empty() {
        at.clone()
    } else {
        info.endpoint.clone()
    };
    let known = shared.lock().drivers.get(driver).cloned();
    if let Err(e) = validate_plugin(driver, &endpoint, &info.supported_versions, known.as_ref()) {
        let reason = format!("RegisterPlugin error -- plugin validation failed with err: {e}");
        return Err(plugin.refuse(Some(driver), reason).await);
    }
    // Recorded before the CSI handler runs, so a removal during it deregisters.
    let validated = {
        let mut state = shared.lock();
        state.registered.insert(
            socket.to_owned(),
            Registered {
                identity,
                driver: driver.to_owned(),
            },
        );
        let known = state.drivers.get(driver).cloned();
        validate_versions(
            "RegisterPlugin",
            driver,
            &info.supported_versions,
            known.as_ref(),
        )
        .map(|version| state.drivers.insert(driver.to_owned(), version))
    };
    let installed = match validated {
        Err(e) => Err(e),
        Ok(_) => {
            let target = endpoint_path(shared.host_root.as_deref(), &endpoint, &info.endpoint);
            let stamp = Stamp::now();
            let answer = node_get_info(&target).await;
            plugin.record(match &answer {
                Ok(node) => stamp.arrow(
                    5,
                    Party::Kubelet,
                    Party::Driver,
                    "NodeGetInfo",
                    node_info_text(node),
                    Outcome::Ok,
                ),
                Err(e) => stamp.arrow(
                    5,
                    Party::Kubelet,
                    Party::Driver,
                    "NodeGetInfo",
                    e.clone(),
                    Outcome::Failed,
                ),
            });
            let installed = answer.and_then(|node| {
                let topology = node.accessible_topology.unwrap_or_default().segments;
                let stamp = Stamp::now();
                let written = shared
                    .lock()
                    .node
                    .install(driver, &node.node_id, node.max_volumes_per_node, &topology)
                    .map(|()| node.node_id);
                let (shown, outcome) = match &written {
                    Ok(id) => (
                        format!("Node annotation nodeid {driver}={id}, CSINode entry {driver}"),
                        Outcome::Ok,
                    ),
                    Err(e) => (e.clone(), Outcome::Failed),
                };
                plugin.record(stamp.arrow(
                    6,
                    Party::Kubelet,
                    Party::Api,
                    "update Node and CSINode (emulated)",
                    shown,
                    outcome,
                ));
                written
            });
            if installed.is_err() {
                shared.lock().forget_driver(driver);
            }
            installed
        }
    };
    let node_id = match installed {
        Ok(node_id) => node_id,
        Err(e) => {
            let reason =
                format!("RegisterPlugin error -- plugin registration failed with err: {e}");
            return Err(plugin.refuse(Some(driver), reason).await);
        }
    };
    if let Err(e) = plugin.notify(true, "").await {
        return Err(Failure {
            driver: Some(driver.to_owned()),
            reason: format!(
                "RegisterPlugin error -- failed to send registration status at socket {at}, err: {e}"
            ),
        });
    }
    log::info!("registered {driver} from {at} (node ID {node_id})");
    Ok(Registration {
        driver: driver.to_owned(),
        endpoint,
        node_id,
    })
}

/// NodeGetInfo's answer on one line: node ID, maximum volumes, topology.
fn node_info_text(node: &NodeGetInfoResponse) -> String {
    let mut text = format!("node ID {}", node.node_id);
    if node.max_volumes_per_node > 0 {
        text.push_str(&format!(", max volumes {}", node.max_volumes_per_node));
    }
    if let Some(topology) = &node.accessible_topology {
        let mut segments: Vec<_> = topology
            .segments
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        segments.sort();
        text.push_str(&format!(", topology {}", segments.join(",")));
    }
    text
}

/// Where to dial the driver: its endpoint (a `unix://` URL or a path), under `--host-root` when
/// the plugin gave a host path. The registration socket itself (an empty endpoint) is local.
fn endpoint_path(host_root: Option<&Path>, endpoint: &str, given: &str) -> PathBuf {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    match (host_root, path.strip_prefix('/')) {
        (Some(root), Some(relative)) if !given.is_empty() => root.join(relative),
        _ => PathBuf::from(path),
    }
}

/// The CSI client's NodeGetInfo: one connection attempt, then the call, within 2 minutes.
async fn node_get_info(path: &Path) -> Result<NodeGetInfoResponse, String> {
    let attempt = async {
        let channel = socket::connect(path).await.map_err(|e| match e {
            // The errno is what grpc-go's dial error text is made of.
            socket::DialError::Connect { source, .. } => gocompat::dial_error(path, &source),
            other => gocompat::dial_error(path, &std::io::Error::other(other.to_string())),
        })?;
        log::trace!("NodeGetInfo on {}", path.display());
        call(
            NODE_GET_INFO_TIMEOUT,
            NodeClient::new(channel).node_get_info(NodeGetInfoRequest {}),
        )
        .await
    };
    timeout(NODE_GET_INFO_TIMEOUT, attempt)
        .await
        .unwrap_or_else(|_| Err(gocompat::deadline_exceeded()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_map_under_the_host_root_only_when_the_plugin_gave_them() {
        let root = Some(Path::new("/host"));
        let table = [
            (None, "/p/csi.sock", "/p/csi.sock", "/p/csi.sock"),
            (root, "/p/csi.sock", "/p/csi.sock", "/host/p/csi.sock"),
            (
                root,
                "unix:///p/csi.sock",
                "unix:///p/csi.sock",
                "/host/p/csi.sock",
            ),
            (root, "/reg/x-reg.sock", "", "/reg/x-reg.sock"),
            (None, "unix:/p/csi.sock", "unix:/p/csi.sock", "/p/csi.sock"),
        ];
        for (host_root, endpoint, given, expected) in table {
            assert_eq!(
                endpoint_path(host_root, endpoint, given),
                PathBuf::from(expected),
                "{endpoint} under {host_root:?}"
            );
        }
    }
}
