//! Generated gRPC code for the two contracts we speak, compiled from `proto/` by `build.rs`.

/// CSI v1: Identity, Controller, Node (and the services we do not serve).
pub mod csi {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("csi.v1");
}

/// The kubelet's plugin-registration API (package `pluginregistration`).
pub mod registration {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("pluginregistration");
}
