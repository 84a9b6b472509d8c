//! ControllerModifyVolume: a volume's mutable attributes (see [`attributes`](super::attributes))
//! changed while it may be in use, and the check that a volume (or this node) can hold the
//! attributes asked for, shared with CreateVolume.

use super::attributes::{Attributes, INODE_LIMIT};
use super::driver::Driver;
use super::error::ControllerError;
use super::volumes::Record;

impl Driver {
    /// Applies the attributes `change` names to volume `id`, keeping the others; idempotent
    /// (the same change again applies the same values again). The caller holds its lock.
    pub fn modify(&self, id: &str, change: Attributes) -> Result<Record, ControllerError> {
        let record = self.volumes.known(id)?;
        self.check_attributes(&change, Some(&record))?;
        let attributes = record.attributes.with(change);
        Ok(self.volumes.set_attributes(id, attributes)?)
    }

    /// Whether `wanted` can hold on `volume` (`None`: a volume about to be created here).
    pub(super) fn check_attributes(
        &self,
        wanted: &Attributes,
        volume: Option<&Record>,
    ) -> Result<(), ControllerError> {
        if wanted.inode_limit.is_none() {
            return Ok(());
        }
        let what = || match volume {
            Some(record) => format!("volume {}", record.id),
            None => "a new volume on this node".to_owned(),
        };
        let cannot = |why: String| ControllerError::CannotApply {
            key: INODE_LIMIT,
            what: what(),
            why,
        };
        if let Some(why) = self.volumes.quota_reason() {
            return Err(cannot(format!("it is a project quota limit, and {why}")));
        }
        if volume.is_some_and(|r| r.project_id.is_none()) {
            return Err(cannot(
                "the volume has no project quota (it was created while sizes were not \
                 enforced)"
                    .to_owned(),
            ));
        }
        Ok(())
    }
}
