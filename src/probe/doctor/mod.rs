//! `probe doctor`: why is my driver not registered? Walks the registration chain of every
//! plugin on a live node — registry entry, GetInfo, endpoint, driver — and, with API access,
//! compares the CSINode, CSIDriver and Node objects with what the node shows. Read-only: it
//! never calls NotifyRegistrationStatus (that would interfere with the real kubelet, and an
//! upstream registrar exits on `false`), and never creates, removes or changes a file (but the
//! `--flow` picture it is asked to write).
//!
//! - [`root`] — which kubelet root, and why (flag, `/proc`, known locations);
//!   [`kubelet_process`] — the kubelets `/proc` shows and the root each runs with.
//! - [`scan`] — `plugins_registry` and `plugins/` listed without touching them.
//! - [`chain`] — one registration socket: GetInfo, versions, endpoint; [`driver_facts`] — the driver.
//! - [`across_plugins`] — checks on the node as a whole: duplicates, leftovers, unannounced
//!   driver sockets.
//! - [`rpc`] — every dial and call, each under `--timeout`; [`access`] — a non-root kubelet's
//!   permissions.
//! - `api` — the read-only Kubernetes API comparisons (feature `kube-api`).
//! - [`finding`], [`report`] — what the operator reads; `flow` — `--flow`, the findings drawn
//!   as the flow's steps; `settings` — flags to settings.

mod access;
mod across_plugins;
#[cfg(feature = "kube-api")]
pub mod api;
pub mod chain;
mod driver_facts;
pub mod finding;
mod flow;
pub mod kubelet_process;
pub mod report;
pub mod root;
mod rpc;
mod scan;
mod settings;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use finding::{Finding, Severity};
pub use report::Report;
pub use settings::{ApiAccess, Args, Host, Settings, SettingsError};

use crate::runtime::Threads;
use crate::{BoxError, Reported, UsageError};

/// Why the doctor could not check the node: `main` exits 2 with it, and no report is printed
/// (a report would read as a diagnosis of a node the doctor never saw).
#[derive(Debug, thiserror::Error)]
pub enum CannotCheck {
    #[error(
        "must run as root: as uid {0} it cannot read the kubelet's directories or connect to \
         its sockets, and would report a broken node as healthy"
    )]
    NotRoot(u32),
    #[error("--host-root {}: {source}", .path.display())]
    HostRoot { path: PathBuf, source: io::Error },
    #[error("--proc-root {}: {source}", .path.display())]
    ProcRoot { path: PathBuf, source: io::Error },
    #[error("cannot list {}: {source}", .path.display())]
    Unreadable { path: PathBuf, source: io::Error },
}

/// What the chain checks share.
#[derive(Debug)]
pub struct Context {
    pub host: Host,
    pub timeout: Duration,
    /// The kubelet root (a host path).
    pub root: PathBuf,
    /// The kubelets that do not run as root: each one's permissions are checked.
    kubelet_users: Vec<access::KubeletUser>,
    /// Whether a refused connection says something about the kubelet (a root doctor) or only
    /// about the doctor.
    doctor_is_root: bool,
    /// The prefix of a `--kubelet-root` given as a host seen under it, without `--host-root`
    /// ([`root::host_prefix`]): the plugins' host paths are then there.
    host_prefix: Option<PathBuf>,
}

/// Diagnoses, prints the report, and fails when it has errors.
pub fn run(settings: Settings) -> Result<(), BoxError> {
    let threads = Threads::Multi {
        workers: 2,
        blocking: None,
    };
    able_to_check(&settings)?;
    // A filesystem call stuck on a hung mount must not keep the process alive.
    let diagnosed = crate::runtime::run_detached(threads, async { Ok(diagnose(&settings).await) })?;
    let report = diagnosed.map_err(UsageError::new)?;
    crate::cli::print_line(&report.render(settings.output))?;
    if let Some(file) = &settings.flow {
        file.write(&flow::draw(&report))?;
    }
    match report.count(Severity::Error) {
        0 => Ok(()),
        // The report says what is wrong; the doctor itself did not fail.
        errors => Err(Reported(format!("the doctor found {errors} error(s)")).into()),
    }
}

