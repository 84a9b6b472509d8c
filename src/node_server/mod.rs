//! `node-server`: the CSI plugin itself. Identity, Node, Controller, GroupController and
//! SnapshotMetadata (for this node's own local volumes) on one Unix socket; volumes are
//! directories under `--state-dir` or filesystems of their own on loop devices, published with
//! real mounts; snapshots are copies of their trees or files there.
//!
//! - this file — the mode's contract: `main` → [`run`] (the runtime, taking the state
//!   directory, the socket, what runs beside the server) → [`serve`].
//! - [`settings`] — [`Args`] → [`Settings`]: the flags, assembled and checked; [`config`] —
//!   what the plugin is ([`Config`]), checked against the CSI spec.
//! - [`takeover`] — becoming the state directory's one node-server (or waiting for it).
//! - [`server`] — the gRPC server and its bounds ([`serve`], [`Plugin`]); `grace` — the end of
//!   the grace period for calls in flight; `in_flight` — the calls running, which is what a
//!   shutdown waits for; `burst_trim` — the heap trimmed once a burst of calls is over.
//! - [`grpc`] — the five CSI services, one file each (validate → act → respond) with the table
//!   that maps their failures to gRPC codes; request checks and the spec's field limits.
//! - `driver` — the plugin below the handlers, its operations and what they fail with; the
//!   one way to run a blocking operation under a volume's claim; the quota patrol.
//! - [`block_maps`] — the SnapshotMetadata service's maps of raw block snapshots: what holds
//!   data, what differs between two (extents shared by reflink are never read), as extents or
//!   fixed blocks, in batches.
//! - [`metrics_endpoint`] — `--http-endpoint`'s `/metrics`: the quota patrol's counters.
//! - [`resizer_only`] — `--resizer-only`: the capabilities a cluster-wide external-resizer
//!   needs to leave expansion to the volume's node, and nothing else.
//! - [`state`] — what it keeps under `--state-dir`: the directory as one value (`state_dir`),
//!   volume, snapshot and group records (atomic writes), the volumes' records, claims,
//!   capacity and storage, the mutable attributes, what volumes get from project quotas,
//!   copy sources in use, orphans, the owner's lock, the escapes the patrol found.
//! - Underneath, [`crate::linux`]: mounts, the mount table, quotas, loop devices, the copy
//!   engine.

pub mod block_maps;
mod burst_trim;
pub mod config;
pub(crate) mod driver;
mod grace;
pub mod grpc;
mod in_flight;
pub mod metrics_endpoint;
pub mod resizer_only;
pub mod server;
pub mod settings;
pub mod state;
pub mod takeover;

use std::sync::Arc;

pub use crate::csi_spec::MAX_NODE_ID;
pub use crate::linux::mount::{LinuxMounter, Mounter};
pub use config::{Config, ConfigError};
pub use driver::{OpenError, Seams};
pub use server::{Plugin, serve};
pub use settings::{Args, DEFAULT_DRIVER_NAME, Settings, StateDirBusy};

use crate::runtime::Threads;
use crate::{BoxError, socket};
use driver::QuotaPatrol;

/// The mode's entry from the command line.
pub fn main(args: Args) -> Result<(), BoxError> {
    if args.resizer_only {
        return resizer_only::main(args);
    }
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
        let open = move || Plugin::open(config, taken.owner, Seams::linux());
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
        let _patrol = QuotaPatrol::start(Arc::clone(plugin.driver()));
        if let Some(endpoint) = &settings.http_endpoint {
            let listener = crate::http::bind(endpoint).await?;
            let driver = Arc::clone(plugin.driver());
            let handler = metrics_endpoint::Handler::new(move || driver.escape_totals());
            let answer = move |path: String| {
                let handler = Arc::clone(&handler);
                async move { metrics_endpoint::answer(&handler, &path) }
            };
            tokio::spawn(crate::http::serve(listener, answer, shutdown.clone()));
        }
        let config = plugin.driver().config();
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
