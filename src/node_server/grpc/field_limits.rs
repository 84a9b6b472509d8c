//! The CSI spec's size limits ("Field Requirements › Size Limits"), checked first by every
//! handler of every service: each request message implements [`SizeLimits`] (one without
//! string or map fields trivially), and every handler that reads its request calls
//! [`SizeLimits::check_sizes`] on it first (those that read nothing — capabilities, node info,
//! Probe, the calls we do not serve — have nothing to bound), so that an over-long field is
//! INVALID_ARGUMENT before anything is looked up, kept or written:
//! strings at most 128 bytes and maps at most 4 KiB, unless the field says otherwise — paths
//! (`staging_target_path`, `target_path`, `volume_path`) may be as long as the OS allows, and
//! `mount_flags` may total 4 KiB. (`tests/node_server/every_rpc_validates.rs` enumerates the
//! services' descriptors so that a new RPC cannot go without.)
//!
//! A map's size is the sum of its keys' and values' bytes. `ListVolumes.starting_token` is
//! left to its decoding (ABORTED when not ours): our tokens are the hex of an ID, so a
//! kubelet's 68-byte inline-volume ID makes a 136-byte token.
//!
//! Whole messages are bounded before they are decoded: [`MAX_REQUEST`].

use std::collections::HashMap;

use tonic::Status;

use crate::csi_spec::Field;
use crate::proto::csi::*;

pub use crate::csi_spec::{MAX_MAP, MAX_MOUNT_FLAGS, MAX_PATH, MAX_STRING};

/// The largest request node-server decodes. The largest legal fixed-shape request,
/// NodePublishVolume, encodes to about 58 KiB (three 4 KiB maps at 12 KiB each with two-byte
/// keys, 4 KiB of one-byte mount flags at 12 KiB, two 4 KiB paths; a test pins it); the rest
/// is room for CreateVolume's repeated capabilities and topologies (some 1,500 terms from an
/// external-provisioner without `--strict-topology`). A larger message is refused with
/// RESOURCE_EXHAUSTED from its 5-byte length prefix, before it is buffered.
pub const MAX_REQUEST: usize = 256 << 10;

/// A request whose fields are checked against the spec's limits.
pub trait SizeLimits {
    fn check_sizes(&self) -> Result<(), Status>;
}

/// Requests with no string or map field: nothing to bound.
macro_rules! nothing_to_bound {
    ($($request:ty),+ $(,)?) => {
        $(impl SizeLimits for $request {
            fn check_sizes(&self) -> Result<(), Status> {
                Ok(())
            }
        })+
    };
}

nothing_to_bound!(
    GetPluginInfoRequest,
    GetPluginCapabilitiesRequest,
    ProbeRequest,
    ControllerGetCapabilitiesRequest,
    NodeGetCapabilitiesRequest,
    NodeGetInfoRequest,
    GroupControllerGetCapabilitiesRequest,
);

fn strings(field: &str, values: &[String]) -> Result<(), Status> {
    values.iter().try_for_each(|v| string(field, v))
}

impl SizeLimits for ListVolumesRequest {
    /// `starting_token` is bounded by its decoding ([`validate::decode_token`](super::validate::decode_token)).
    fn check_sizes(&self) -> Result<(), Status> {
        Ok(())
    }
}

impl SizeLimits for ControllerPublishVolumeRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("volume_id", &self.volume_id)?;
        string("node_id", &self.node_id)?;
        capabilities("volume_capability", self.volume_capability.as_slice())?;
        map("secrets", &self.secrets)?;
        map("volume_context", &self.volume_context)
    }
}

impl SizeLimits for ControllerUnpublishVolumeRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("volume_id", &self.volume_id)?;
        string("node_id", &self.node_id)?;
        map("secrets", &self.secrets)
    }
}

impl SizeLimits for ControllerGetVolumeRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("volume_id", &self.volume_id)
    }
}

impl SizeLimits for CreateSnapshotRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("source_volume_id", &self.source_volume_id)?;
        string("name", &self.name)?;
        map("secrets", &self.secrets)?;
        map("parameters", &self.parameters)
    }
}

