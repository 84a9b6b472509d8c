//! `registrar`, the drop-in node-driver-registrar, between a real CSI driver socket and a
//! kubelet-side client on its real registration socket: served in process (`registration`),
//! and as the real binary (`process`, `rollout`, `standby_race`).

mod process;
mod registration;
mod rollout;
mod setup;
mod standby_race;
