//! One plugin's registration chain, steps 4 and 5 of the flow as the kubelet walks them, read
//! only: the registration socket (a socket? anybody listening?), GetInfo (type, name,
//! versions by the kubelet's own rules), the endpoint it names (on the host? a listening
//! socket? reachable for the kubelet?), then the driver behind it ([`super::driver_facts`]).

use std::path::{Path, PathBuf};

use super::driver_facts::{self, DriverFacts};
use super::finding::Finding;
use super::rpc::{self, DialError};
use super::{Context, access};
use crate::flow::{Stamp, Timing};
use crate::gocompat;
use crate::probe::kubelet::csi_versions::validate_plugin;
use crate::socket::MAX_PATH_BYTES;

/// Plugin types the kubelet has handlers for besides CSI: normal neighbours in the registry.
const OTHER_HANDLED_TYPES: &[&str] = &["DRAPlugin", "DevicePlugin"];

/// What the doctor learnt about one registration socket.
#[derive(Debug, Clone, Default)]
pub struct Plugin {
    /// The registration socket, as a host path.
    pub socket: PathBuf,
    /// The driver name GetInfo gave.
    pub driver: Option<String>,
    /// The endpoint as GetInfo gave it (empty: the registration socket itself).
    pub endpoint: Option<String>,
    /// Device and inode of the endpoint socket, to tell which sockets under `plugins/` have a
    /// registrar.
    pub endpoint_id: Option<(u64, u64)>,
    /// Not a CSI plugin (DRA, device plugin): not checked further.
    pub other_type: bool,
    pub facts: Option<DriverFacts>,
    pub findings: Vec<Finding>,
    /// How long the calls of each step took (1 driver dial, 2 registrar dial, 3
    /// GetPluginInfo, 4 GetInfo, 5 NodeGetInfo), for `--flow`.
    pub timings: Vec<(u8, Timing)>,
}

/// What a failed dial means, for the registration socket or the driver's.
pub fn dial_finding(
    ctx: &Context,
    check: &'static str,
    what: &str,
    path: &Path,
    error: &DialError,
) -> Finding {
    let at = path.display();
    match error {
        DialError::Stale => Finding::error(
            check,
            format!("{what} {at} is a socket nobody listens on"),
            "the process that created it is gone (killed, crashed, or the node restarted)",
            "restart the container that should serve it; delete the file if that is uninstalled",
        ),
        DialError::Busy => Finding::error(
            check,
            format!("{what} {at}: {error}"),
            "the process is hung or overloaded; the kubelet's calls time out",
            "restart that container and read its logs",
        ),
        DialError::Denied(_) if !ctx.doctor_is_root => Finding::warning(
            check,
            format!("{what} {at}: {error}"),
            "the doctor is not root, the kubelet is: this says nothing about the kubelet",
            "run the doctor as root (the doctor pod manifest does)",
        ),
        DialError::Denied(_) => Finding::error(
            check,
            format!("{what} {at}: {error}, even for root"),
            "a security module (SELinux, AppArmor) refuses the connection, and would refuse the \
             kubelet too; the doctor does not check those policies",
            "look for denials in the audit log; SELinux hosts need the socket labelled for the \
             kubelet (upstream runs such sidecars privileged)",
        ),
        DialError::Timeout(_) => Finding::error(
            check,
            format!("{what} {at}: {error}"),
            "the process is hung",
            "restart that container and read its logs",
        ),
        DialError::Missing | DialError::Other(_) => Finding::error(
            check,
            format!("{what} {at}: {error}"),
            "the kubelet cannot connect either",
            "check the path and the process that should serve it",
        ),
    }
}

