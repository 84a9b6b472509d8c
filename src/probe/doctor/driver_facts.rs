//! The driver behind an endpoint: GetPluginInfo (is it the driver the registrar announced?),
//! Probe, GetPluginCapabilities (and ControllerGetCapabilities when it serves a Controller),
//! and NodeGetInfo — what the kubelet reads at registration. After the first timeout the rest
//! is skipped: a hung driver costs one timeout, not five.

use std::path::{Path, PathBuf};

use tonic::transport::Channel;

use super::Context;
use super::finding::Finding;
use super::rpc::{self, CallError, Capabilities};
use crate::csi_spec::MAX_NODE_ID;
use crate::flow::{Stamp, Timing};
use crate::gocompat;

/// What the driver said, for the API comparisons.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverFacts {
    pub name: Option<String>,
    pub capabilities: Option<Capabilities>,
    /// Whether its Controller implements ControllerPublishVolume; `None` when this socket
    /// serves no Controller (it may run elsewhere).
    pub controller_publish: Option<bool>,
    pub node_id: Option<String>,
    /// Sorted, as the kubelet writes them to the CSINode.
    pub topology_keys: Option<Vec<String>>,
    pub max_volumes: Option<i64>,
}

fn timed_out(findings: &mut Vec<Finding>, call: &str, error: &CallError, shown: &Path) {
    findings.push(Finding::error(
        "driver.timeout",
        format!("{call} on {}: {error}", shown.display()),
        "the driver accepts connections but does not answer: the kubelet's calls time out too \
         (the other calls were skipped)",
        "restart the driver container and read its logs",
    ));
}

/// Examines the driver on `channel` (whose host path is `shown`), announced as `announced`.
pub async fn examine(
    ctx: &Context,
    (channel, shown): (Channel, PathBuf),
    announced: &str,
    timings: &mut Vec<(u8, Timing)>,
) -> (DriverFacts, Vec<Finding>) {
    let mut facts = DriverFacts::default();
    let mut findings = Vec::new();
    let limit = ctx.timeout;
    let stamp = Stamp::now();
    let answer = rpc::plugin_info(channel.clone(), limit).await;
    timings.push((3, stamp.timing()));
    match answer {
        Ok(info) if info.name != announced => {
            findings.push(Finding::error(
                "driver.name-mismatch",
                format!(
                    "the driver at {} calls itself {:?}, but the registrar announces {announced:?}",
                    shown.display(),
                    info.name
                ),
                format!(
                    "the kubelet registers {announced:?}; volumes of StorageClasses and CSIDriver \
                     objects named {:?} fail with \"driver name {:?} not found in the list of \
                     registered CSI drivers\"",
                    info.name, info.name
                ),
                "restart the registrar so it asks the driver again, and check that its \
                 --kubelet-registration-path and --csi-address point at the same driver",
            ));
            facts.name = Some(info.name);
        }
        Ok(info) => {
            findings.push(Finding::ok(
                "driver.plugin-info",
                format!("GetPluginInfo: {} {}", info.name, info.vendor_version),
            ));
            facts.name = Some(info.name);
        }
        Err(e) if e.is_timeout() => {
            timed_out(&mut findings, "GetPluginInfo", &e, &shown);
            return (facts, findings);
        }
        Err(e) => findings.push(Finding::error(
            "driver.plugin-info",
            format!("GetPluginInfo on {}: {e}", shown.display()),
            "the driver's Identity service fails; registrars and provisioners cannot learn its name",
            "read the driver's logs",
        )),
    }
    match rpc::probe(channel.clone(), limit).await {
        Ok(true) => findings.push(Finding::ok("driver.probe", "Probe: ready")),
        Ok(false) => findings.push(Finding::error(
            "driver.probe",
            "Probe: the driver responded but is not ready",
            "volume calls are likely to fail, and a livenessprobe sidecar will restart it if this lasts",
            "read the driver's logs for why it is not ready (its backend, its state directory)",
        )),
        Err(e) if e.is_timeout() => {
            timed_out(&mut findings, "Probe", &e, &shown);
            return (facts, findings);
        }
        Err(e) => findings.push(Finding::error(
            "driver.probe",
            format!("Probe: {e}"),
            "the driver reports itself unhealthy",
            "read the driver's logs",
        )),
    }
    match rpc::capabilities(channel.clone(), limit).await {
        Ok(caps) => facts.capabilities = Some(caps),
        Err(e) if e.is_timeout() => {
            timed_out(&mut findings, "GetPluginCapabilities", &e, &shown);
            return (facts, findings);
        }
        Err(e) => findings.push(Finding::warning(
            "driver.capabilities",
            format!("GetPluginCapabilities: {e}"),
            "every CSI driver must answer it; sidecars that ask will fail",
            "read the driver's logs",
        )),
    }
    if facts.capabilities.is_some_and(|c| c.controller_service) {
        match rpc::controller_publish(channel.clone(), limit).await {
            Ok(publish) => facts.controller_publish = Some(publish),
            Err(e) if e.is_timeout() => {
                timed_out(&mut findings, "ControllerGetCapabilities", &e, &shown);
                return (facts, findings);
            }
            Err(e) => findings.push(Finding::warning(
                "driver.controller-capabilities",
                format!("ControllerGetCapabilities: {e}"),
                "the driver advertises a Controller service that does not answer",
                "read the driver's logs",
            )),
        }
    }
    let stamp = Stamp::now();
    let answer = rpc::node_info(channel, limit).await;
    timings.push((5, stamp.timing()));
    match answer {
        Ok(info) => node_findings(&mut facts, &mut findings, info),
        Err(e) if e.is_timeout() => timed_out(&mut findings, "NodeGetInfo", &e, &shown),
        Err(e) => findings.push(Finding::error(
            "driver.node-info",
            format!("NodeGetInfo: {e}"),
            "registration fails at the kubelet's step 5, and the kubelet does not retry on its own",
            "fix the driver's Node service, then restart the registrar so the kubelet registers again",
        )),
    }
    (facts, findings)
}

