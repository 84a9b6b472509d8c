//! `node-server`: the CSI plugin itself. Identity, Node and Controller (for this node's own
//! local volumes) on one Unix socket; volumes are directories under `--state-dir`, published
//! with real bind mounts.
//!
//! - [`identity`], [`node`], [`controller`] — one file per CSI service (validate → act →
//!   respond).
//! - [`validate`] — request checks with the exact gRPC codes.
//! - [`volumes`] + `store` — volume records, persistence, capacity, per-volume locks.
//! - [`publish`] — stage/publish/unpublish/unstage decided from the mount table.
//! - [`mount`] (trait + Linux impl) and [`mountinfo`] (the mount table, parsed).

pub mod capacity;
mod controller;
mod ephemeral;
pub mod error;
mod identity;
pub mod mount;
pub mod mountinfo;
mod node;
pub mod publish;
mod store;
pub mod validate;
pub mod volumes;

use std::path::PathBuf;
use std::sync::Arc;

use argh::{ArgsInfo, FromArgs};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::Status;

pub use identity::IdentityService;
pub use mount::{LinuxMounter, Mounter};

use crate::proto::csi::Topology;
use crate::proto::csi::controller_server::ControllerServer;
use crate::proto::csi::identity_server::IdentityServer;
use crate::proto::csi::node_server::NodeServer;
use crate::shutdown::Shutdown;
use crate::{BoxError, UsageError, logging, socket};

/// The default driver name: domain-style, as the CSI spec requires.
pub const DEFAULT_DRIVER_NAME: &str = "nodekit.csi.local";

/// The longest node ID the CSI spec allows.
pub const MAX_NODE_ID: usize = 256;

#[derive(FromArgs, ArgsInfo, Debug)]
/// A CSI plugin for node-local volumes, serving Identity, Node and Controller on a Unix socket.
pub struct Args {
    /// CSI endpoint to listen on: unix:///path, unix:/path or /path
    #[argh(option, default = "String::from(\"unix:///csi/csi.sock\")")]
    pub endpoint: String,
    /// driver name reported by GetPluginInfo (domain style, at most 63 characters)
    #[argh(option, default = "String::from(DEFAULT_DRIVER_NAME)")]
    pub driver_name: String,
    /// node ID reported by NodeGetInfo (default: $NODE_NAME, else the host name)
    #[argh(option)]
    pub node_id: Option<String>,
    /// volume limit reported by NodeGetInfo; 0 states no limit
    #[argh(option, default = "0")]
    pub max_volumes_per_node: i64,
    /// bytes all volumes may take together, e.g. 100Gi (default: the free space of the
    /// state directory's filesystem when each volume is created)
    #[argh(option)]
    pub capacity: Option<String>,
    /// directory holding volumes and their state
    #[argh(option, default = "PathBuf::from(\"/var/lib/csi-nodekit\")")]
    pub state_dir: PathBuf,
    /// file mode of the CSI socket, octal
    #[argh(option, default = "socket::SocketMode(0o660)")]
    pub socket_mode: socket::SocketMode,
    /// numeric group ID to own the CSI socket
    #[argh(option)]
    pub socket_group: Option<u32>,
    /// log verbosity, klog style (0 = quiet)
    #[argh(option, default = "0")]
    pub v: u8,
    /// log format: text or json
    #[argh(option, default = "logging::Format::Text")]
    pub logging_format: logging::Format,
    /// print the version and exit
    #[argh(switch)]
    pub version: bool,
}

crate::mode_args!(Args);

/// What the plugin is, independent of how it is started.
#[derive(Debug, Clone)]
pub struct Config {
    pub driver_name: String,
    pub node_id: String,
    pub state_dir: PathBuf,
    pub max_volumes_per_node: i64,
    /// Total bytes for all volumes; `None`: the filesystem's free space.
    pub capacity: Option<u64>,
}

impl Config {
    pub fn new(driver_name: &str, node_id: &str, state_dir: impl Into<PathBuf>) -> Self {
        Self {
            driver_name: driver_name.to_owned(),
            node_id: node_id.to_owned(),
            state_dir: state_dir.into(),
            max_volumes_per_node: 0,
            capacity: None,
        }
    }

    /// Checks what the CSI spec constrains.
    fn check(&self) -> Result<(), UsageError> {
        crate::driver_name::validate(&self.driver_name).map_err(UsageError)?;
        if self.node_id.is_empty() || self.node_id.len() > MAX_NODE_ID {
            return Err(UsageError(format!(
                "node ID {:?} must be 1 to {MAX_NODE_ID} bytes",
                self.node_id
            )));
        }
        if self.max_volumes_per_node < 0 {
            return Err(UsageError(
                "--max-volumes-per-node may not be negative".into(),
            ));
        }
        Ok(())
    }
}

/// State shared by the Node and Controller services.
pub(crate) struct Driver {
    config: Config,
    /// `config.state_dir`, canonical: mount points in mountinfo are canonical paths.
    state_dir: PathBuf,
    volumes: Arc<volumes::Volumes>,
    mounter: Arc<dyn Mounter>,
}

impl Driver {
    fn topology_key(&self) -> String {
        format!("topology.{}/node", self.config.driver_name)
    }

