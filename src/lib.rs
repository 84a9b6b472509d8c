//! csi-nodekit: everything a Kubernetes CSI driver needs on a node, in one static binary.
//!
//! # Layout
//!
//! Rooms from the top down; a room imports only from rooms below it, and no mode imports
//! another mode.
//!
//! - `main.rs` — the table of modes (names, upstream aliases, one-line description, entry),
//!   which [`cli`] reads for dispatch, usage and help; then argv → mode → flags, logging and
//!   [`rlimit`] → `<mode>::main(args)` → exit code. Exit codes are chosen there, except the
//!   `128 + signal` of a second SIGTERM/SIGINT ([`shutdown`]).
//! - The modes: [`node_server`] (the CSI plugin), [`registrar`] (drop-in
//!   node-driver-registrar), [`probe`] (livenessprobe, exec probes, the kubelet emulator, the
//!   doctor), [`demo`]. Each has the same shape: `Args` (argh, declared with
//!   [`mode_args!`] and typed values: a bad value is refused while parsing, exit 2) →
//!   `Settings::from_args` (assembled; flags that exclude each other are a
//!   [`UsageError`], exit 2) → `run(settings)` (runtime and signals, at the edge). The servers among them
//!   (node-server, registrar, probe serve) also have `serve(listener…, …, shutdown)`, which
//!   tests call in-process with their own listeners.
//! - [`cli`] — what every mode's command line shares: dispatch over the table of modes, Go-style
//!   flags rewritten for argh, typed flag values argh refuses while parsing ([`cli::values`]),
//!   Go's `--help` layout, [`ModeArgs`](cli::ModeArgs) and [`VERSION`](cli::VERSION). It
//!   knows no mode.
//! - [`flow`] — `--flow=FILE`: a run's registration flow as timed arrows on lifelines, drawn as
//!   SVG or Mermaid text. It knows no mode.
//! - [`linux`] — the Linux layer: bind mounts behind the [`Mounter`](linux::mount::Mounter)
//!   trait and the per-mount flags they carry (spelled once in `linux/mount_options.rs`), the
//!   mount table, project quotas (behind `ProjectQuotas`) and the walk that holds a volume to
//!   its project, loop devices (behind `LoopDevices`), the tree copy engine, inotify for tokio.
//!   It knows no CSI.
//! - [`csi_spec`] — what the CSI spec fixes: the driver-name rule, size limits, the longest node
//!   ID. [`quantity`] — Kubernetes byte counts (`10Gi`).
//! - [`socket`] — the shared socket layer: address parsing, safe bind, owner-checked removal,
//!   one claim per path among would-be servers (`socket/claim.rs`), the wait for a path to
//!   change hands (`socket/handover_wait.rs`), dialling with back-off (`socket/dial.rs`), and
//!   gRPC servers that accept any `:authority` (`socket/authority/`).
//! - [`http`] — the small HTTP server for `/healthz`, `/readyz`, `/metrics` (`http/conns.rs`:
//!   bounded connections, the longest-idle one shed at the cap, drained on shutdown), and a
//!   one-shot GET. [`metrics`] — `csi_sidecar_operations_seconds` and friends, OpenMetrics text.
//!   [`names`] — host names to addresses without glibc's NSS: `/etc/hosts`, then DNS.
//! - [`runtime`] — the one builder of a mode's tokio runtime and its signal-driven shutdown;
//!   [`shutdown`] — SIGTERM/SIGINT → one shutdown future for every server; grace period.
//! - [`logging`] — klog-style `--v` on env_logger; klog's text header or component-base's JSON;
//!   the values of klog's flags that are accepted and ignored.
//! - [`gocompat`] — Go compatibility in one place: durations, booleans, gRPC code names, Go's
//!   formatting of values and errors. [`backoff`] — the one doubling back-off. [`rlimit`] —
//!   process limits `main` sets before any mode starts. [`malloc_trim`] — free heap pages
//!   given back to the kernel after a burst.
//! - [`path_io`] — the one `"{op} {path}: {source}"` error the error types hold.
//!   [`mutex`] — the one poison-ignoring lock. [`node_name`] — the node's name (given,
//!   `$NODE_NAME`, else the host name) and the kernel's host name.
//! - [`plugin_registry`] — `<driver>-reg.sock`, the registration socket's name. [`paths`] —
//!   lexical checks on the absolute paths requests name. [`lock_file`] — lock files signed by
//!   their holder (the state directory's owner, a registration socket's claim).
//! - [`proto`] — generated gRPC code: CSI v1 and the kubelet plugin-registration API.
//!
//! Outside `src/`: `proto/` (our wire-identical protos), `tests/` (one test crate,
//! `tests/main.rs`, a folder per area and `tests/common/` for the fakes and helpers: real
//! processes, sockets and mounts), `benches/` + `examples/` (benchmarks that print figures),
//! `scripts/` (static build, image, demo, benchmarks), `packaging/` (Containerfile, Kubernetes
//! manifests), `docs/` (the manual).

pub mod backoff;
pub mod cli;
pub mod csi_spec;
pub mod demo;
pub mod flow;
pub mod gocompat;
pub mod http;
pub mod linux;
pub mod lock_file;
pub mod logging;
pub mod malloc_trim;
pub mod metrics;
pub mod mutex;
pub mod names;
pub mod node_name;
pub mod node_server;
pub mod path_io;
pub mod paths;
pub mod plugin_registry;
pub mod probe;
pub mod proto;
pub mod quantity;
pub mod registrar;
pub mod rlimit;
pub mod runtime;
pub mod shutdown;
pub mod socket;

/// The error type mode entry points return; `main` prints it and exits 1.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The text of an error's deepest cause. Our own errors say what failed at every level; foreign
/// ones sometimes do not (tonic's "transport error" keeps the reason in its sources).
pub fn deepest_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// A run that failed and has said why itself, in its own output (the doctor's report with
/// errors): `main` exits 1 without an error line of its own, since nothing else failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Reported(pub String);

/// A usage mistake found after flag parsing (a missing subcommand, flags that exclude each
/// other, a configuration the CSI spec does not allow, a run that cannot do what it was asked,
/// such as the doctor without root or a `--host-root` that is not there; a bad value of one
/// flag is refused while parsing, see [`cli::values`]); `main` reports it like a bad flag, with
/// exit code 2.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct UsageError(pub BoxError);

impl UsageError {
    pub fn new(error: impl Into<BoxError>) -> Self {
        Self(error.into())
    }
}
