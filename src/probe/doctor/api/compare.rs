//! What the API server says against what the node shows: the node's CSINode (does it list each
//! driver, with the node ID and topology keys the driver gives now?), the CSIDriver objects
//! (present? `attachRequired` for a driver without ControllerPublishVolume?) and the Node's
//! `csi.volume.kubernetes.io/nodeid` annotation. Three GETs, made together.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::Access;
use super::client;
use crate::gocompat;
use crate::names::LookupError;
use crate::probe::doctor::chain::Plugin;
use crate::probe::doctor::finding::{Finding, Severity};
use crate::probe::kubelet::csinode::NODE_ID_ANNOTATION;

/// A driver as the node shows it, from a plugin whose chain had no error.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalDriver {
    pub name: String,
    pub node_id: Option<String>,
    pub topology_keys: Option<Vec<String>>,
    pub max_volumes: Option<i64>,
    pub controller_publish: Option<bool>,
}

/// One GET's outcome: the object, `None` for 404, or why it could not be read.
pub type Fetched = Result<Option<Value>, FetchError>;

/// Why an API object could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("GET {path}: {source}")]
    Request {
        path: String,
        #[source]
        source: client::RequestError,
    },
    #[error("GET {path}: the reply is not JSON")]
    NotJson { path: String },
    /// The server refused: its status, and the `message` of its Status object if any.
    #[error("GET {path}: HTTP {status}{}{message}", if message.is_empty() { "" } else { " " })]
    Refused {
        path: String,
        status: u16,
        message: String,
    },
}

fn local_drivers(plugins: &[Plugin]) -> Vec<LocalDriver> {
    plugins
        .iter()
        .filter(|p| !p.other_type && p.findings.iter().all(|f| f.severity < Severity::Error))
        .filter_map(|p| {
            let facts = p.facts.as_ref()?;
            Some(LocalDriver {
                name: p.driver.clone()?,
                node_id: facts.node_id.clone(),
                topology_keys: facts.topology_keys.clone(),
                max_volumes: facts.max_volumes,
                controller_publish: facts.controller_publish,
            })
        })
        .collect()
}

async fn fetch(access: &Access, path: &str, limit: Duration) -> Fetched {
    let (status, body) =
        client::get(access, path, limit)
            .await
            .map_err(|source| FetchError::Request {
                path: path.to_owned(),
                source,
            })?;
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    match status {
        200 => parsed.map(Some).ok_or_else(|| FetchError::NotJson {
            path: path.to_owned(),
        }),
        404 => Ok(None),
        _ => Err(FetchError::Refused {
            path: path.to_owned(),
            status,
            message: parsed
                .as_ref()
                .and_then(|v| v["message"].as_str())
                .unwrap_or_default()
                .to_owned(),
        }),
    }
}

/// Node names are DNS subdomains; anything else would not name a Node (and must not bend the
/// request path).
fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// Reads the three objects and compares them with the plugins' findings.
pub async fn compare(
    access: &Access,
    node_name: &str,
    plugins: &[Plugin],
    limit: Duration,
) -> Vec<Finding> {
    if !valid_node_name(node_name) {
        let saw = if node_name.is_empty() {
            "no node name: --node-name and $NODE_NAME are unset and the host name unreadable".into()
        } else {
            format!("{node_name:?} is not a valid Node name")
        };
        return vec![Finding::warning(
            "api.node-name",
            saw,
            "the API comparisons were skipped",
            "give --node-name as `kubectl get nodes` shows it",
        )];
    }
    let csinode_path = format!("/apis/storage.k8s.io/v1/csinodes/{node_name}");
    let node_path = format!("/api/v1/nodes/{node_name}");
    let (csinode, csidrivers, node) = tokio::join!(
        fetch(access, &csinode_path, limit),
        fetch(access, "/apis/storage.k8s.io/v1/csidrivers", limit),
        fetch(access, &node_path, limit),
    );
    judge(
        node_name,
        &local_drivers(plugins),
        csinode,
        csidrivers,
        node,
    )
}

