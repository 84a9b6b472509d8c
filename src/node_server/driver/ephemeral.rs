//! CSI ephemeral inline volumes: they arrive at NodePublishVolume with no CreateVolume, are
//! created there (sized by `volume_context["size"]`, accounted like any volume) and removed
//! again by NodeUnpublishVolume.

use std::collections::HashMap;

use super::node_error::NodeError;
use crate::linux::mount::Mounter;
use crate::node_server::state::capacity;
use crate::node_server::state::volumes::{Record, Volumes};

/// Set by the kubelet on CSI ephemeral inline volumes.
pub const EPHEMERAL_KEY: &str = "csi.storage.k8s.io/ephemeral";

/// Whether a publish request is for an ephemeral inline volume.
pub fn is_ephemeral(context: &HashMap<String, String>) -> bool {
    context.get(EPHEMERAL_KEY).is_some_and(|v| v == "true")
}

/// The record of an ephemeral volume, creating it (sized by `volume_context["size"]`) on first
/// publish. Returns whether it was created now.
pub fn open(
    volumes: &Volumes,
    id: &str,
    context: &HashMap<String, String>,
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
    let record = Record {
        id: id.to_owned(),
        name: String::new(),
        capacity: size,
        ephemeral: true,
        ..Default::default()
    };
    Ok((volumes.create(record)?, true))
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
