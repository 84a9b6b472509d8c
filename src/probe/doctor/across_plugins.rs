//! Checks across plugins, on the node as a whole: what in `plugins_registry` the kubelet
//! ignores or chokes on, registries of other kubelet roots, one driver announced twice, stale
//! sockets that are only leftovers, and driver sockets under `plugins/` that no registrar
//! announces.

use crate::plugin_registry;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::chain::Plugin;
use super::finding::{Finding, Severity};
use super::rpc::{self, DialError};
use super::scan::{self, Entry, Kind};
use super::{Context, Host, root};

/// Splits the registry's entries into the sockets to diagnose and findings about the rest.
pub fn classify(entries: Vec<Entry>) -> (Vec<PathBuf>, Vec<Finding>) {
    let mut sockets = Vec::new();
    let mut findings = Vec::new();
    for entry in entries {
        let shown = entry.path.display();
        let registration_name = entry
            .path
            .file_name()
            .is_some_and(|n| plugin_registry::driver_of(&n.to_string_lossy()).is_some());
        match entry.kind {
            Kind::Socket if entry.hidden() => findings.push(Finding::info(
                "registry.hidden",
                format!("{shown}: a socket whose name starts with a dot"),
                "the kubelet ignores it (registrars stage sockets under such names for a moment)",
            )),
            Kind::Socket => sockets.push(entry.path),
            // `<driver>-reg.sock.lock`: our registrar's claim on its socket, which the kubelet
            // ignores like every file here that is not a socket; nothing to say.
            Kind::Regular if claim_lock(&entry.path) => {}
            kind if registration_name => findings.push(Finding::error(
                "registry.not-socket",
                format!("{shown} is a {}, not a socket", kind.describe()),
                "the kubelet ignores it, and node-driver-registrar refuses to replace it and exits, \
                 so this driver cannot register",
                "delete the file (nothing but a registrar should create it)",
            )),
            kind => findings.push(Finding::info(
                "registry.ignored",
                format!("{shown} is a {}", kind.describe()),
                "the kubelet ignores everything here that is not a socket",
            )),
        }
    }
    (sockets, findings)
}

/// Whether `path` is named as a registrar's lock file beside a registration socket.
fn claim_lock(path: &Path) -> bool {
    path.file_name().is_some_and(|name| {
        name.to_string_lossy()
            .strip_suffix(crate::socket::claim::LOCK_SUFFIX)
            .and_then(plugin_registry::driver_of)
            .is_some()
    })
}

