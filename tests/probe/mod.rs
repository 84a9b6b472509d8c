//! `probe`: the drop-in livenessprobe and the exec probes (`health`), the kubelet emulator
//! (`kubelet*`) and the doctor (`doctor*`).

mod doctor;
#[cfg(feature = "kube-api")]
mod doctor_api;
mod doctor_chain;
mod doctor_exits;
mod doctor_links;
mod doctor_root;
mod health;
mod kubelet;
mod kubelet_cli;
mod kubelet_watch;
mod serve_follows_driver;
