//! What the plugin is, independent of how it is started: its name, node, state directory,
//! capacity and quota mode, checked against what the CSI spec allows.

use std::path::PathBuf;

use crate::csi_spec::MAX_NODE_ID;
use crate::csi_spec::driver_name::InvalidDriverName;
use crate::linux::quota;
use crate::node_server::block_maps::Shape;

/// What the plugin is, independent of how it is started.
#[derive(Debug, Clone)]
pub struct Config {
    pub driver_name: String,
    pub node_id: String,
    /// `--state-dir` as given, for messages; the driver resolves it once into a [`StateDir`],
    /// which every path in it comes from.
    pub state_dir: PathBuf,
    pub max_volumes_per_node: i64,
    /// Total bytes for all volumes and snapshots; `None`: the filesystem's free space.
    pub capacity: Option<u64>,
    /// `--overcommit`: without `capacity`, new volumes need only fit in the free space, not
    /// beside what existing ones were promised.
    pub overcommit: bool,
    /// `--quota`: whether volume sizes are enforced by project quotas.
    pub quota: quota::Mode,
    /// Whether ControllerGetCapabilities lists GET_SNAPSHOT.
    pub advertise_get_snapshot: bool,
    /// Whether GetPluginCapabilities lists SNAPSHOT_METADATA_SERVICE.
    pub advertise_snapshot_metadata: bool,
    /// How volumes are checked for files taken out of their project quota.
    pub quota_checks: QuotaChecks,
    /// How the SnapshotMetadata service reports ranges (`--snapshot-metadata-block-size`).
    pub block_metadata: Shape,
    /// Where the node's cgroup v2 hierarchy is mounted (`--cgroup-root`): volumes' IO limits
    /// are written in its pods' cgroups.
    pub cgroup_root: PathBuf,
}

/// The background check of volumes' project IDs (`--quota-check-interval`,
/// `--quota-check-rate`): from an escape to its charge-back takes at most about `interval`
/// plus the time to walk every volume's inodes at `rate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaChecks {
    /// The pause between the end of one pass over every volume and the start of the next.
    pub interval: std::time::Duration,
    /// Inodes looked at per second, at most.
    pub rate: u32,
}

impl QuotaChecks {
    pub const DEFAULT_INTERVAL_SECS: u64 = 20;
    pub const DEFAULT_RATE: u32 = 5000;
}

impl Default for QuotaChecks {
    fn default() -> Self {
        Self {
            interval: std::time::Duration::from_secs(Self::DEFAULT_INTERVAL_SECS),
            rate: Self::DEFAULT_RATE,
        }
    }
}

/// A configuration the CSI spec does not allow.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    DriverName(#[from] InvalidDriverName),
    #[error("node ID {0:?} must be 1 to {MAX_NODE_ID} bytes")]
    NodeId(String),
    #[error("--max-volumes-per-node may not be negative")]
    NegativeVolumeLimit,
}

impl Config {
    pub fn new(driver_name: &str, node_id: &str, state_dir: impl Into<PathBuf>) -> Self {
        Self {
            driver_name: driver_name.to_owned(),
            node_id: node_id.to_owned(),
            state_dir: state_dir.into(),
            max_volumes_per_node: 0,
            capacity: None,
            overcommit: false,
            // The library's callers (tests, benchmarks) say what they mean; the binary's
            // `--quota` defaults to auto.
            quota: quota::Mode::Off,
            advertise_get_snapshot: false,
            advertise_snapshot_metadata: false,
            quota_checks: QuotaChecks::default(),
            block_metadata: Shape::Extents,
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
        }
    }

    /// Checks what the CSI spec constrains.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        crate::csi_spec::driver_name::validate(&self.driver_name)?;
        if self.node_id.is_empty() || self.node_id.len() > MAX_NODE_ID {
            return Err(ConfigError::NodeId(self.node_id.clone()));
        }
        if self.max_volumes_per_node < 0 {
            return Err(ConfigError::NegativeVolumeLimit);
        }
        Ok(())
    }
}
