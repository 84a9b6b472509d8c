//! `node-server`: the CSI plugin itself. Identity, Node, Controller and GroupController (for
//! this node's own local volumes) on one Unix socket; volumes are directories under
//! `--state-dir`, published with real bind mounts; snapshots are copies of their trees there.
//!
//! - this file — the mode's contract: [`Args`] → [`Settings`] → [`run`] → [`serve`], and the
//!   gRPC server with its bounds; `grace` — the end of the grace period for calls in flight;
//!   `in_flight` — the calls running, which is what a shutdown waits for.
//! - [`grpc`] — the four CSI services, one file each (validate → act → respond) with the table
//!   that maps their failures to gRPC codes; request checks and the spec's field limits.
//! - [`driver`] — [`Driver`](driver::Driver), the plugin below the handlers, and its
//!   operations: the one way to run a blocking operation under a volume's lock; create, delete
//!   and expand (`volumes`), restores and clones (`content`), snapshots and groups
//!   (`snapshots`), ControllerModifyVolume (`modify`), stage/publish as bind mounts decided from
//!   the mount table (`publish`), raw block volumes on loop devices (`block`), inline volumes
//!   (`ephemeral`), and what they fail with (`error`).
//! - [`state`] — what it keeps under `--state-dir`: the directory as one value (`layout`,
//!   [`StateDir`]: every name under it), volume, snapshot and group records (serde types,
//!   atomic writes), capacity, the mutable attributes (`inodeLimit`, `rootMode`, `directIO`), what
//!   volumes get from project quotas, per-volume locks and copy sources in use.
//! - Underneath, [`crate::linux`]: mounts, the mount table, quotas, loop devices, the copy
//!   engine.

pub mod config;
pub(crate) mod driver;
mod grace;
pub mod grpc;
mod heap;
mod in_flight;
pub mod metrics;
pub mod state;
pub mod takeover;

use std::path::PathBuf;
use std::sync::Arc;

use argh::{ArgsInfo, FromArgs};
use tower::layer::util::{Identity, Stack};
use tower::util::MapResponseLayer;

pub use crate::linux::mount::{LinuxMounter, Mounter};
pub use config::{Config, ConfigError};
pub use driver::OpenError;

use crate::linux::quota;
use grpc::{controller, field_limits, group_controller, identity, node};
#[cfg(doc)]
use state::layout::StateDir;

use crate::cli::values::{
    ByteSize, FlagValue, HttpEndpoint, NonEmptyPath, OrEmpty, PositiveDuration, SocketAddress,
    SocketMode,
};
use crate::proto::csi::controller_server::ControllerServer;
use crate::proto::csi::group_controller_server::GroupControllerServer;
use crate::proto::csi::identity_server::IdentityServer;
use crate::proto::csi::node_server::NodeServer;
use crate::runtime::Threads;
use crate::shutdown::Shutdown;
use crate::{BoxError, UsageError, socket};

/// The default driver name: domain-style, as the CSI spec requires.
pub const DEFAULT_DRIVER_NAME: &str = "nodekit.csi.local";

pub use crate::csi_spec::MAX_NODE_ID;

