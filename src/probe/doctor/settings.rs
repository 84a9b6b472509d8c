//! The doctor's flags and the settings they validate into: `Args` → `Settings::from_args` (a
//! bad flag is a [`SettingsError`], exit 2) → `run`. API credentials are read here, so an
//! unusable kubeconfig is reported before anything is diagnosed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use argh::{ArgsInfo, FromArgs};

#[cfg(feature = "kube-api")]
use super::api;
use crate::gocompat::GoDuration;
use crate::probe::kubelet::Output;
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
        /// where to look for the kubelet process (needs the host's PID namespace) (default
        /// "/proc")
        #[argh(option, default = "PathBuf::from(\"/proc\")")]
        pub proc_root: PathBuf,
        /// deadline of each connection and each call (default 2s)
        #[argh(option, default = "GoDuration(Duration::from_secs(2))", arg_name = "duration")]
        pub timeout: GoDuration,
        /// report format: text or json (default "text")
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
    /// Where to draw the steps, if anywhere.
    pub flow: Option<crate::flow::FlowFile>,
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
            flow: args.flow,
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
