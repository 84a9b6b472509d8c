//! `node-server`, the CSI plugin, through real gRPC: a volume's life, snapshots, block
//! volumes, every error code, and csi-sanity re-enacted (`sanity`).

mod access_modes;
mod block;
mod block_content;
// `fault_suite::volumes` asks it for the codes of malformed requests.
pub(crate) mod careless_requests;
// `fault_suite::snapshot_requests` sends the same.
pub(crate) mod careless_snapshot_requests;
mod concurrency;
mod controller_errors;
mod every_rpc_validates;
mod group_snapshots;
mod image;
mod image_attacks;
mod image_copies;
mod image_full_host;
mod image_inline;
mod interrupted_delete;
mod io_limits;
mod lifecycle;
mod modify;
mod mount_table;
mod node_errors;
mod node_only_expansion;
mod orphans;
mod oversize_requests;
mod own_paths;
// `fault_suite::private_state` starts node-server the same way and checks the same modes.
pub(crate) mod private_state;
mod quota_modes;
mod reservation;
mod resizer_endpoint;
mod sanity;
pub(crate) mod selinux_mounts;
mod snapshot_crash;
mod snapshot_errors;
mod snapshot_fs;
mod snapshot_metadata;
mod snapshots;
mod state_dir_owner;
