//! csi-nodekit: everything a Kubernetes CSI driver needs on a node, in one static binary.
//!
//! # Layout
//!
//! - `main.rs` — thin: argv → mode → run → exit code (the only place that picks exit codes).
//! - [`cli`] — mode dispatch from `argv[0]` or a subcommand; Go-style flag normalisation.
//! - [`proto`] — generated gRPC code: CSI v1 and the kubelet plugin-registration API.
//! - [`socket`] — the shared socket layer: address parsing, safe bind, owner-checked removal,
//!   dialling with back-off.
//! - [`shutdown`] — SIGTERM/SIGINT → one shutdown future for every server; grace period.
//! - [`logging`] — klog-style `--v` on env_logger; text or JSON lines.
//! - [`node_server`] — the CSI plugin (`node-server` mode).

pub mod cli;
pub mod logging;
pub mod node_server;
pub mod proto;
pub mod shutdown;
pub mod socket;

/// The error type mode entry points return; `main` prints it and exits 1.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What `main` needs from every mode's argument struct, beyond parsing.
pub trait ModeArgs: argh::FromArgs + argh::ArgsInfo {
    /// `--version` was given.
    fn version(&self) -> bool;
    /// `--v` and `--logging-format`.
    fn logging(&self) -> (u8, logging::Format);
}
