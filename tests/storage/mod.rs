//! The Linux layer under `node-server`, on real filesystems and devices: the copy engine
//! behind snapshots and loop devices (project quotas, which need another kernel, are
//! `booted::quota_vm`).

// `fault_suite::copies` churns a volume the same way under the real binary.
pub(crate) mod copy_churn;
mod copy_safety;
mod copy_tree;
mod ext4_image;
mod loop_device_safety;
mod loop_devices;
mod quota_remake;
mod quota_write_watch;