fn node_findings(
    facts: &mut DriverFacts,
    findings: &mut Vec<Finding>,
    info: crate::proto::csi::NodeGetInfoResponse,
) {
    let mut keys: Vec<String> = info
        .accessible_topology
        .map(|t| t.segments.into_keys().collect())
        .unwrap_or_default();
    keys.sort();
    if info.node_id.is_empty() {
        findings.push(Finding::error(
            "driver.node-id",
            "NodeGetInfo gives an empty node ID",
            "the kubelet fails the registration and never retries on its own",
            "give the driver its node ID (usually --node-id=$(NODE_NAME) from the pod's \
             spec.nodeName), then restart the registrar",
        ));
    } else if info.node_id.len() > MAX_NODE_ID {
        findings.push(Finding::error(
            "driver.node-id",
            format!(
                "NodeGetInfo gives a node ID of {} bytes",
                info.node_id.len()
            ),
            format!("the CSI spec allows at most {MAX_NODE_ID}; the CSINode update is refused"),
            "shorten the driver's node ID",
        ));
    }
    if info.max_volumes_per_node < 0 {
        findings.push(Finding::error(
            "driver.max-volumes",
            format!(
                "NodeGetInfo gives max_volumes_per_node {}",
                info.max_volumes_per_node
            ),
            "a negative limit is invalid",
            "report 0 (no limit) or a positive limit",
        ));
    }
    let advertises = facts.capabilities.map(|c| c.accessibility_constraints);
    if !keys.is_empty() && advertises == Some(false) {
        findings.push(Finding::warning(
            "driver.topology",
            "NodeGetInfo gives topology, but the driver lacks the VOLUME_ACCESSIBILITY_CONSTRAINTS capability",
            "the CSI spec requires the capability; provisioners ignore the topology without it",
            "advertise VOLUME_ACCESSIBILITY_CONSTRAINTS in GetPluginCapabilities",
        ));
    }
    if !info.node_id.is_empty() && info.node_id.len() <= MAX_NODE_ID {
        let limit = match info.max_volumes_per_node {
            0 => "no volume limit stated".to_owned(),
            n => format!("at most {n} volumes"),
        };
        findings.push(Finding::ok(
            "driver.node-info",
            format!(
                "NodeGetInfo: node ID {:?}, {limit}, topology keys {}",
                info.node_id,
                gocompat::list(&keys)
            ),
        ));
    }
    facts.node_id = Some(info.node_id);
    facts.topology_keys = Some(keys);
    facts.max_volumes = Some(info.max_volumes_per_node);
}
