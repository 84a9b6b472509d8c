//! The integration tests, as one test crate: each module below was its own crate once, and
//! linking tonic and hyper into twenty binaries cost more than running them. A folder per
//! area, each with a `mod.rs` that says what it covers:
//!
//! - `node_server/`: the CSI plugin through real gRPC, and `sanity/`, csi-sanity re-enacted;
//! - `booted/`: what needs another kernel, booted in a VM (`quota_vm/`, project quotas);
//!   started first, its name sorting first, since it runs longest;
//! - `storage/`: the Linux layer under it (copies, loop devices);
//! - `registrar/`: the drop-in node-driver-registrar;
//! - `probe/`: livenessprobe and the exec probes, the kubelet emulator, the doctor;
//! - `cli/`: dispatch, flags, `--help`, logging and signals, common to every mode;
//! - `transport/`: the socket layer, gRPC and the HTTP health ports;
//! - `packaging/`: the container image, the Kubernetes manifests, the demo;
//! - `end_to_end` (the whole registration flow) and `fault_suite/` (what real nodes do to the
//!   three modes), which span every area, `docs_links` (the README's and docs/' links
//!   resolve; the README keeps CI's test command) and `module_maps` (the module docs and
//!   docs/layout.md name every module and room, and nothing that is gone).
//!
//! `common/` holds the helpers they share (the real binary, fake drivers and plugins, the
//! mount sandbox). A test's path is its folder's: `cargo test --test integration
//! node_server::lifecycle` runs one module, `… storage` one area.
//!
//! Tests that need root, mounts or a tool say so with `#[ignore = "needs …"]`; the README's
//! test command runs them too (`-- --include-ignored`).

mod common;

mod booted;
mod cli;
mod docs_links;
mod end_to_end;
mod fault_suite;
mod flow;
mod module_maps;
mod node_server;
mod packaging;
mod probe;
mod registrar;
mod storage;
mod transport;
