//! `probe doctor`: why is my driver not registered? Walks the registration chain of every
//! plugin on a live node — registry entry, GetInfo, endpoint, driver — and, with API access,
//! compares the CSINode, CSIDriver and Node objects with what the node shows. Read-only: it
//! never calls NotifyRegistrationStatus (that would interfere with the real kubelet, and an
//! upstream registrar exits on `false`), and never creates, removes or changes a file.
//!
//! - [`root`] — which kubelet root, and why (flag, `/proc`, known locations).
//! - [`scan`] — `plugins_registry` and `plugins/` listed without touching them.
//! - [`chain`] — one registration socket: GetInfo, versions, endpoint; [`driver`] — the driver.
//! - [`node`] — checks across plugins: duplicates, leftovers, unannounced driver sockets.
//! - [`rpc`] — every dial and call, each under `--timeout`; [`access`] — a non-root kubelet's
//!   permissions.
//! - `api` — the read-only Kubernetes API comparisons (feature `kube-api`).
//! - [`finding`], [`report`] — what the operator reads.

mod access;
#[cfg(feature = "kube-api")]
pub mod api;
pub mod chain;
mod driver;
pub mod finding;
mod node;
pub mod report;
pub mod root;
mod rpc;
mod scan;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use argh::{ArgsInfo, FromArgs};

pub use finding::{Finding, Severity};
pub use report::Report;

use crate::gocompat::GoDuration;
use crate::probe::kubelet::Output;
use crate::runtime::Threads;
use crate::{BoxError, UsageError};

crate::mode_args! {
    #[derive(FromArgs, ArgsInfo, Debug)]
    #[argh(subcommand, name = "doctor")]
    /// Diagnose CSI driver registration on this node, read-only. Exit 0 when no check found an
    /// error (warnings do not count), 1 when one did, 2 for bad usage.
    pub struct Args {
        /// the kubelet's root directory (default: the running kubelet's --root-dir, else a known
        /// location)
        #[argh(option)]
        pub kubelet_root: Option<PathBuf>,
        /// where the host's / is mounted, when the doctor runs in a container
        #[argh(option)]
        pub host_root: Option<PathBuf>,
        /// where to look for the kubelet process (needs the host's PID namespace)
        #[argh(option, default = "PathBuf::from(\"/proc\")")]
        pub proc_root: PathBuf,
        /// deadline of each connection and each call (Go duration)
        #[argh(option, default = "GoDuration(Duration::from_secs(2))")]
        pub timeout: GoDuration,
        /// report format: text or json
        #[argh(option, default = "String::from(\"text\")")]
        pub output: String,
        /// node whose CSINode and Node objects to compare (default: $NODE_NAME, else the host
        /// name)
        #[argh(option)]
        pub node_name: Option<String>,
        /// kubeconfig for reading the API objects (default: in-cluster credentials, if present)
        #[argh(option)]
        pub kubeconfig: Option<PathBuf>,
        /// do not read the Kubernetes API, even with credentials at hand
        #[argh(switch)]
        pub no_api: bool,
    }
}

/// Host paths as the doctor reaches them: under `--host-root` when it runs in a container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Host {
    pub root: Option<PathBuf>,
}

impl Host {
    /// Where the host path `path` is in the doctor's own filesystem.
    pub fn path(&self, path: &Path) -> PathBuf {
        match &self.root {
            Some(root) => root.join(path.strip_prefix("/").unwrap_or(path)),
            None => path.to_owned(),
        }
    }
}

/// How the API objects are to be read.
#[derive(Debug, Clone)]
pub enum ApiAccess {
    Off,
    #[cfg(feature = "kube-api")]
    On(api::Access),
    /// In a pod whose service-account files cannot be used: reported as a finding.
    #[cfg(feature = "kube-api")]
    Unusable(String),
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub kubelet_root: Option<PathBuf>,
    pub host: Host,
    pub proc_root: PathBuf,
    pub timeout: Duration,
    pub output: Output,
    pub node_name: String,
    pub api: ApiAccess,
}