/// Registration sockets under another known kubelet root: a DaemonSet written for the wrong
/// root, whose drivers the kubelet never sees.
pub fn other_registries(host: &Host, chosen: &Path) -> Vec<Finding> {
    let chosen_id = scan::file_id(&host.path(chosen));
    let mut findings = Vec::new();
    for (other, _) in root::KNOWN_ROOTS {
        let other = Path::new(other);
        if other == chosen
            || scan::file_id(&host.path(other)).is_some_and(|id| Some(id) == chosen_id)
        {
            continue;
        }
        let registry = other.join("plugins_registry");
        let Ok(entries) = scan::registry(host, &registry) else {
            continue;
        };
        let sockets: Vec<String> = entries
            .iter()
            .filter(|e| e.kind == Kind::Socket && !e.hidden())
            .filter_map(|e| e.path.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        if sockets.is_empty() {
            continue;
        }
        findings.push(Finding::error(
            "root.other-registry",
            format!(
                "{} has registration sockets ({}), but the kubelet's root is {}",
                registry.display(),
                sockets.join(", "),
                chosen.display()
            ),
            format!(
                "the kubelet watches only {}: these drivers are never registered; their \
                 DaemonSet mounts a kubelet directory this kubelet does not use",
                chosen.join("plugins_registry").display()
            ),
            format!(
                "set the driver's kubelet directory (often the Helm value kubeletDir) to {} and \
                 redeploy it",
                chosen.display()
            ),
        ));
    }
    findings
}

fn healthy(plugin: &Plugin) -> bool {
    plugin.findings.iter().all(|f| f.severity < Severity::Error)
}

/// Two registration sockets for one driver, and stale sockets of a driver that is registered
/// through another socket (a leftover, not a failure).
pub fn cross_check(plugins: &mut [Plugin]) {
    let mut by_driver: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for plugin in plugins.iter().filter(|p| !p.other_type) {
        if let Some(driver) = plugin.driver.as_deref().filter(|d| !d.is_empty()) {
            by_driver
                .entry(driver.to_owned())
                .or_default()
                .push(plugin.socket.clone());
        }
    }
    for plugin in plugins.iter_mut() {
        let Some(sockets) = plugin.driver.as_deref().and_then(|d| by_driver.get(d)) else {
            continue;
        };
        if sockets.len() < 2 || plugin.other_type {
            continue;
        }
        let list: Vec<String> = sockets.iter().map(|s| s.display().to_string()).collect();
        plugin.findings.push(Finding::error(
            "registration.duplicate",
            format!(
                "driver {:?} is announced by {} registration sockets: {}",
                plugin.driver.as_deref().unwrap_or_default(),
                sockets.len(),
                list.join(", ")
            ),
            "the kubelet registers the first it sees and refuses the other; when either socket \
             goes, it deregisters the driver although the other is still there",
            "run one registrar per driver: remove the second DaemonSet or the leftover socket",
        ));
    }
    let live: Vec<(String, PathBuf)> = plugins
        .iter()
        .filter(|p| healthy(p))
        .filter_map(|p| Some((p.driver.clone()?, p.socket.clone())))
        .collect();
    for plugin in plugins.iter_mut() {
        let name = plugin
            .socket
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        let Some(driver) = name.as_deref().and_then(plugin_registry::driver_of) else {
            continue;
        };
        let Some((_, through)) = live.iter().find(|(d, _)| d == driver) else {
            continue;
        };
        for finding in &mut plugin.findings {
            if finding.check == "registration.stale" {
                finding.severity = Severity::Warning;
                finding.means = format!(
                    "a leftover: driver {driver} is registered through {}; the kubelet still \
                     tries this socket and logs failures",
                    through.display()
                );
                finding.fix = "delete this file".into();
            }
        }
    }
}

/// Driver sockets under `plugins/` that no registration socket announces.
pub async fn unannounced(
    ctx: Arc<Context>,
    sockets: Vec<PathBuf>,
    plugins: &[Plugin],
) -> Vec<Finding> {
    let announced: HashSet<(u64, u64)> = plugins.iter().filter_map(|p| p.endpoint_id).collect();
    let endpoints: Vec<(String, String)> = plugins
        .iter()
        .filter_map(|p| Some((p.driver.clone()?, p.endpoint.clone()?)))
        .collect();
    let mut tasks = tokio::task::JoinSet::new();
    for (index, socket) in sockets.into_iter().enumerate() {
        let id = scan::file_id(&ctx.host.path(&socket));
        if id.is_some_and(|id| announced.contains(&id)) {
            continue;
        }
        let ctx = ctx.clone();
        let endpoints = endpoints.clone();
        tasks.spawn(async move { (index, unannounced_one(&ctx, socket, &endpoints).await) });
    }
    let mut found: Vec<(usize, Finding)> = tasks.join_all().await;
    found.sort_by_key(|(index, _)| *index);
    found.into_iter().map(|(_, finding)| finding).collect()
}

async fn unannounced_one(
    ctx: &Context,
    socket: PathBuf,
    endpoints: &[(String, String)],
) -> Finding {
    let shown = socket.display();
    let channel = match rpc::dial(&ctx.host.path(&socket), ctx.timeout).await {
        Ok(channel) => channel,
        Err(DialError::Stale) => {
            return Finding::warning(
                "plugins.stale",
                format!("{shown} is a socket nobody listens on, and no registrar announces it"),
                "a leftover of a driver that crashed or was uninstalled",
                "delete it if that driver is gone; restart it if it should run",
            );
        }
        Err(error) => {
            return super::chain::dial_finding(
                ctx,
                "plugins.dial",
                "driver socket",
                &socket,
                &error,
            );
        }
    };
    let name = match rpc::plugin_info(channel.clone(), ctx.timeout).await {
        Ok(info) => info.name,
        Err(error) => {
            return Finding::warning(
                "plugins.unknown",
                format!("{shown} listens, but GetPluginInfo fails: {error}"),
                "no registrar announces it, and it does not say which driver it is",
                "check which process serves it",
            );
        }
    };
    match rpc::node_info(channel, ctx.timeout).await {
        Err(error) if error.is_unimplemented() => Finding::info(
            "plugins.no-node-service",
            format!("{shown} serves driver {name:?} without a Node service"),
            "a controller socket, nothing for the kubelet to register",
        ),
        _ => {
            if let Some((_, endpoint)) = endpoints.iter().find(|(driver, _)| *driver == name) {
                // Its registrar is reported above with an error; this is where it should point.
                return Finding::warning(
                    "plugins.unregistered",
                    format!(
                        "{shown} serves driver {name:?}, but its registrar announces the endpoint {endpoint:?}"
                    ),
                    "the kubelet dials the announced endpoint, not this socket",
                    format!("set the registrar's --kubelet-registration-path to {shown}"),
                );
            }
            let fix = format!(
                "add or repair the node-driver-registrar sidecar of {name:?}; its registration \
                 directory must be the host's {}",
                ctx.root.join("plugins_registry").display()
            );
            Finding::error(
                "plugins.unregistered",
                format!("{shown} serves driver {name:?}, but no registration socket announces it"),
                format!(
                    "the kubelet does not know this driver: its volumes fail with \"driver name \
                     {name} not found in the list of registered CSI drivers\""
                ),
                fix,
            )
        }
    }
}
