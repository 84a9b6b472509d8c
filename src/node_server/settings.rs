//! node-server's command line: its flags ([`Args`]), assembled into [`Settings`] — where to
//! listen, how to wait for the state directory, and the plugin's [`Config`], checked against
//! the CSI spec.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use argh::{ArgsInfo, FromArgs};

use super::config::{self, Config};
use crate::cli::values::{
    AbsolutePath, BlockSize, ByteSize, FlagValue, GroupId, HttpEndpoint, OrEmpty, PositiveDuration,
    SocketAddress, SocketMode,
};
use crate::linux::quota;
use crate::node_server::block_maps::Shape;
use crate::{BoxError, UsageError, socket};

/// The default driver name: domain-style, as the CSI spec requires.
pub const DEFAULT_DRIVER_NAME: &str = "nodekit.csi.local";

crate::mode_args! {
    #[derive(FromArgs, ArgsInfo, Debug)]
    /// A CSI plugin for node-local volumes, serving Identity, Node, Controller, GroupController and SnapshotMetadata on a Unix socket.
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
        #[argh(option, default = "AbsolutePath::known(\"/var/lib/csi-nodekit\")")]
        pub state_dir: AbsolutePath,
        /// file mode of the CSI socket, octal permission bits (default 0660)
        #[argh(option, default = "SocketMode::from_bits(0o660)", arg_name = "value")]
        pub socket_mode: SocketMode,
        /// numeric group ID to own the CSI socket
        #[argh(option, arg_name = "int")]
        pub socket_group: Option<GroupId>,
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
        #[argh(option, default = "StateDirBusy::Wait", arg_name = "value")]
        pub state_dir_busy: StateDirBusy,
        /// advertise the GET_SNAPSHOT controller capability (GetSnapshot is served either
        /// way; csi-sanity before v5.5 fails on the capability)
        #[argh(switch)]
        pub advertise_get_snapshot: bool,
        /// how GetMetadataAllocated and GetMetadataDelta report ranges: extents of any length
        /// (VARIABLE_LENGTH), or blocks of this size (FIXED_LENGTH), a power of two from 4Ki to
        /// 1Gi, e.g. 64Ki (default: extents)
        #[argh(option, arg_name = "size")]
        pub snapshot_metadata_block_size: Option<BlockSize>,
        /// advertise the SNAPSHOT_METADATA_SERVICE plugin capability, which the
        /// external-snapshot-metadata sidecar requires (the service is served either way;
        /// csi-sanity up to v5.4 fails on the capability)
        #[argh(switch)]
        pub advertise_snapshot_metadata: bool,
        /// where the node's cgroup v2 hierarchy is mounted, in which volumes' IO limits are
        /// written to their pods' cgroups (default "/sys/fs/cgroup")
        #[argh(option, default = "AbsolutePath::known(\"/sys/fs/cgroup\")")]
        pub cgroup_root: AbsolutePath,
        /// address of the HTTP server for /metrics (the quota checks' counters), e.g. :9810;
        /// empty means no server
        #[argh(option, default = "OrEmpty::default()")]
        pub http_endpoint: OrEmpty<HttpEndpoint>,
        /// serve at --endpoint only what a cluster-wide external-resizer needs to leave each
        /// expansion to the volume's own node (Identity and the Controller and Node
        /// capabilities), for a Deployment beside csi-resizer; no state directory, no
        /// privileges; flags other than --endpoint, --driver-name, --socket-mode and
        /// --socket-group are not used (--http-endpoint is refused)
        #[argh(switch)]
        pub resizer_only: bool,
    }
}

