//! What the CSI spec fixes, shared by every mode that checks it: the naming rule for driver
//! names ([`driver_name`]), the size limits on fields ("Field Requirements › Size Limits"),
//! and the names of the path fields that errors below the gRPC handlers name (`field`,
//! [`Field`]).

pub mod driver_name;
mod field;

pub use field::Field;

/// The longest node ID the CSI spec allows (`NodeGetInfoResponse.node_id`).
pub const MAX_NODE_ID: usize = 256;
/// The general limit on a string field.
pub const MAX_STRING: usize = 128;
/// The general limit on a `map<string, string>` field.
pub const MAX_MAP: usize = 4096;
/// The total of `MountVolume.mount_flags`.
pub const MAX_MOUNT_FLAGS: usize = 4096;
/// Path fields: PATH_MAX, terminating NUL included.
pub const MAX_PATH: usize = 4096;