/// A flag that cannot be used; `main` exits 2 with it.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("--output: {0}")]
    Output(#[source] crate::probe::kubelet::report::UnknownOutput),
    #[error("--timeout must be more than zero")]
    Timeout,
    #[error("--kubelet-root must be an absolute path")]
    RelativeRoot,
    #[cfg(feature = "kube-api")]
    #[error(transparent)]
    Api(api::AccessError),
    #[cfg(not(feature = "kube-api"))]
    #[error(
        "--kubeconfig {}: this binary was built without the kube-api feature",
        .0.display()
    )]
    ApiNotBuilt(PathBuf),
}

impl Settings {
    /// The flags, validated: a bad one is a usage error (exit 2).
    pub fn from_args(args: Args) -> Result<Self, BoxError> {
        Self::validate(args).map_err(|e| UsageError::new(e).into())
    }

    fn validate(args: Args) -> Result<Self, SettingsError> {
        let output = args.output.parse().map_err(SettingsError::Output)?;
        if args.timeout.0.is_zero() {
            return Err(SettingsError::Timeout);
        }
        // Only the API comparisons need it; without one they say so.
        let node_name = crate::probe::kubelet::node_name(args.node_name).unwrap_or_default();
        if args.kubelet_root.as_ref().is_some_and(|r| !r.is_absolute()) {
            return Err(SettingsError::RelativeRoot);
        }
        let api = if args.no_api {
            ApiAccess::Off
        } else {
            api_access(args.kubeconfig.as_deref())?
        };
        Ok(Self {
            kubelet_root: args.kubelet_root,
            host: Host {
                root: args.host_root,
            },
            proc_root: args.proc_root,
            timeout: args.timeout.0,
            output,
            node_name,
            api,
        })
    }
}

#[cfg(feature = "kube-api")]
fn api_access(kubeconfig: Option<&Path>) -> Result<ApiAccess, SettingsError> {
    if let Some(path) = kubeconfig {
        let access = api::Access::from_kubeconfig(path).map_err(SettingsError::Api)?;
        return Ok(ApiAccess::On(access));
    }
    Ok(match api::Access::in_cluster(&api::InCluster::from_env()) {
        None => ApiAccess::Off,
        Some(Ok(access)) => ApiAccess::On(access),
        Some(Err(e)) => ApiAccess::Unusable(e.to_string()),
    })
}

#[cfg(not(feature = "kube-api"))]
fn api_access(kubeconfig: Option<&Path>) -> Result<ApiAccess, SettingsError> {
    match kubeconfig {
        Some(path) => Err(SettingsError::ApiNotBuilt(path.to_owned())),
        None => Ok(ApiAccess::Off),
    }
}

/// Why the doctor exits 1.
#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    /// The report has errors; it was printed.
    #[error("the doctor found {errors} {}", if *errors == 1 { "error" } else { "errors" })]
    Unhealthy { errors: usize },
}

/// What the chain checks share.
#[derive(Debug)]
pub struct Context {
    pub host: Host,
    pub timeout: Duration,
    /// The kubelet root (a host path).
    pub root: PathBuf,
    /// Who the kubelet runs as, when that is not root: its permissions are checked.
    kubelet_credentials: Option<access::Credentials>,
    /// Whether a refused connection says something about the kubelet (a root doctor) or only
    /// about the doctor.
    doctor_is_root: bool,
}

/// Diagnoses, prints the report, and fails when it has errors.
pub fn run(settings: Settings) -> Result<(), BoxError> {
    let threads = Threads::Multi {
        workers: 2,
        blocking: None,
    };
    // A filesystem call stuck on a hung mount must not keep the process alive.
    let report = crate::runtime::run_detached(threads, async { Ok(diagnose(&settings).await) })?;
    println!("{}", report.render(settings.output));
    match report.count(Severity::Error) {
        0 => Ok(()),
        errors => Err(DoctorError::Unhealthy { errors }.into()),
    }
}

/// Runs blocking filesystem work off the async threads, bounded by `limit`.
async fn blocking<T: Send + 'static>(
    limit: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let task = tokio::task::spawn_blocking(work);
    tokio::time::timeout(limit, task).await.ok()?.ok()
}