/// The command line, assembled (argh refused bad values while parsing): where to listen, and
/// the plugin's configuration, checked against the CSI spec.
#[derive(Debug, Clone)]
pub struct Settings {
    pub endpoint: PathBuf,
    pub socket_perms: socket::Permissions,
    /// `--state-dir-busy`.
    pub state_dir_busy: StateDirBusy,
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
        let block_metadata = (args.snapshot_metadata_block_size)
            .map_or(Shape::Extents, |size| Shape::Blocks(size.bytes()));
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
            advertise_snapshot_metadata: args.advertise_snapshot_metadata,
            quota_checks: config::QuotaChecks {
                interval: args.quota_check_interval.get(),
                rate: args.quota_check_rate,
            },
            block_metadata,
            cgroup_root: args.cgroup_root.into_path(),
            ..Config::new(&args.driver_name, "", args.state_dir.into_path())
        };
        config.check().map_err(UsageError::new)?;
        let endpoint = args.endpoint.into_path();
        if let Some(inside) = inside_state(&endpoint, &config.state_dir) {
            return Err(UsageError::new(format!(
                "--endpoint {} is inside --state-dir's {}: a socket there is taken for a \
                 leftover and removed at the next start",
                endpoint.display(),
                inside.display()
            ))
            .into());
        }
        refuse_foreign_state_dir(&config.state_dir, &endpoint)?;
        Ok(Self {
            endpoint,
            socket_perms: socket::Permissions {
                mode: args.socket_mode.bits(),
                gid: args.socket_group.map(GroupId::get),
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

/// A `--state-dir` that holds what no node-server made (`/`, `/tmp`, a typo for another
/// program's directory) is a usage error naming a few of those entries: start-up would make it
/// root-only and take its contents for leftovers.
fn refuse_foreign_state_dir(state_dir: &Path, endpoint: &Path) -> Result<(), BoxError> {
    // `//` and `.` dropped, `/` kept (`paths::normalise` refuses the root directory).
    let tidy = |path: &Path| path.components().collect::<PathBuf>();
    let endpoint = tidy(endpoint);
    let layout = crate::node_server::state::state_dir::StateDir::at(tidy(state_dir));
    // Unreadable: start-up fails on it later, naming the cause.
    let foreign = layout.foreign_entries(&endpoint).unwrap_or_default();
    if foreign.is_empty() {
        return Ok(());
    }
    const NAMED: usize = 3;
    let mut named: Vec<String> = (foreign.iter().take(NAMED))
        .map(|name| format!("{:?}", name.to_string_lossy()))
        .collect();
    if foreign.len() > NAMED {
        named.push(format!("… {} in all", foreign.len()));
    }
    Err(UsageError::new(format!(
        "--state-dir {} holds entries node-server did not make ({}): it would be made \
         root-only and its contents taken for leftovers; give an empty or a new directory",
        state_dir.display(),
        named.join(", ")
    ))
    .into())
}

/// The directory of the state directory's layout that `endpoint` lies in, compared as
/// written (neither exists yet at parse time).
fn inside_state(endpoint: &std::path::Path, state_dir: &std::path::Path) -> Option<PathBuf> {
    let (endpoint, state_dir) = (
        crate::paths::normalise(&endpoint.to_string_lossy()).ok()?,
        crate::paths::normalise(&state_dir.to_string_lossy()).ok()?,
    );
    let layout = crate::node_server::state::state_dir::StateDir::at(state_dir);
    layout
        .kept_dirs()
        .into_iter()
        .find(|dir| endpoint.starts_with(dir))
        .map(std::path::Path::to_owned)
}

/// `--state-dir-busy`: what to do when another node-server holds the state directory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StateDirBusy {
    /// Wait for it to exit, then take over.
    #[default]
    Wait,
    /// Exit 1 at once.
    Exit,
}

impl FromStr for StateDirBusy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "wait" => Ok(Self::Wait),
            "exit" => Ok(Self::Exit),
            other => Err(format!(
                "--state-dir-busy must be wait or exit, not {other:?}"
            )),
        }
    }
}

impl fmt::Display for StateDirBusy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Wait => "wait",
            Self::Exit => "exit",
        })
    }
}

/// `$NODE_NAME`, else the kernel's host name, as it is (an empty `--node-id` is given, and
/// refused by the configuration's check).
fn default_node_id() -> Result<String, BoxError> {
    let name = crate::node_name::resolve(None)
        .map_err(|e| format!("read host name for --node-id: {e}"))?;
    Ok(name.into_string())
}
