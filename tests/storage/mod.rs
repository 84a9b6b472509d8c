//! The Linux layer under `node-server`, on real filesystems and devices: the copy engine
//! behind snapshots, loop devices, and project quotas under a real kernel (`quota_vm`).

mod copy_churn;
mod copy_safety;
mod copy_tree;
mod loop_device_safety;
mod loop_devices;
mod quota_vm;
