//! The integration tests, as one test crate: each module below was its own crate once, and
//! linking tonic and hyper into twenty binaries cost more than running them. `common` holds the
//! helpers they share (the real binary, fake drivers and plugins, the mount sandbox).
//!
//! Tests that need root, mounts or a tool say so with `#[ignore = "needs …"]`; the README's
//! test command runs them too (`-- --include-ignored`).

mod common;

mod copy_safety;
mod copy_tree;
mod demo;
mod dispatch;
mod docs_links;
mod end_to_end;
mod fault_suite;
mod flags;
mod flags_fixture;
mod flags_help;
mod grpc_any_authority;
mod http_flood;
mod logging;
mod loop_device_safety;
mod loop_devices;
mod node_server_block;
mod node_server_block_content;
mod node_server_careless_requests;
mod node_server_concurrency;
mod node_server_controller_errors;
mod node_server_group_snapshots;
mod node_server_lifecycle;
mod node_server_modify;
mod node_server_mount_table;
mod node_server_node_errors;
mod node_server_oversize_requests;
mod node_server_quota_modes;
mod node_server_sanity;
mod node_server_snapshot_crash;
mod node_server_snapshot_errors;
mod node_server_snapshot_fs;
mod node_server_snapshots;
mod packaging_image;
mod packaging_manifests;
mod probe;
mod probe_doctor;
#[cfg(feature = "kube-api")]
mod probe_doctor_api;
mod probe_doctor_chain;
mod probe_doctor_root;
mod probe_kubelet;
mod probe_kubelet_cli;
mod probe_kubelet_watch;
mod probe_serve_follows_driver;
mod proto_paths;
mod quota_vm;
mod registrar;
mod signals;
mod socket_layer;