    /// This node as a topology segment: local volumes are reachable only here.
    fn topology(&self) -> Topology {
        Topology {
            segments: [(self.topology_key(), self.config.node_id.clone())].into(),
        }
    }

    /// Whether a topology from a request can be this node (a missing key does not exclude).
    fn matches(&self, topology: &Topology) -> bool {
        topology
            .segments
            .get(&self.topology_key())
            .is_none_or(|node| *node == self.config.node_id)
    }

    /// A mount point from a request, resolved; refused inside or above the state directory,
    /// where a mount could cover or be deleted with volume data.
    fn mount_point(&self, field: &str, path: &std::path::Path) -> Result<Option<PathBuf>, Status> {
        let resolved = publish::resolve(field, path)?;
        if let Some(real) = &resolved
            && (real.starts_with(&self.state_dir) || self.state_dir.starts_with(real))
        {
            return Err(Status::invalid_argument(format!(
                "{field} {} overlaps the state directory {}",
                path.display(),
                self.state_dir.display()
            )));
        }
        Ok(resolved)
    }
}

/// The three services, ready to serve.
pub struct Plugin {
    identity: IdentityService,
    driver: Arc<Driver>,
}

impl Plugin {
    /// Opens the state directory with the real mounter.
    pub fn open(config: Config) -> Result<Self, BoxError> {
        Self::with_mounter(config, Arc::new(LinuxMounter))
    }

    /// Opens the state directory (creating it), loads every volume record, and checks the
    /// configuration. `mounter` is the seam tests use to slow or observe mounts.
    pub fn with_mounter(config: Config, mounter: Arc<dyn Mounter>) -> Result<Self, BoxError> {
        config.check()?;
        let state_dir = &config.state_dir;
        std::fs::create_dir_all(state_dir)
            .map_err(|e| format!("create state directory {}: {e}", state_dir.display()))?;
        let state_dir = state_dir
            .canonicalize()
            .map_err(|e| format!("resolve state directory {}: {e}", state_dir.display()))?;
        let volumes = volumes::Volumes::open(&state_dir, config.capacity)?;
        let identity = IdentityService {
            driver_name: config.driver_name.clone(),
            state_dir: state_dir.clone(),
        };
        let driver = Arc::new(Driver {
            config,
            state_dir,
            volumes,
            mounter,
        });
        Ok(Self { identity, driver })
    }
}

/// Runs blocking work (syscalls, fsync) off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Status::internal(format!("worker failed: {e}")))?
}

/// `$NODE_NAME`, else the kernel's host name.
fn default_node_id() -> Result<String, BoxError> {
    if let Ok(name) = std::env::var("NODE_NAME")
        && !name.is_empty()
    {
        return Ok(name);
    }
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_err(|e| format!("read host name for --node-id: {e}"))?;
    Ok(name.trim().to_owned())
}

/// Validates the arguments, binds the socket and serves until SIGTERM or SIGINT.
pub fn run(args: Args) -> Result<(), BoxError> {
    let path = socket::parse_address(&args.endpoint)?;
    let perms = socket::Permissions {
        mode: args.socket_mode.0,
        gid: args.socket_group,
    };
    let capacity = match &args.capacity {
        Some(text) => Some(capacity::parse_quantity(text).map_err(UsageError)?),
        None => None,
    };
    let config = Config {
        node_id: match args.node_id {
            Some(id) => id,
            None => default_node_id()?,
        },
        max_volumes_per_node: args.max_volumes_per_node,
        capacity,
        ..Config::new(&args.driver_name, "", args.state_dir)
    };
    let plugin = Plugin::open(config)?;
    // Two workers serve gRPC. Blocking work is mostly mount syscalls, which the kernel
    // serialises per mount namespace, so a small blocking pool loses no throughput and keeps
    // memory flat under load (measured: 32 concurrent publishers grew the default pool to 45
    // threads and 11 MB resident; with 4 threads it stays near 5 MB at the same rate).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(4)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let shutdown = Shutdown::on_signals()?;
        let (listener, _guard) = socket::bind_tokio(&path, perms)?;
        log::info!(
            "serving CSI driver {} for node {} on {}",
            plugin.driver.config.driver_name,
            plugin.driver.config.node_id,
            path.display()
        );
        serve(listener, plugin, shutdown).await
    })
}

/// Serves the CSI services on `listener` until `shutdown`, then finishes in-flight calls within
/// the grace period.
pub async fn serve(
    listener: tokio::net::UnixListener,
    plugin: Plugin,
    shutdown: Shutdown,
) -> Result<(), BoxError> {
    let server = tonic::transport::Server::builder()
        .add_service(IdentityServer::new(plugin.identity))
        .add_service(NodeServer::new(node::NodeService(Arc::clone(
            &plugin.driver,
        ))))
        .add_service(ControllerServer::new(controller::ControllerService(
            plugin.driver,
        )))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown.clone().wait());
    match crate::shutdown::run_with_grace(server, shutdown, crate::shutdown::GRACE_PERIOD).await {
        Some(result) => result.map_err(Into::into),
        None => Ok(()),
    }
}