crate::mode_args! {
    #[derive(FromArgs, ArgsInfo, Debug)]
    /// A CSI plugin for node-local volumes, serving Identity, Node and Controller on a Unix socket.
    pub struct Args {
        /// CSI endpoint to listen on: unix:///path, unix:/path or /path (default
        /// "unix:///csi/csi.sock")
        #[argh(option, default = "SocketAddress::known(\"unix:///csi/csi.sock\")")]
        pub endpoint: SocketAddress,
        /// driver name reported by GetPluginInfo, domain style, at most 63 characters
        /// (default "nodekit.csi.local")
        #[argh(option, default = "String::from(DEFAULT_DRIVER_NAME)")]
        pub driver_name: String,
        /// node ID reported by NodeGetInfo (default: $NODE_NAME, else the host name)
        #[argh(option)]
        pub node_id: Option<String>,
        /// volume limit reported by NodeGetInfo; 0 states no limit
        #[argh(option, default = "0", arg_name = "int")]
        pub max_volumes_per_node: i64,
        /// bytes all volumes may take together, more than 0, e.g. 100Gi (default: the free
        /// space of the state directory's filesystem when each volume is created)
        #[argh(option)]
        pub capacity: Option<ByteSize>,
        /// without --capacity, let new volumes take free space already promised to existing
        /// ones (by default each volume's size less its usage stays reserved)
        #[argh(switch)]
        pub overcommit: bool,
        /// directory holding volumes and their state (default "/var/lib/csi-nodekit")
        #[argh(option, default = "NonEmptyPath::known(\"/var/lib/csi-nodekit\")")]
        pub state_dir: NonEmptyPath,
        /// file mode of the CSI socket, octal permission bits (default 0660)
        #[argh(option, default = "SocketMode::from_bits(0o660)", arg_name = "value")]
        pub socket_mode: SocketMode,
        /// numeric group ID to own the CSI socket
        #[argh(option, arg_name = "int")]
        pub socket_group: Option<u32>,
        /// hold volumes to their sizes with project quotas: auto (where the filesystem can),
        /// on (or refuse to start), off (never touch quotas) (default auto)
        #[argh(option, default = "quota::Mode::Auto", arg_name = "value")]
        pub quota: quota::Mode,
        /// pause between passes over every quota'd volume looking for files taken out of
        /// its project (found ones are set back and charged to the volume) (default 20s)
        #[argh(option, default = "PositiveDuration::from_secs(20)", arg_name = "duration")]
        pub quota_check_interval: PositiveDuration,
        /// inodes those passes look at per second, at most, more than 0 (default 5000)
        #[argh(option, default = "5000", arg_name = "int")]
        pub quota_check_rate: u32,
        /// when another node-server holds the state directory: wait (without serving) and
        /// take over when it exits, or exit (exit 1 at once) (default wait)
        #[argh(option, default = "takeover::Busy::Wait", arg_name = "value")]
        pub state_dir_busy: takeover::Busy,
        /// advertise the GET_SNAPSHOT controller capability (GetSnapshot is served either
        /// way; csi-sanity before v5.5 fails on the capability)
        #[argh(switch)]
        pub advertise_get_snapshot: bool,
        /// address of the HTTP server for /metrics (the quota checks' counters), e.g. :9810;
        /// empty means no server
        #[argh(option, default = "OrEmpty::default()")]
        pub http_endpoint: OrEmpty<HttpEndpoint>,
    }
}

/// The command line, assembled (argh refused bad values while parsing): where to listen, and
/// the plugin's configuration, checked against the CSI spec.
#[derive(Debug, Clone)]
pub struct Settings {
    pub endpoint: PathBuf,
    pub socket_perms: socket::Permissions,
    /// `--state-dir-busy`.
    pub state_dir_busy: takeover::Busy,
    /// `--http-endpoint`: where `/metrics` is served, if anywhere.
    pub http_endpoint: Option<String>,
    pub config: Config,
}

impl Settings {
    /// Assembles the settings (each value was checked while parsing); a configuration the
    /// CSI spec does not allow is a usage error (exit 2) naming it.
    pub fn from_args(args: Args) -> Result<Self, BoxError> {
        if args.quota_check_rate == 0 {
            return Err(UsageError::new("--quota-check-rate must be more than 0").into());
        }
        let config = Config {
            node_id: match args.node_id {
                Some(id) => id,
                None => default_node_id()?,
            },
            max_volumes_per_node: args.max_volumes_per_node,
            capacity: args.capacity.map(ByteSize::bytes),
            overcommit: args.overcommit,
            quota: args.quota,
            advertise_get_snapshot: args.advertise_get_snapshot,
            quota_checks: config::QuotaChecks {
                interval: args.quota_check_interval.get(),
                rate: args.quota_check_rate,
            },
            ..Config::new(&args.driver_name, "", args.state_dir.into_path())
        };
        config.check().map_err(UsageError::new)?;
        Ok(Self {
            endpoint: args.endpoint.into_path(),
            socket_perms: socket::Permissions {
                mode: args.socket_mode.bits(),
                gid: args.socket_group,
            },
            state_dir_busy: args.state_dir_busy,
            http_endpoint: args
                .http_endpoint
                .into_option()
                .map(HttpEndpoint::into_string),
            config,
        })
    }
}