/// An API object that could not be read. A server that refused (401, 403, another status)
/// was reached: a warning, the comparison skipped. A server that could not be reached at all
/// (no such host, no connection, a certificate not trusted, no answer) is an error: the
/// doctor was asked to compare with the API and could not, so it must not end "no problem".
fn unavailable(error: FetchError) -> Finding {
    use client::RequestError;
    let (fix, reached) = match &error {
        FetchError::Refused { status: 401, .. } => (
            "the credentials are not accepted: check the token or client certificate",
            true,
        ),
        FetchError::Refused { status: 403, .. } => (
            "grant get on csinodes and nodes and list on csidrivers (the doctor pod manifest \
             has such a ClusterRole)",
            true,
        ),
        FetchError::Refused { .. } => ("check the API server's own health", true),
        FetchError::Request {
            source:
                RequestError::Resolve {
                    source: LookupError::NoAnswer { .. },
                    ..
                },
            ..
        } => (
            "no name server answered: check the nameserver lines of /etc/resolv.conf where the \
             doctor runs (in a pod, its dnsPolicy), or put the API server's IP address in the \
             kubeconfig's server:, or pass --no-api",
            false,
        ),
        FetchError::Request {
            source: RequestError::Resolve { .. },
            ..
        } => (
            "use a name this node resolves (its /etc/hosts or DNS) or the API server's IP \
             address in the kubeconfig's server:, or pass --no-api",
            false,
        ),
        FetchError::Request { source, .. } if client::is_certificate_error(source) => (
            "give the certificate authority that signed the API server's certificate \
             (certificate-authority or certificate-authority-data in the kubeconfig), and \
             a server: address its certificate names",
            false,
        ),
        _ => (
            "check the kubeconfig's server: address (host and port) and that this node can \
             reach the API server, or pass --no-api",
            false,
        ),
    };
    let means = "the comparison with the API objects was skipped";
    if reached {
        Finding::warning("api.unavailable", error.to_string(), means, fix)
    } else {
        Finding::error("api.unavailable", error.to_string(), means, fix)
    }
}

/// The comparisons, from the fetched objects.
pub fn judge(
    node_name: &str,
    local: &[LocalDriver],
    csinode: Fetched,
    csidrivers: Fetched,
    node: Fetched,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    match csinode {
        Err(error) => findings.push(unavailable(error)),
        Ok(None) => findings.push(Finding::error(
            "api.csinode-missing",
            format!("there is no CSINode named {node_name:?}"),
            "the kubelet creates it when it starts: the node name is wrong, or the kubelet \
             cannot write to the API server",
            "give --node-name as `kubectl get nodes` shows it (default: $NODE_NAME, else the \
             host name)",
        )),
        Ok(Some(csinode)) => compare_csinode(&mut findings, local, &csinode),
    }
    match csidrivers {
        Err(error) => findings.push(unavailable(error)),
        Ok(list) => compare_csidrivers(&mut findings, local, list.as_ref()),
    }
    match node {
        Err(error) => findings.push(unavailable(error)),
        Ok(None) => {}
        Ok(Some(node)) => compare_annotation(&mut findings, local, &node),
    }
    findings
}

