//! The doctor's flags and the settings they validate into: `Args` (typed values, refused
//! while parsing) → `Settings::from_args` (an unusable kubeconfig is a [`SettingsError`],
//! exit 2) → `run`. API credentials are read here, so an
//! unusable kubeconfig is reported before anything is diagnosed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use argh::{ArgsInfo, FromArgs};

#[cfg(feature = "kube-api")]
use super::api;
use crate::cli::values::{AbsolutePath, PositiveDuration};
use crate::probe::kubelet::Output;
use crate::{BoxError, UsageError};

crate::mode_args! {
    #[derive(FromArgs, ArgsInfo, Debug)]
    #[argh(subcommand, name = "doctor")]
    /// Diagnose CSI driver registration on this node, read-only, as root. Exit 0 when no check
    /// found an error (warnings do not count), 1 when one did, 2 when it could not check (bad
    /// usage, not root, a root it was given that is not there, a registry it cannot list).
    pub struct Args {
        /// the kubelet's root directory, absolute (default: the running kubelet's --root-dir,
        /// else a known location)
        #[argh(option)]
        pub kubelet_root: Option<AbsolutePath>,
        /// where the host's / is mounted, when the doctor runs in a container
        #[argh(option)]
        pub host_root: Option<PathBuf>,
        /// where to look for the kubelet process (needs the host's PID namespace); given, it
        /// must exist (default: /proc, where a missing one means no kubelet is visible)
        #[argh(option)]
        pub proc_root: Option<PathBuf>,
        /// deadline of each connection and each call (default 2s)
        #[argh(option, default = "PositiveDuration::from_secs(2)", arg_name = "duration")]
        pub timeout: PositiveDuration,
        /// report format: text or json (default "text")
        #[argh(option, default = "Output::Text")]
        pub output: Output,
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
        /// draw each plugin's steps as a sequence diagram in this file: .svg, or .mmd/.md
        /// (Mermaid)
        #[argh(option)]
        pub flow: Option<crate::flow::FlowFile>,
    }
}

/// Host paths as the doctor reaches them: under `--host-root` when it runs in a container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Host {
    pub root: Option<PathBuf>,
}

/// How many symbolic links one lookup follows before giving up, as the kernel (`ELOOP`).
const MAX_LINKS: usize = 40;

impl Host {
    /// Where the host path `path` is in the doctor's own filesystem. Under `--host-root`,
    /// symbolic links are resolved as the host sees them: an absolute target starts again at
    /// the host root and `..` stops there, so a `/var/lib/kubelet -> /data/kubelet` is followed
    /// to the host's `/data/kubelet`, and no link leads outside the host root.
    pub fn path(&self, path: &Path) -> PathBuf {
        match &self.root {
            Some(root) => resolve_beneath(root, path),
            None => path.to_owned(),
        }
    }

    /// Where the entry `path` itself is, not what it links to: its directory resolved as
    /// [`Host::path`] does, its last name kept (for `lstat`).
    pub fn entry(&self, path: &Path) -> PathBuf {
        match (&self.root, path.parent(), path.file_name()) {
            (Some(_), Some(dir), Some(name)) => self.path(dir).join(name),
            _ => self.path(path),
        }
    }
}

/// `path` (a host path) resolved under `root` with every link followed inside it, as
/// `openat2`'s `RESOLVE_IN_ROOT` does; what does not exist is kept as written.
fn resolve_beneath(root: &Path, path: &Path) -> PathBuf {
    use std::path::Component;
    let mut resolved = PathBuf::new();
    // The names still to walk, the next one last.
    let names = |path: &Path| -> Vec<std::ffi::OsString> {
        let names = path.components().rev().filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_owned()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        });
        names.collect()
    };
    let mut pending = names(path);
    let mut links = 0;
    while let Some(name) = pending.pop() {
        if name == ".." {
            resolved.pop();
            continue;
        }
        let here = root.join(&resolved).join(&name);
        let target = match std::fs::read_link(&here) {
            Ok(target) if links < MAX_LINKS => target,
            _ => {
                resolved.push(name);
                continue;
            }
        };
        links += 1;
        if target.is_absolute() {
            resolved.clear();
        }
        pending.extend(names(&target));
    }
    root.join(resolved)
}

