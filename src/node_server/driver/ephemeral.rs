//! CSI ephemeral inline volumes: they arrive at NodePublishVolume with no CreateVolume, are
//! created there (sized by `volume_context["size"]`, of the layout `volume_context["layout"]`
//! asks for, accounted like any volume) and removed again by NodeUnpublishVolume. An image
//! one's filesystem is mounted at the target itself (it has no staging path), and its device
//! detached at the unpublish.

use std::collections::HashMap;

use super::node_error::NodeError;
use crate::linux::ext4_image;
use crate::linux::mount::Mounter;
use crate::node_server::state::capacity;
use crate::node_server::state::volumes::{Layout, Record, Volumes};

/// Set by the kubelet on CSI ephemeral inline volumes.
pub const EPHEMERAL_KEY: &str = "csi.storage.k8s.io/ephemeral";

/// Whether a publish request is for an ephemeral inline volume.
pub fn is_ephemeral(context: &HashMap<String, String>) -> bool {
    context.get(EPHEMERAL_KEY).is_some_and(|v| v == "true")
}

/// The record of an ephemeral volume, creating it (sized by `volume_context["size"]`, of the
/// layout `volume_context["layout"]` asks for) on first publish, an image volume's file by
/// `fill_image` (given its directory and size). Returns whether it was created now.
pub fn open(
    volumes: &Volumes,
    id: &str,
    context: &HashMap<String, String>,
    fill_image: impl FnOnce(&std::path::Path, u64) -> Result<(), NodeError>,
) -> Result<(Record, bool), NodeError> {
    if let Some(record) = volumes.records().get(id) {
        if !record.ephemeral {
            return Err(NodeError::NotEphemeral { id: id.to_owned() });
        }
        return Ok((record, false));
    }
    let size = match context.get("size") {
        Some(text) => crate::quantity::parse_quantity(text).map_err(NodeError::EphemeralSize)?,
        None => capacity::DEFAULT_SIZE,
    };
    let layout = Layout::from_parameters(context, false).map_err(NodeError::EphemeralLayout)?;
    let capacity = match layout {
        // Whole blocks, at least the empty filesystem's 16 MiB.
        Layout::Image => ext4_image::fs_bytes(size),
        Layout::Directory => size,
    };
    let record = Record {
        id: id.to_owned(),
        name: String::new(),
        capacity,
        ephemeral: true,
        layout,
        ..Default::default()
    };
    let created = match layout {
        Layout::Image => volumes.create_with(record, |record| {
            fill_image(&volumes.path_of(&record.id), record.capacity)
        })?,
        Layout::Directory => volumes.create(record)?,
    };
    Ok((created, true))
}

/// Removes an ephemeral volume once unpublished from its last target; other volumes are
/// left alone. Still published at another target, it stays until that one is unpublished.
pub fn remove(volumes: &Volumes, mounter: &dyn Mounter, id: &str) -> Result<(), NodeError> {
    match volumes.records().get(id) {
        Some(record) if record.ephemeral => {
            let table = mounter.mount_table()?;
            if let Some(at) = volumes.storage_of(&record).user(id, &table)? {
                log::debug!(
                    "ephemeral volume {id} stays: still published at {}",
                    at.display()
                );
                return Ok(());
            }
            Ok(volumes.delete(id, &table)?)
        }
        _ => Ok(()),
    }
}