impl SizeLimits for DeleteSnapshotRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("snapshot_id", &self.snapshot_id)?;
        map("secrets", &self.secrets)
    }
}

impl SizeLimits for ListSnapshotsRequest {
    /// `starting_token` is bounded by its decoding.
    fn check_sizes(&self) -> Result<(), Status> {
        string("source_volume_id", &self.source_volume_id)?;
        string("snapshot_id", &self.snapshot_id)?;
        map("secrets", &self.secrets)
    }
}

impl SizeLimits for GetSnapshotRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("snapshot_id", &self.snapshot_id)?;
        map("secrets", &self.secrets)
    }
}

impl SizeLimits for GetMetadataAllocatedRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("snapshot_id", &self.snapshot_id)?;
        map("secrets", &self.secrets)
    }
}

impl SizeLimits for GetMetadataDeltaRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("base_snapshot_id", &self.base_snapshot_id)?;
        string("target_snapshot_id", &self.target_snapshot_id)?;
        map("secrets", &self.secrets)
    }
}

impl SizeLimits for CreateVolumeGroupSnapshotRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("name", &self.name)?;
        strings("source_volume_ids", &self.source_volume_ids)?;
        map("secrets", &self.secrets)?;
        map("parameters", &self.parameters)
    }
}

impl SizeLimits for DeleteVolumeGroupSnapshotRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("group_snapshot_id", &self.group_snapshot_id)?;
        strings("snapshot_ids", &self.snapshot_ids)?;
        map("secrets", &self.secrets)
    }
}

impl SizeLimits for GetVolumeGroupSnapshotRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("group_snapshot_id", &self.group_snapshot_id)?;
        strings("snapshot_ids", &self.snapshot_ids)?;
        map("secrets", &self.secrets)
    }
}

fn too_long(field: &str, size: usize, limit: usize, what: &str) -> Status {
    Status::invalid_argument(format!(
        "{field} is {size} bytes{what}; the CSI spec allows at most {limit}"
    ))
}

fn string(field: &str, value: &str) -> Result<(), Status> {
    match value.len() {
        n if n > MAX_STRING => Err(too_long(field, n, MAX_STRING, "")),
        _ => Ok(()),
    }
}

fn path(field: Field, value: &str) -> Result<(), Status> {
    match value.len() {
        n if n >= MAX_PATH => Err(too_long(field.wire_name(), n, MAX_PATH - 1, " (a path)")),
        _ => Ok(()),
    }
}

fn map(field: &str, value: &HashMap<String, String>) -> Result<(), Status> {
    let size = value.iter().map(|(k, v)| k.len() + v.len()).sum();
    match size {
        n if n > MAX_MAP => Err(too_long(field, n, MAX_MAP, " of keys and values")),
        _ => Ok(()),
    }
}

fn capability(field: &str, cap: &VolumeCapability) -> Result<(), Status> {
    let Some(volume_capability::AccessType::Mount(mount)) = &cap.access_type else {
        return Ok(());
    };
    string(&format!("{field}.mount.fs_type"), &mount.fs_type)?;
    string(
        &format!("{field}.mount.volume_mount_group"),
        &mount.volume_mount_group,
    )?;
    let flags: usize = mount.mount_flags.iter().map(String::len).sum();
    if flags > MAX_MOUNT_FLAGS {
        return Err(too_long(
            &format!("{field}.mount.mount_flags"),
            flags,
            MAX_MOUNT_FLAGS,
            " in all",
        ));
    }
    Ok(())
}

fn capabilities(field: &str, caps: &[VolumeCapability]) -> Result<(), Status> {
    caps.iter().try_for_each(|cap| capability(field, cap))
}

fn topologies(field: &str, topologies: &[Topology]) -> Result<(), Status> {
    (topologies.iter()).try_for_each(|t| map(&format!("{field}.segments"), &t.segments))
}