/// How the API objects are to be read.
#[derive(Debug, Clone)]
pub enum ApiAccess {
    /// Not read, and why (the report says so).
    Off(&'static str),
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
    /// Whether `--proc-root` was given: then it must exist. The default `/proc` may be missing
    /// (a chroot, an image run bare), and the known locations are tried instead.
    pub proc_root_given: bool,
    pub timeout: Duration,
    pub output: Output,
    pub node_name: String,
    pub api: ApiAccess,
    /// Where to draw the steps, if anywhere.
    pub flow: Option<crate::flow::FlowFile>,
}

/// A flag that cannot be used; `main` exits 2 with it.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
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
        // Only the API comparisons need it; without one they say so.
        let node_name = crate::probe::kubelet::node_name(args.node_name).unwrap_or_default();
        let api = if args.no_api {
            ApiAccess::Off("--no-api was given")
        } else {
            api_access(args.kubeconfig.as_deref())?
        };
        Ok(Self {
            kubelet_root: args.kubelet_root.map(AbsolutePath::into_path),
            host: Host {
                root: args.host_root,
            },
            proc_root_given: args.proc_root.is_some(),
            proc_root: args.proc_root.unwrap_or_else(|| PathBuf::from("/proc")),
            timeout: args.timeout.get(),
            output: args.output,
            node_name,
            api,
            flow: args.flow,
        })
    }
}

/// Why the API is not read when nothing says how to reach it.
#[cfg(feature = "kube-api")]
const NO_CREDENTIALS: &str =
    "there is no --kubeconfig and no in-cluster service account (not in a pod?)";

#[cfg(feature = "kube-api")]
fn api_access(kubeconfig: Option<&Path>) -> Result<ApiAccess, SettingsError> {
    if let Some(path) = kubeconfig {
        let access = api::Access::from_kubeconfig(path).map_err(SettingsError::Api)?;
        return Ok(ApiAccess::On(access));
    }
    Ok(match api::Access::in_cluster(&api::InCluster::from_env()) {
        None => ApiAccess::Off(NO_CREDENTIALS),
        Some(Ok(access)) => ApiAccess::On(access),
        Some(Err(e)) => ApiAccess::Unusable(e.to_string()),
    })
}

#[cfg(not(feature = "kube-api"))]
fn api_access(kubeconfig: Option<&Path>) -> Result<ApiAccess, SettingsError> {
    match kubeconfig {
        Some(path) => Err(SettingsError::ApiNotBuilt(path.to_owned())),
        None => Ok(ApiAccess::Off(
            "this binary was built without the kube-api feature",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn links_under_the_host_root_are_followed_as_the_host_sees_them_and_never_out_of_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("data/kubelet/plugins_registry")).unwrap();
        std::fs::create_dir_all(root.join("var/lib")).unwrap();
        symlink("/data/kubelet", root.join("var/lib/kubelet")).unwrap();
        symlink("../../..", root.join("data/kubelet/up")).unwrap();
        symlink("/etc/passwd", root.join("data/kubelet/passwd")).unwrap();
        symlink("loop", root.join("loop")).unwrap();
        let host = Host {
            root: Some(root.to_owned()),
        };
        let at = |p: &str| host.path(Path::new(p));
        assert_eq!(
            at("/var/lib/kubelet/plugins_registry"),
            root.join("data/kubelet/plugins_registry")
        );
        assert_eq!(
            at("/var/lib/kubelet/missing/x"),
            root.join("data/kubelet/missing/x")
        );
        assert_eq!(at("/var/lib/kubelet/up/etc"), root.join("etc"));
        assert_eq!(at("/var/lib/kubelet/passwd"), root.join("etc/passwd"));
        assert_eq!(at("/../../etc"), root.join("etc"));
        assert_eq!(at("/loop"), root.join("loop"));
        assert_eq!(
            host.entry(Path::new("/var/lib/kubelet/passwd")),
            root.join("data/kubelet/passwd")
        );
        let own = Host::default();
        assert_eq!(
            own.path(Path::new("/var/lib/kubelet")),
            Path::new("/var/lib/kubelet")
        );
    }
}
