//! The Linux layer under `node-server`, on real filesystems and devices: the copy engine
//! behind snapshots, loop devices, and project quotas under a real kernel (`quota_vm`).

// `fault_suite::copies` churns a volume the same way under the real binary.
pub(crate) mod copy_churn;
mod copy_safety;
mod copy_tree;
mod ext4_image;
mod loop_device_safety;
mod loop_devices;
mod quota_vm;