impl SizeLimits for CreateVolumeRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("name", &self.name)?;
        capabilities("volume_capabilities", &self.volume_capabilities)?;
        map("parameters", &self.parameters)?;
        map("secrets", &self.secrets)?;
        map("mutable_parameters", &self.mutable_parameters)?;
        if let Some(source) = self
            .volume_content_source
            .as_ref()
            .and_then(|s| s.r#type.as_ref())
        {
            match source {
                volume_content_source::Type::Snapshot(s) => {
                    string("volume_content_source.snapshot.snapshot_id", &s.snapshot_id)?
                }
                volume_content_source::Type::Volume(v) => {
                    string("volume_content_source.volume.volume_id", &v.volume_id)?
                }
            }
        }
        if let Some(wanted) = &self.accessibility_requirements {
            topologies("accessibility_requirements.requisite", &wanted.requisite)?;
            topologies("accessibility_requirements.preferred", &wanted.preferred)?;
        }
        Ok(())
    }
}

impl SizeLimits for DeleteVolumeRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("volume_id", &self.volume_id)?;
        map("secrets", &self.secrets)
    }
}

impl SizeLimits for ValidateVolumeCapabilitiesRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("volume_id", &self.volume_id)?;
        map("volume_context", &self.volume_context)?;
        capabilities("volume_capabilities", &self.volume_capabilities)?;
        map("parameters", &self.parameters)?;
        map("secrets", &self.secrets)?;
        map("mutable_parameters", &self.mutable_parameters)
    }
}

impl SizeLimits for GetCapacityRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        capabilities("volume_capabilities", &self.volume_capabilities)?;
        map("parameters", &self.parameters)?;
        topologies("accessible_topology", self.accessible_topology.as_slice())
    }
}

impl SizeLimits for ControllerExpandVolumeRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("volume_id", &self.volume_id)?;
        map("secrets", &self.secrets)?;
        capabilities("volume_capability", self.volume_capability.as_slice())
    }
}

impl SizeLimits for ControllerModifyVolumeRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("volume_id", &self.volume_id)?;
        map("secrets", &self.secrets)?;
        map("mutable_parameters", &self.mutable_parameters)
    }
}

impl SizeLimits for NodeStageVolumeRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("volume_id", &self.volume_id)?;
        map("publish_context", &self.publish_context)?;
        path(Field::StagingTargetPath, &self.staging_target_path)?;
        capabilities("volume_capability", self.volume_capability.as_slice())?;
        map("secrets", &self.secrets)?;
        map("volume_context", &self.volume_context)
    }
}

impl SizeLimits for NodeUnstageVolumeRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("volume_id", &self.volume_id)?;
        path(Field::StagingTargetPath, &self.staging_target_path)
    }
}

impl SizeLimits for NodePublishVolumeRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("volume_id", &self.volume_id)?;
        map("publish_context", &self.publish_context)?;
        path(Field::StagingTargetPath, &self.staging_target_path)?;
        path(Field::TargetPath, &self.target_path)?;
        capabilities("volume_capability", self.volume_capability.as_slice())?;
        map("secrets", &self.secrets)?;
        map("volume_context", &self.volume_context)
    }
}

impl SizeLimits for NodeUnpublishVolumeRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("volume_id", &self.volume_id)?;
        path(Field::TargetPath, &self.target_path)
    }
}

impl SizeLimits for NodeGetVolumeStatsRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("volume_id", &self.volume_id)?;
        path(Field::VolumePath, &self.volume_path)?;
        path(Field::StagingTargetPath, &self.staging_target_path)
    }
}

impl SizeLimits for NodeExpandVolumeRequest {
    fn check_sizes(&self) -> Result<(), Status> {
        string("volume_id", &self.volume_id)?;
        path(Field::VolumePath, &self.volume_path)?;
        path(Field::StagingTargetPath, &self.staging_target_path)?;
        capabilities("volume_capability", self.volume_capability.as_slice())?;
        map("secrets", &self.secrets)
    }
}

#[cfg(test)]
mod tests;
