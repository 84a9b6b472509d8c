//! CSI ephemeral inline volumes: they arrive at NodePublishVolume with no CreateVolume, are
//! created there (sized by `volume_context["size"]`, accounted like any volume) and removed
//! again by NodeUnpublishVolume.

use std::collections::HashMap;

use tonic::Status;

use super::volumes::Record;
use super::{Driver, capacity};

/// Set by the kubelet on CSI ephemeral inline volumes.
pub const EPHEMERAL_KEY: &str = "csi.storage.k8s.io/ephemeral";

/// Whether a publish request is for an ephemeral inline volume.
pub fn is_ephemeral(context: &HashMap<String, String>) -> bool {
    context.get(EPHEMERAL_KEY).is_some_and(|v| v == "true")
}

impl Driver {
    /// The record of an ephemeral volume, creating it (sized by `volume_context["size"]`) on
    /// first publish. Returns whether it was created now.
    pub(super) fn ephemeral(
        &self,
        id: &str,
        context: &HashMap<String, String>,
    ) -> Result<(Record, bool), Status> {
        if let Some(record) = self.volumes.get(id) {
            if !record.ephemeral {
                return Err(Status::already_exists(format!(
                    "volume {id} exists and is not an ephemeral volume"
                )));
            }
            return Ok((record, false));
        }
        let size = match context.get("size") {
            Some(text) => capacity::parse_quantity(text).map_err(Status::invalid_argument)?,
            None => capacity::DEFAULT_SIZE,
        };
        let record = Record {
            id: id.to_owned(),
            name: String::new(),
            capacity: size,
            ephemeral: true,
        };
        Ok((self.volumes.create(record)?, true))
    }

    /// Removes an ephemeral volume once unpublished; other volumes are left alone.
    pub(super) fn drop_ephemeral(&self, id: &str) -> Result<(), Status> {
        match self.volumes.get(id) {
            Some(record) if record.ephemeral => {
                let table = self.mounter.mount_table()?;
                self.volumes.delete(id, &table)
            }
            _ => Ok(()),
        }
    }
}
