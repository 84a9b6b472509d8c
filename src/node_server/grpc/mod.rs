//! The CSI services node-server serves, one file per service (validate → act → respond), each
//! with the table that maps its operations' failures to gRPC codes, and the request checks
//! they share.
//!
//! - [`identity`], [`node`], [`controller`] (+ [`controller_snapshots`]), [`group_controller`],
//!   [`snapshot_metadata`] — the services.
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