/// Walks the chain of the registration socket at `socket` (a host path).
pub async fn diagnose(ctx: &Context, socket: PathBuf) -> Plugin {
    let mut plugin = Plugin {
        socket: socket.clone(),
        ..Default::default()
    };
    let findings = &mut plugin.findings;
    let local = ctx.host.path(&socket);
    findings.extend(unreachable(ctx, "registration.permissions", &socket));
    let stamp = Stamp::now();
    let dialed = rpc::dial(&local, ctx.timeout).await;
    plugin.timings.push((2, stamp.timing()));
    let channel = match dialed {
        Ok(channel) => channel,
        Err(DialError::Stale) => {
            findings.push(Finding::error(
                "registration.stale",
                format!("{} is a socket nobody listens on", socket.display()),
                "a stale registration socket: its registrar is gone (killed, or the node \
                 restarted); the kubelet fails to register it and retries, backing off to 2 \
                 minutes",
                "restart the driver's node-driver-registrar (it replaces its own stale socket); \
                 if the driver is uninstalled, delete this file",
            ));
            return plugin;
        }
        Err(error) => {
            findings.push(dial_finding(
                ctx,
                "registration.dial",
                "registration socket",
                &socket,
                &error,
            ));
            return plugin;
        }
    };
    let stamp = Stamp::now();
    let answer = rpc::get_info(channel, ctx.timeout).await;
    plugin.timings.push((4, stamp.timing()));
    let info = match answer {
        Ok(info) => info,
        Err(error) => {
            let means = if error.is_timeout() {
                "the registrar accepts connections but does not answer; the kubelet gives up \
                 after 1 s and retries with back-off"
            } else {
                "the kubelet's first call fails, so it cannot register the plugin"
            };
            findings.push(Finding::error(
                "registration.get-info",
                format!("GetInfo on {}: {error}", socket.display()),
                means,
                "restart the registrar container and read its logs",
            ));
            return plugin;
        }
    };
    plugin.driver = Some(info.name.clone());
    plugin.endpoint = Some(info.endpoint.clone());
    findings.push(Finding::ok(
        "registration.get-info",
        format!(
            "GetInfo: type {}, driver {:?}, endpoint {:?}, versions {}",
            info.r#type,
            info.name,
            info.endpoint,
            gocompat::list(&info.supported_versions)
        ),
    ));
    if info.r#type != "CSIPlugin" {
        plugin.other_type = true;
        if OTHER_HANDLED_TYPES.contains(&info.r#type.as_str()) {
            findings.push(Finding::info(
                "registration.type",
                format!("a {} socket, not a CSI driver", info.r#type),
                "the kubelet handles it elsewhere; the doctor checks CSI drivers only",
            ));
        } else {
            findings.push(Finding::error(
                "registration.type",
                format!("GetInfo gives the plugin type {:?}", info.r#type),
                "the kubelet has no handler for that type and refuses the plugin",
                "a CSI registrar must answer type CSIPlugin: check which program serves this socket",
            ));
        }
        return plugin;
    }
    if info.name.is_empty() {
        findings.push(Finding::error(
            "registration.name",
            "GetInfo gives an empty driver name",
            "the kubelet cannot register a nameless driver",
            "the registrar learns the name from the driver's GetPluginInfo: check the driver",
        ));
        return plugin;
    }
    let endpoint = if info.endpoint.is_empty() {
        socket.display().to_string()
    } else {
        info.endpoint.clone()
    };
    if let Err(text) = validate_plugin(&info.name, &endpoint, &info.supported_versions, None) {
        findings.push(Finding::error(
            "registration.versions",
            format!(
                "the kubelet refuses the supported versions {}",
                gocompat::list(&info.supported_versions)
            ),
            format!("it answers NotifyRegistrationStatus(false) with: {text}"),
            "the registrar must report 1.x versions (node-driver-registrar reports 1.0.0): \
             replace or upgrade it",
        ));
    }
    let Some(target) = check_endpoint(ctx, &mut plugin, &info.name, &info.endpoint).await else {
        return plugin;
    };
    let (facts, found) = driver_facts::examine(ctx, target, &info.name, &mut plugin.timings).await;
    plugin.findings.extend(found);
    plugin.facts = Some(facts);
    plugin
}

/// A finding for each kubelet that runs as another user than root and cannot reach `path`.
fn unreachable(ctx: &Context, check: &'static str, path: &Path) -> Vec<Finding> {
    ctx.kubelet_users
        .iter()
        .filter_map(|kubelet| {
            let why = access::can_connect(&ctx.host, path, &kubelet.credentials).err()?;
            Some(Finding::error(
                check,
                format!("{kubelet} and cannot pass: {why}"),
                "a kubelet that is not root needs search permission on every directory and \
                 write permission on the socket",
                "open the directory or socket to the kubelet's user or group (--socket-mode, \
                 --socket-group)",
            ))
        })
        .collect()
}

/// Checks the endpoint GetInfo named; on success, the dialled channel and the endpoint's host
/// path.
async fn check_endpoint(
    ctx: &Context,
    plugin: &mut Plugin,
    driver: &str,
    given: &str,
) -> Option<(tonic::transport::Channel, PathBuf)> {
    let shown = if given.is_empty() {
        plugin.socket.clone()
    } else {
        let path = given
            .strip_prefix("unix://")
            .or_else(|| given.strip_prefix("unix:"))
            .unwrap_or(given);
        PathBuf::from(path)
    };
    let findings = &mut plugin.findings;
    if !shown.is_absolute() {
        findings.push(Finding::error(
            "endpoint.relative",
            format!("the endpoint {given:?} is not an absolute path"),
            "the kubelet resolves it against its own working directory and finds nothing",
            "give the registrar --kubelet-registration-path as an absolute host path",
        ));
        return None;
    }
    let len = shown.as_os_str().len();
    if len > MAX_PATH_BYTES {
        findings.push(Finding::error(
            "endpoint.too-long",
            format!("the endpoint {} is {len} bytes long", shown.display()),
            format!("a Unix socket path holds at most {MAX_PATH_BYTES} bytes: the kubelet's connect fails"),
            "move the driver socket to a shorter path",
        ));
        return None;
    }
    let local = ctx.host.path(&shown);
    // Off the async threads and bounded: a path through a hung mount costs one timeout.
    let looked_up = local.clone();
    let inspected = super::blocking(ctx.timeout, move || {
        let kind = super::scan::Kind::of(&looked_up).ok().flatten();
        (kind, super::scan::file_id(&looked_up))
    })
    .await;
    let Some((kind, endpoint_id)) = inspected else {
        findings.push(Finding::error(
            "endpoint.hung",
            format!(
                "looking up the endpoint {} took longer than {:?}",
                shown.display(),
                ctx.timeout
            ),
            "a filesystem on the way does not answer (a hung network mount?); the kubelet hangs \
             there too",
            "check the node's mounts",
        ));
        return None;
    };
    match kind {
        Some(super::scan::Kind::Socket) => {}
        None | Some(super::scan::Kind::DanglingLink) => {
            findings.push(missing_endpoint(ctx, driver, &shown));
            return None;
        }
        Some(other) => {
            findings.push(Finding::error(
                "endpoint.not-socket",
                format!(
                    "the endpoint {} is a {}, not a socket",
                    shown.display(),
                    other.describe()
                ),
                "the kubelet cannot connect to it",
                "point --kubelet-registration-path at the driver's socket",
            ));
            return None;
        }
    }
    plugin.endpoint_id = endpoint_id;
    findings.extend(unreachable(ctx, "endpoint.permissions", &shown));
    let stamp = Stamp::now();
    let dialed = rpc::dial(&local, ctx.timeout).await;
    plugin.timings.push((1, stamp.timing()));
    match dialed {
        Ok(channel) => {
            findings.push(Finding::ok(
                "endpoint.socket",
                format!("endpoint {} is a listening socket", shown.display()),
            ));
            Some((channel, shown))
        }
        Err(DialError::Stale) => {
            findings.push(Finding::error(
                "endpoint.stale",
                format!(
                    "the endpoint {} is a socket nobody listens on",
                    shown.display()
                ),
                "the registrar is up but its driver is not: the kubelet's NodeGetInfo fails, and \
                 volume calls for this driver fail",
                "restart the driver container and read its logs (the registrar does not notice \
                 a dead driver)",
            ));
            None
        }
        Err(error) => {
            findings.push(dial_finding(
                ctx,
                "endpoint.dial",
                "endpoint",
                &shown,
                &error,
            ));
            None
        }
    }
}

/// The endpoint is not on the host: usually a container path given as the host path — unless
/// the doctor looks at the host under a prefix, where the endpoint is: then changing the
/// registrar would break a working driver, and the hint is to run the doctor right.
fn missing_endpoint(ctx: &Context, driver: &str, shown: &Path) -> Finding {
    if let Some(prefix) = &ctx.host_prefix {
        let under = prefix.join(shown.strip_prefix("/").unwrap_or(shown));
        if super::scan::Kind::of(&under).ok().flatten() == Some(super::scan::Kind::Socket) {
            return Finding::warning(
                "endpoint.under-prefix",
                format!(
                    "the endpoint {} is not in the doctor's filesystem, but {} is a socket",
                    shown.display(),
                    under.display()
                ),
                format!(
                    "the endpoint is a host path, and the doctor sees the host under {} \
                     (root.prefixed): the kubelet finds it; this driver was not checked further",
                    prefix.display()
                ),
                format!(
                    "run the doctor with --host-root={} to check it; do not change the \
                     registrar's --kubelet-registration-path",
                    prefix.display()
                ),
            );
        }
    }
    let mut means = String::from(
        "the kubelet cannot connect to the driver: either the driver is not running (its \
         socket gone) or the registrar was given a path that exists only inside its container",
    );
    if !shown.starts_with(&ctx.root) {
        means.push_str(&format!(
            "; the path is outside the kubelet root {}, which suggests the registrar's own \
             --csi-address or a DaemonSet written for another kubelet root",
            ctx.root.display()
        ));
    }
    let expected = ctx.root.join("plugins").join(driver).join("csi.sock");
    let fix = if expected != shown
        && super::scan::Kind::of(&ctx.host.path(&expected))
            .ok()
            .flatten()
            == Some(super::scan::Kind::Socket)
    {
        format!(
            "a socket exists at {}: pass that to the registrar as --kubelet-registration-path",
            expected.display()
        )
    } else {
        format!(
            "set the registrar's --kubelet-registration-path to the driver socket's host path \
             (usually {}), and check that the driver runs",
            expected.display()
        )
    };
    let mut saw = format!(
        "the endpoint {} does not exist on the host",
        shown.display()
    );
    if let Some(root) = &ctx.host.root {
        saw.push_str(&format!(" (looked under --host-root {})", root.display()));
    }
    Finding::error("endpoint.missing", saw, means, fix)
}
