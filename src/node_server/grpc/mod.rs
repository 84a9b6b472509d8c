//! The CSI services node-server serves, one file per service (validate → act → respond), each
//! with the table that maps its operations' failures to gRPC codes, and the request checks
//! they share.
//!
//! - [`identity`], [`node`], [`controller`] (+ [`controller_snapshots`]), [`group_controller`],
//!   [`snapshot_metadata`] — the services; [`Backend`] — what the first three answer for.
//! - [`validate`] — request checks with the exact gRPC codes the CSI spec demands; pure.
//! - [`field_limits`] — the CSI spec's size limits on every field, checked before anything is
//!   looked up, and the bound on a whole request.

pub(crate) mod controller;
pub(crate) mod controller_snapshots;
pub mod field_limits;
pub(crate) mod group_controller;
pub mod identity;
pub(crate) mod node;
pub(crate) mod snapshot_metadata;
pub mod validate;

use std::sync::Arc;

use tonic::Status;

use super::driver::Driver;

/// What the Identity, Node and Controller services answer for: this node's driver, or, for
/// `node-server --resizer-only`, no node at all: only the capabilities a cluster-wide
/// external-resizer asks for, and a refusal of ControllerModifyVolume
/// ([`resizer_only`](super::resizer_only)). One set of services for both, so the binary
/// carries one copy of tonic's generated servers.
#[derive(Clone)]
pub enum Backend {
    Driver(Arc<Driver>),
    ResizerOnly { driver_name: String },
}

impl Backend {
    /// The driver a call acts on; none behind `--resizer-only`: UNIMPLEMENTED, before the
    /// request is looked at.
    pub(crate) fn driver(&self) -> Result<&Arc<Driver>, Status> {
        match self {
            Self::Driver(driver) => Ok(driver),
            Self::ResizerOnly { .. } => Err(Status::unimplemented(
                "node-server --resizer-only serves only the capabilities a cluster-wide \
                 external-resizer asks for; volume calls go to the node-server of the volume's \
                 node",
            )),
        }
    }
}