/// The whole diagnosis; every plugin concurrently.
pub async fn diagnose(settings: &Settings) -> Report {
    let started = Instant::now();
    let host = settings.host.clone();
    let scan_limit = settings.timeout * 2;
    let (proc_root, probe_host) = (settings.proc_root.clone(), host.clone());
    let kubelets = blocking(scan_limit, move || {
        root::find_kubelets(&proc_root, &probe_host)
    })
    .await
    .unwrap_or_default();
    let (decision, mut node) = root::decide(settings.kubelet_root.as_deref(), &kubelets, &host);
    let mut report = Report {
        root: decision.clone(),
        host_root: host.root.clone(),
        node_name: settings.node_name.clone(),
        api: None,
        node: Vec::new(),
        plugins: Vec::new(),
        elapsed: Duration::ZERO,
    };
    let Some(root) = decision.path else {
        report.node = node;
        report.elapsed = started.elapsed();
        return report;
    };
    let registry = root.join("plugins_registry");
    let (scan_host, scan_root) = (host.clone(), root.clone());
    let scanned = blocking(scan_limit, move || {
        let entries = scan::registry(&scan_host, &scan_root.join("plugins_registry"));
        let others = node::other_registries(&scan_host, &scan_root);
        let sockets = scan::plugin_sockets(&scan_host, &scan_root.join("plugins"));
        (entries, others, sockets)
    })
    .await;
    let Some((entries, others, plugin_sockets)) = scanned else {
        node.push(Finding::error(
            "registry.hung",
            format!("listing {} took longer than {scan_limit:?}", root.display()),
            "a filesystem on the way does not answer (a hung network mount?)",
            "check the node's mounts",
        ));
        report.node = node;
        report.elapsed = started.elapsed();
        return report;
    };
    let registry_ok = entries.is_ok();
    let entries = entries.unwrap_or_else(|e| {
        node.push(registry_unusable(&registry, &e));
        Vec::new()
    });
    node.extend(others);
    let (sockets, found) = node::classify(entries);
    node.extend(found);
    if sockets.is_empty() && registry_ok {
        node.push(Finding::warning(
            "registry.empty",
            format!("{} holds no registration socket", registry.display()),
            "no registrar runs on this node, so the kubelet registers no CSI driver",
            "check that the driver's DaemonSet has a pod on this node, with its registrar \
             container running and the host's plugins_registry mounted",
        ));
    }
    let ctx = Arc::new(Context {
        host,
        timeout: settings.timeout,
        root,
        kubelet_credentials: kubelets.first().and_then(|k| {
            let uid = k.uid.filter(|uid| *uid != 0)?;
            Some(access::Credentials {
                uid,
                groups: k.groups.clone(),
            })
        }),
        doctor_is_root: nix::unistd::geteuid().is_root(),
    });
    let mut tasks = tokio::task::JoinSet::new();
    for (index, socket) in sockets.into_iter().enumerate() {
        let ctx = ctx.clone();
        tasks.spawn(async move { (index, chain::diagnose(&ctx, socket).await) });
    }
    let mut plugins: Vec<(usize, chain::Plugin)> = tasks.join_all().await;
    plugins.sort_by_key(|(index, _)| *index);
    let mut plugins: Vec<chain::Plugin> = plugins.into_iter().map(|(_, p)| p).collect();
    node::cross_check(&mut plugins);
    node.extend(node::unannounced(ctx.clone(), plugin_sockets, &plugins).await);
    #[cfg(feature = "kube-api")]
    match &settings.api {
        ApiAccess::Off => {}
        ApiAccess::On(access) => {
            report.api = Some(access.describe());
            node.extend(
                api::compare(access, &settings.node_name, &plugins, settings.timeout).await,
            );
        }
        ApiAccess::Unusable(why) => node.push(Finding::warning(
            "api.unavailable",
            format!("in-cluster credentials: {why}"),
            "the comparison with the API objects was skipped",
            "mount the service account token (automountServiceAccountToken), or pass --no-api",
        )),
    }
    report.node = node;
    report.plugins = plugins;
    report.elapsed = started.elapsed();
    report
}

fn registry_unusable(registry: &Path, error: &io::Error) -> Finding {
    if error.kind() == io::ErrorKind::NotFound {
        Finding::error(
            "root.no-registry",
            format!("{} does not exist", registry.display()),
            "the kubelet creates it when it starts: this is not the kubelet's root, or no \
             kubelet ever ran here",
            "give --kubelet-root the kubelet's --root-dir (the doctor never creates it)",
        )
    } else {
        Finding::error(
            "root.no-registry",
            format!("cannot list {}: {error}", registry.display()),
            "the doctor cannot see the registration sockets",
            "run the doctor as root with the kubelet directory mounted",
        )
    }
}