/// What the doctor needs before it can tell anything: root, and the roots it was given.
fn able_to_check(settings: &Settings) -> Result<(), UsageError> {
    let euid = nix::unistd::geteuid();
    if !euid.is_root() {
        return Err(UsageError::new(CannotCheck::NotRoot(euid.as_raw())));
    }
    let directory = |path: &Path| std::fs::read_dir(path).map(drop);
    if let Some(root) = &settings.host.root {
        directory(root).map_err(|source| {
            UsageError::new(CannotCheck::HostRoot {
                path: root.clone(),
                source,
            })
        })?;
    }
    match settings.proc_root_given {
        true => directory(&settings.proc_root).map_err(|source| {
            UsageError::new(CannotCheck::ProcRoot {
                path: settings.proc_root.clone(),
                source,
            })
        }),
        false => Ok(()),
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

/// The whole diagnosis; every plugin concurrently. A registry that is there but cannot be
/// listed means the doctor could not check.
pub async fn diagnose(settings: &Settings) -> Result<Report, CannotCheck> {
    let started = Instant::now();
    let host = settings.host.clone();
    let scan_limit = settings.timeout * 2;
    let (proc_root, probe_host) = (settings.proc_root.clone(), host.clone());
    let kubelets = blocking(scan_limit, move || {
        kubelet_process::find_kubelets(&proc_root, &probe_host)
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
        return Ok(report);
    };
    let registry = root.join("plugins_registry");
    let (scan_host, scan_root) = (host.clone(), root.clone());
    let scanned = blocking(scan_limit, move || {
        let entries = scan::registry(&scan_host, &scan_root.join("plugins_registry"));
        let others = across_plugins::other_registries(&scan_host, &scan_root);
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
        return Ok(report);
    };
    let registry_ok = entries.is_ok();
    let entries = match entries {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            node.push(registry_missing(&registry));
            Vec::new()
        }
        Err(source) => {
            let path = host.path(&registry);
            return Err(CannotCheck::Unreadable { path, source });
        }
    };
    node.extend(others);
    let (sockets, found) = across_plugins::classify(entries);
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
    let kubelet_users = kubelet_users(&kubelets, &root);
    let ctx = Arc::new(Context {
        host,
        timeout: settings.timeout,
        root,
        kubelet_users,
        doctor_is_root: nix::unistd::geteuid().is_root(),
        host_prefix: settings
            .kubelet_root
            .as_deref()
            .and_then(|given| root::host_prefix(given, &settings.host))
            .map(|(prefix, _)| prefix),
    });
    let mut tasks = tokio::task::JoinSet::new();
    for (index, socket) in sockets.into_iter().enumerate() {
        let ctx = ctx.clone();
        tasks.spawn(async move { (index, chain::diagnose(&ctx, socket).await) });
    }
    let mut plugins: Vec<(usize, chain::Plugin)> = tasks.join_all().await;
    plugins.sort_by_key(|(index, _)| *index);
    let mut plugins: Vec<chain::Plugin> = plugins.into_iter().map(|(_, p)| p).collect();
    across_plugins::cross_check(&mut plugins);
    node.extend(across_plugins::unannounced(ctx.clone(), plugin_sockets, &plugins).await);
    // Without the kube-api feature, `Off` is the only way.
    #[allow(irrefutable_let_patterns)]
    if let ApiAccess::Off(why) = &settings.api {
        node.push(Finding::info(
            "api.skipped",
            "the comparison with the CSINode, CSIDriver and Node objects was skipped",
            format!("the Kubernetes API was not read: {why}"),
        ));
    }
    #[cfg(feature = "kube-api")]
    match &settings.api {
        ApiAccess::Off(_) => {}
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
    Ok(report)
}

/// The kubelets whose permissions matter for the sockets under `root`: those that run with
/// that root (each dials the sockets its registry announces), or every kubelet when none
/// does (the root came from `--kubelet-root` or a known location, and any could be the one);
/// those running as root pass every check and are left out.
fn kubelet_users(
    kubelets: &[kubelet_process::KubeletProcess],
    root: &Path,
) -> Vec<access::KubeletUser> {
    let with_root: Vec<&kubelet_process::KubeletProcess> =
        kubelets.iter().filter(|k| k.root == root).collect();
    let relevant = match with_root.is_empty() {
        true => kubelets.iter().collect(),
        false => with_root,
    };
    relevant
        .into_iter()
        .filter_map(|k| {
            let uid = k.uid.filter(|uid| *uid != 0)?;
            Some(access::KubeletUser {
                pid: k.pid,
                program: k.program.clone(),
                credentials: access::Credentials {
                    uid,
                    groups: k.groups.clone(),
                },
            })
        })
        .collect()
}

fn registry_missing(registry: &Path) -> Finding {
    Finding::error(
        "root.no-registry",
        format!("{} does not exist", registry.display()),
        "the kubelet creates it when it starts: this is not the kubelet's root, or no kubelet \
         ever ran here",
        "give --kubelet-root the kubelet's --root-dir (the doctor never creates it)",
    )
}