/// The four services, ready to serve.
pub struct Plugin {
    driver: Arc<driver::Driver>,
}

impl Plugin {
    /// Opens the state directory with the real mounter.
    pub fn open(config: Config) -> Result<Self, OpenError> {
        Self::with_mounter(config, Arc::new(LinuxMounter))
    }

    /// Opens the state directory (creating it), loads every volume record, and checks the
    /// configuration. `mounter` is the seam tests use to slow or observe mounts.
    pub fn with_mounter(config: Config, mounter: Arc<dyn Mounter>) -> Result<Self, OpenError> {
        let driver = driver::Driver::open(config, mounter)?;
        Ok(Self {
            driver: Arc::new(driver),
        })
    }

    /// Opens the state directory `owner` holds, with the real mounter and loop devices.
    pub fn open_owned(config: Config, owner: state::owner::Owner) -> Result<Self, OpenError> {
        let loops = Arc::new(crate::linux::loopdev::KernelLoops);
        let driver = driver::Driver::open_owned(config, Arc::new(LinuxMounter), loops, owner)?;
        Ok(Self {
            driver: Arc::new(driver),
        })
    }
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

/// The mode's entry from the command line.
pub fn main(args: Args) -> Result<(), BoxError> {
    run(Settings::from_args(args)?)
}

/// Takes the state directory (waiting for another instance to exit, as `--state-dir-busy`
/// says), opens the plugin, binds the socket and serves until SIGTERM or SIGINT.
pub fn run(settings: Settings) -> Result<(), BoxError> {
    // Two workers serve gRPC. Blocking work is mostly mount syscalls, which the kernel
    // serialises per mount namespace, so a small blocking pool loses no throughput and keeps
    // memory flat under load (measured: 32 concurrent publishers grew the default pool to 45
    // threads and 11 MB resident; with 4 threads it stays near 5 MB at the same rate).
    let threads = Threads::Multi {
        workers: 2,
        blocking: Some(4),
    };
    crate::runtime::serve(threads, |shutdown| async move {
        let Some(taken) = takeover::take(&settings, shutdown.clone()).await? else {
            return Ok(());
        };
        let config = settings.config.clone();
        let open = move || Plugin::open_owned(config, taken.owner);
        let plugin = tokio::task::spawn_blocking(open).await??;
        let (listener, guard) = match taken.socket {
            Some(bound) => {
                bound.listener.set_nonblocking(true)?;
                let listener = tokio::net::UnixListener::from_std(bound.listener)?;
                (listener, bound.guard)
            }
            None => socket::bind_tokio(&settings.endpoint, settings.socket_perms)?,
        };
        // Stopped and joined when serving ends.
        let _watch = driver::watch::Watch::start(Arc::clone(&plugin.driver));
        if let Some(endpoint) = &settings.http_endpoint {
            let listener = crate::http::bind(endpoint).await?;
            let driver = Arc::clone(&plugin.driver);
            let handler = metrics::Handler::new(move || driver.escape_totals());
            let answer = move |path: String| {
                let handler = Arc::clone(&handler);
                async move { metrics::answer(&handler, &path) }
            };
            tokio::spawn(crate::http::serve(listener, answer, shutdown.clone()));
        }
        let config = &plugin.driver.config;
        log::info!(
            "serving CSI driver {} for node {} on {}",
            config.driver_name,
            config.node_id,
            settings.endpoint.display()
        );
        // The socket goes when shutdown begins, as Go's GracefulStop closes its listener: a
        // client dialling meanwhile fails at once (and retries against the next node-server)
        // instead of waiting in a backlog nobody accepts from; the calls in flight go on.
        let withdrawn = shutdown.clone();
        tokio::spawn(async move {
            withdrawn.wait().await;
            drop(guard);
        });
        serve(listener, plugin, shutdown).await
    })
}

/// Serves the CSI services on `listener` until `shutdown`, then lets the calls in flight finish
/// within the grace period; those still running then are answered UNAVAILABLE (`grace`).
pub async fn serve(
    listener: tokio::net::UnixListener,
    plugin: Plugin,
    shutdown: Shutdown,
) -> Result<(), BoxError> {
    let driver = plugin.driver;
    // The listener is bound: calls are answered while what interrupted operations left goes.
    let _orphans = driver.remove_orphans_in_background();
    let max = field_limits::MAX_REQUEST;
    let identity = IdentityServer::new(identity::IdentityService(Arc::clone(&driver)));
    let node = NodeServer::new(node::NodeService(Arc::clone(&driver)));
    let groups = group_controller::GroupControllerService(Arc::clone(&driver));
    let group = GroupControllerServer::new(groups);
    let controller = ControllerServer::new(controller::ControllerService(driver));
    let grace = crate::shutdown::GRACE_PERIOD;
    let calls = in_flight::InFlight::default();
    // Stopped with the server: in-process tests serve many times on one runtime.
    let trimmer = tokio::spawn(heap::trim_after_bursts(calls.clone()));
    let cut = grace::CutAtGraceEnd::new(shutdown.later(grace), grace, calls.clone());
    let server = bounded_server()
        .layer(cut)
        .add_service(identity.max_decoding_message_size(max))
        .add_service(node.max_decoding_message_size(max))
        .add_service(group.max_decoding_message_size(max))
        .add_service(controller.max_decoding_message_size(max))
        .serve_with_incoming_shutdown(socket::grpc_incoming(listener), shutdown.clone().wait());
    // A moment beyond the grace period for the UNAVAILABLE answers to go out.
    let answered = grace + std::time::Duration::from_secs(1);
    // Done once no call runs: connections whose clients never answer the GOAWAY are not
    // waited for (`in_flight`).
    let served = crate::shutdown::run_with_grace(server, shutdown, answered, calls.quiet()).await;
    trimmer.abort();
    match served {
        Some(result) => result.map_err(Into::into),
        None => Ok(()),
    }
}

/// The gRPC server with every HTTP/2 bound stated, not left to library defaults: what one
/// stream may have in flight is one largest request; a connection, four of them; a header
/// list, 16 KiB; 64 streams at once per connection (gRPC clients queue the rest).
fn bounded_server() -> tonic::transport::Server<Stack<MapResponseLayer<MapGrpc>, Identity>> {
    let window = u32::try_from(field_limits::MAX_REQUEST).unwrap_or(u32::MAX);
    tonic::transport::Server::builder()
        .initial_stream_window_size(window)
        .initial_connection_window_size(window.saturating_mul(4))
        .max_frame_size(16 << 10)
        .http2_max_header_list_size(16 << 10)
        .max_concurrent_streams(64)
        .layer(MapResponseLayer::new(
            too_large_is_resource_exhausted as MapGrpc,
        ))
}

type GrpcResponse = tonic::codegen::http::Response<tonic::body::Body>;
type MapGrpc = fn(GrpcResponse) -> GrpcResponse;

/// tonic refuses a request over `max_decoding_message_size` from its length prefix, before
/// buffering it, but with OUT_OF_RANGE; gRPC's code for a message over the receiver's limit
/// is RESOURCE_EXHAUSTED (what grpc-go answers, and what clients retry on or report as such).
/// No handler of ours answers OUT_OF_RANGE with tonic's wording.
fn too_large_is_resource_exhausted(mut response: GrpcResponse) -> GrpcResponse {
    const TONIC_TOO_LARGE: &[u8] = b"Error,%20decoded%20message%20length%20too%20large";
    let headers = response.headers_mut();
    let too_large = headers.get("grpc-status").is_some_and(|code| code == "11")
        && headers
            .get("grpc-message")
            .is_some_and(|message| message.as_bytes().starts_with(TONIC_TOO_LARGE));
    if too_large {
        let code = tonic::Code::ResourceExhausted as i32;
        headers.insert("grpc-status", code.into());
    }
    response
}