fn entries(csinode: &Value) -> BTreeMap<String, &Value> {
    csinode["spec"]["drivers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| Some((d["name"].as_str()?.to_owned(), d)))
        .collect()
}

fn compare_csinode(findings: &mut Vec<Finding>, local: &[LocalDriver], csinode: &Value) {
    let listed = entries(csinode);
    for driver in local {
        let name = &driver.name;
        let Some(entry) = listed.get(name) else {
            findings.push(Finding::error(
                "api.not-registered",
                format!("driver {name} answers on this node, but the CSINode does not list it"),
                format!(
                    "the kubelet has not registered it: its volumes fail with \"driver name \
                     {name} not found in the list of registered CSI drivers\"; after a failure \
                     past validation (NodeGetInfo) the kubelet never retries on its own"
                ),
                format!(
                    "read the kubelet's log for \"RegisterPlugin error\" about {name}, then \
                     restart the driver's registrar so the kubelet tries again"
                ),
            ));
            continue;
        };
        let mut agrees = true;
        let listed_id = entry["nodeID"].as_str().unwrap_or_default();
        if let Some(node_id) = driver.node_id.as_deref().filter(|id| *id != listed_id) {
            agrees = false;
            findings.push(Finding::error(
                "api.node-id",
                format!(
                    "the CSINode has node ID {listed_id:?} for {name}, the driver now answers \
                     {node_id:?}"
                ),
                "the kubelet reads NodeGetInfo only at registration: attach and provisioning \
                 use the old ID",
                "restart the driver's registrar so the kubelet registers it again",
            ));
        }
        let mut listed_keys: Vec<String> = entry["topologyKeys"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|k| k.as_str().map(str::to_owned))
            .collect();
        listed_keys.sort();
        if let Some(keys) = driver.topology_keys.as_ref().filter(|k| **k != listed_keys) {
            agrees = false;
            findings.push(Finding::error(
                "api.topology",
                format!(
                    "the CSINode has topology keys {} for {name}, the driver now answers {}",
                    gocompat::list(&listed_keys),
                    gocompat::list(keys)
                ),
                "the scheduler and provisioners place volumes by the keys the kubelet recorded",
                "restart the driver's registrar so the kubelet registers it again",
            ));
        }
        let listed_count = entry["allocatable"]["count"].as_i64();
        let count = driver.max_volumes.filter(|n| *n > 0);
        if driver.max_volumes.is_some() && listed_count != count {
            findings.push(Finding::warning(
                "api.allocatable",
                format!(
                    "the CSINode allows {} volumes of {name}, the driver now says {}",
                    listed_count.map_or("any number of".into(), |n| n.to_string()),
                    count.map_or("no limit".into(), |n| n.to_string())
                ),
                "the scheduler counts volumes against the recorded limit",
                "restart the driver's registrar so the kubelet registers it again",
            ));
        }
        if agrees {
            findings.push(Finding::ok(
                "api.csinode",
                format!("the CSINode lists {name} with the node ID and topology keys it answers"),
            ));
        }
    }
    for name in listed
        .keys()
        .filter(|n| !local.iter().any(|d| d.name == **n))
    {
        findings.push(Finding::warning(
            "api.unknown-driver",
            format!("the CSINode lists {name}, which no healthy plugin on this node announces"),
            "either its registration broke after the kubelet registered it, or the doctor \
             looks at another kubelet root than the kubelet",
            "see the findings for that driver above; check the kubelet root",
        ));
    }
}

fn compare_csidrivers(findings: &mut Vec<Finding>, local: &[LocalDriver], list: Option<&Value>) {
    let objects: BTreeMap<&str, &Value> = list
        .and_then(|l| l["items"].as_array())
        .into_iter()
        .flatten()
        .filter_map(|d| Some((d["metadata"]["name"].as_str()?, d)))
        .collect();
    for driver in local {
        let name = driver.name.as_str();
        let Some(object) = objects.get(name) else {
            findings.push(Finding::warning(
                "api.no-csidriver",
                format!("there is no CSIDriver object named {name}"),
                "Kubernetes applies the defaults: attachRequired true (volumes wait for a \
                 VolumeAttachment that an external-attacher must handle), no pod info on \
                 mount, no ephemeral inline volumes",
                "apply the CSIDriver object that comes with the driver",
            ));
            continue;
        };
        let attach_required = object["spec"]["attachRequired"].as_bool().unwrap_or(true);
        if attach_required && driver.controller_publish == Some(false) {
            findings.push(Finding::warning(
                "api.attach-required",
                format!(
                    "CSIDriver {name} has attachRequired {}, but the driver has no \
                     ControllerPublishVolume",
                    if object["spec"]["attachRequired"].is_null() { "unset (true)" } else { "true" }
                ),
                "every volume waits for a VolumeAttachment: without an external-attacher for \
                 this driver pods hang in ContainerCreating",
                format!("set attachRequired: false in CSIDriver {name} (recreate the object: the field is immutable)"),
            ));
        }
    }
}

fn compare_annotation(findings: &mut Vec<Finding>, local: &[LocalDriver], node: &Value) {
    let annotation = node["metadata"]["annotations"][NODE_ID_ANNOTATION].as_str();
    let ids: BTreeMap<String, String> = annotation
        .and_then(|a| serde_json::from_str(a).ok())
        .unwrap_or_default();
    for driver in local {
        let (Some(node_id), Some(recorded)) = (&driver.node_id, ids.get(&driver.name)) else {
            continue;
        };
        if node_id != recorded {
            findings.push(Finding::warning(
                "api.annotation",
                format!(
                    "the Node's {NODE_ID_ANNOTATION} annotation has {recorded:?} for {}, the \
                     driver answers {node_id:?}",
                    driver.name
                ),
                "the kubelet records the node ID only at registration",
                "restart the driver's registrar so the kubelet registers it again",
            ));
        }
    }
}
