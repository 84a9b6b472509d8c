//! The request fields that name a path on the node. Errors far below the gRPC handlers name
//! them (a staging path that overlaps the state directory, a target that holds another mount),
//! so they carry a [`Field`] rather than a string, and its wire name is spelled here once.

use std::fmt;

/// A path field of a Node service request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    /// NodeStageVolume's, NodeUnstageVolume's and NodePublishVolume's `staging_target_path`;
    /// NodeGetVolumeStats' and NodeExpandVolume's too, where the CO sends it.
    StagingTargetPath,
    /// NodePublishVolume's and NodeUnpublishVolume's `target_path`.
    TargetPath,
    /// NodeGetVolumeStats' and NodeExpandVolume's `volume_path`.
    VolumePath,
}

impl Field {
    /// The field's name in the CSI proto, as messages name it.
    pub const fn wire_name(self) -> &'static str {
        match self {
            Field::StagingTargetPath => "staging_target_path",
            Field::TargetPath => "target_path",
            Field::VolumePath => "volume_path",
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.wire_name())
    }
}
