//! csi-nodekit: everything a Kubernetes CSI driver needs on a node, in one static binary.
//!
//! # Layout
//!
//! - `main.rs` — thin: argv → mode → logging and [`rlimit`] → `<mode>::main(args)` → exit code
//!   (the only place that picks exit codes).
//! - [`cli`] — mode dispatch from `argv[0]` or a subcommand; Go-style flag normalisation;
//!   [`ModeArgs`](cli::ModeArgs), what `main` needs from every mode's `Args`.
//! - Every mode has one contract: `Args` (argh) → `Settings::from_args` (validated; a bad value
//!   is a usage error, exit 2) → `run(settings)` (runtime and signals, at the edge) →
//!   `serve(listeners…, settings, shutdown)`, which tests call in-process.
//! - [`runtime`] — the one builder of a mode's tokio runtime and its signal-driven shutdown.
//! - [`shutdown`] — SIGTERM/SIGINT → one shutdown future for every server; grace period.
//! - [`socket`] — the shared socket layer: address parsing, safe bind, owner-checked removal,
//!   dialling with back-off (`socket/dial.rs`), and gRPC servers that accept any `:authority`
//!   (`socket/authority.rs`).
//! - [`http`] — the small HTTP server for `/healthz`, `/readyz`, `/metrics` (`http/conns.rs`:
//!   bounded connections, the longest-idle one shed at the cap, drained on shutdown), and a
//!   one-shot GET.
//! - [`metrics`] — `csi_sidecar_operations_seconds` and friends, OpenMetrics text.
//! - [`logging`] — klog-style `--v` on env_logger; text or JSON lines.
//! - [`rlimit`] — process limits `main` sets before any mode starts (open files raised to the
//!   hard limit).
//! - [`backoff`] — the one doubling back-off (dialling, the registrar, the kubelet emulator).
//! - [`gocompat`] — Go compatibility in one place: durations, booleans, gRPC code names, Go's
//!   formatting of values and errors.
//! - [`driver_name`] — the CSI naming rule for driver names.
//! - [`proto`] — generated gRPC code: CSI v1 and the kubelet plugin-registration API.
//! - [`node_server`] — the CSI plugin (`node-server` mode): `mod.rs` (the contract), `driver`
//!   (the plugin's state and operations; the one locked blocking helper; `driver_volumes`,
//!   `driver_snapshots` and `content` hold its create/delete/expand, snapshot, group, restore
//!   and clone operations, `modify` ControllerModifyVolume, `block` the node side of raw block
//!   volumes), `attributes` (the mutable parameters), `identity`, `node`,
//!   `controller` + `controller_snapshots`, `group_controller` (one file per CSI service, each
//!   with its error → gRPC code table), `error` (what each service's operations can fail with),
//!   `layout` (the state directory as one value: every name under `--state-dir`), `volumes` +
//!   `store` (records of any kind as serde types, atomic writes, per-volume locks, the one
//!   create path), `snapshots` (snapshot and group records, their data, start-up recovery, `take`:
//!   cutting them), `sources` (what is being copied from, so it is not deleted meanwhile),
//!   `copy` (the tree copy engine: reflinks, sparse copies, crash-safe temporary names),
//!   `publish` + `mount` + `mountinfo` (bind mounts; the mount table is the truth), `validate`
//!   (request checks → exact gRPC codes) + `field_limits` (the CSI spec's size limits, the
//!   bound on a request), `capacity`, `ephemeral`, `quota` (project quotas by syscalls) +
//!   `volume_quota` (what volumes get from it: a limit of their size, their own stats),
//!   `loopdev` (loop devices by ioctls, for block volumes).
//! - [`registrar`] — drop-in node-driver-registrar (`registrar` mode): `service` (the
//!   Registration API and the status it feeds), `supervise` (driver watch, socket healing,
//!   re-registration), `health` (`/healthz`, `/readyz`, `/metrics`).
//! - [`probe`] — `probe` mode: `serve` (livenessprobe), `once`, `registration`, `check` (one
//!   Probe call), `kubelet` (the kubelet's plugin manager: `watcher`, `state`, `reconciler`,
//!   `register`, `validate`, `csinode`, `backoff`, `report`), and `doctor` (read-only diagnosis
//!   of registration on a live node: `root`, `scan`, `chain`, `driver`, `node`, `rpc`,
//!   `access`, `api` behind the `kube-api` feature, `finding`, `report`, `settings`).
//! - [`demo`] — the whole flow and a volume's life in one command (`demo` mode).
//!
//! Outside `src/`: `proto/` (our wire-identical protos), `tests/` (one test crate,
//! `tests/main.rs`, a module per area and `tests/common/` for the fakes and helpers: real
//! processes, sockets and mounts), `benches/` + `examples/` (benchmarks that print figures),
//! `scripts/` (static build, image, demo, benchmarks), `packaging/` (Containerfile, Kubernetes
//! manifests).

pub mod backoff;
pub mod cli;
pub mod csi_spec;
pub mod demo;
pub mod gocompat;
pub mod http;
pub mod linux;
pub mod logging;
pub mod metrics;
pub mod node_server;
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

/// A usage mistake found after flag parsing (a missing subcommand, flags that exclude each
/// other, a value the mode cannot use); `main` reports it like a bad flag, with exit code 2.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct UsageError(pub BoxError);

impl UsageError {
    pub fn new(error: impl Into<BoxError>) -> Self {
        Self(error.into())
    }

    /// A flag's value the mode cannot use, in the words of Go's flag package:
    /// `invalid value "" for flag --csi-address: socket address is empty`.
    pub fn flag(flag: &str, value: &str, why: impl std::fmt::Display) -> Self {
        Self::new(format!(
            "invalid value {} for flag {flag}: {why}",
            gocompat::quote(value)
        ))
    }
}
