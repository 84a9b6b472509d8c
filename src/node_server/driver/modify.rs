//! ControllerModifyVolume: a volume's mutable attributes (see [`attributes`](crate::node_server::state::attributes))
//! changed while it may be in use, and the check that a volume (or this node) can hold the
//! attributes asked for, shared with CreateVolume.

use super::Driver;
use super::controller_error::ControllerError;
use crate::node_server::state::attributes::{Attributes, DIRECT_IO, INODE_LIMIT, ROOT_MODE};
use crate::node_server::state::volumes::{Layout, Record};

impl Driver {
    /// Applies the attributes `change` names to volume `id`, keeping the others; idempotent
    /// (the same change again applies the same values again). The caller holds its lock.
    pub fn modify(&self, id: &str, change: Attributes) -> Result<Record, ControllerError> {
        let record = self
            .volumes
            .records()
            .provisioned(id, "ControllerModifyVolume")?;
        self.check_attributes(&change, Some(&record), record.block, record.layout)?;
        let attributes = record.attributes.with(change);
        let record = self.volumes.set_attributes(id, attributes)?;
        if record.has_own_file() {
            self.apply_direct_io(&record)?;
        }
        if record.is_image() {
            self.apply_image_root_mode(&record);
        }
        self.rehold_io_limits(&record)?;
        Ok(record)
    }

    /// Whether `wanted` can hold on `volume` (`None`: a volume about to be created here).
    pub(super) fn check_attributes(
        &self,
        wanted: &Attributes,
        volume: Option<&Record>,
        block: bool,
        layout: Layout,
    ) -> Result<(), ControllerError> {
        let image = layout == Layout::Image;
        let kind = match (block, image) {
            (true, _) => "block volume",
            (false, true) => "image volume",
            (false, false) => "volume",
        };
        let what = || match volume {
            Some(record) => format!("{kind} {}", record.id),
            None => format!("a new {kind}"),
        };
        if block && (wanted.inode_limit.is_some() || wanted.root_mode.is_some()) {
            let key = if wanted.inode_limit.is_some() {
                INODE_LIMIT
            } else {
                ROOT_MODE
            };
            return Err(ControllerError::CannotApply {
                key,
                what: what(),
                why: "a block volume is a device, with no directory or inodes of its own".into(),
            });
        }
        if image && let Some(key) = wanted.inode_limit.map(|_| INODE_LIMIT) {
            return Err(ControllerError::CannotApply {
                key,
                what: what(),
                why: "its inodes are its own filesystem's (one per 16 KiB of its size), not a \
                      project quota's"
                    .into(),
            });
        }
        if !block && !image && wanted.direct_io.is_some() {
            return Err(ControllerError::CannotApply {
                key: DIRECT_IO,
                what: what(),
                why: "it is a directory; only block and image volumes have a loop device".into(),
            });
        }
        if let Some(key) = wanted.io_key() {
            if !block && !image {
                return Err(ControllerError::CannotApply {
                    key,
                    what: what(),
                    why: "it is a directory on the state directory's filesystem, whose device \
                          every such volume shares; IO limits need a device of the volume's \
                          own (layout: image, or a block volume)"
                        .into(),
                });
            }
            if let Some(key) = wanted.io_limit_key()
                && let Err(e) = self.io_hierarchy()
            {
                return Err(ControllerError::CannotApply {
                    key,
                    what: what(),
                    why: e.to_string(),
                });
            }
        }
        if wanted.inode_limit.is_none() {
            return Ok(());
        }
        let cannot = |why: String| ControllerError::CannotApply {
            key: INODE_LIMIT,
            what: what(),
            why,
        };
        if let Some(why) = self.volumes.directories().unenforced_reason() {
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
