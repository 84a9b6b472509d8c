//! Inline ephemeral volumes of the image layout (`volume_context["layout"] = "image"`): the
//! file made at the first NodePublishVolume, its filesystem mounted at the target itself (an
//! inline volume has no staging path), as a stage mounts a provisioned one's; the unpublish
//! unmounts it and detaches its device (`node_ops`), and `ephemeral` removes the volume.

use std::path::Path;

use super::Driver;
use super::bind_mounts::{self, Published};
use super::image::create_thick;
use super::node_error::NodeError;
use super::node_ops::PublishRequest;
use crate::csi_spec::Field;
use crate::node_server::state::state_dir::block_image_in;
use crate::node_server::state::volumes::{Record, VolumeError};
use crate::path_io::PathIoError;

impl Driver {
    /// An ephemeral image volume's file, as [`Self::fill_image`] makes a provisioned one's.
    pub(super) fn fill_ephemeral_image(&self, dir: &Path, bytes: u64) -> Result<(), NodeError> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(PathIoError::at("set the mode of", dir))
            .map_err(VolumeError::from)?;
        let image = block_image_in(dir);
        create_thick(&image, bytes)
    }

    /// NodePublishVolume of an ephemeral image volume (opened, `created` now or before): its
    /// filesystem mounted at the target itself, as a stage mounts a provisioned one's at its
    /// staging path, with the request's options and group. A first publish that fails leaves
    /// no volume behind.
    pub(super) fn publish_ephemeral_image(
        &self,
        req: &PublishRequest,
        record: &Record,
        created: bool,
        target: &Path,
    ) -> Result<Published, NodeError> {
        let made = bind_mounts::make_mount_point(Field::TargetPath, target);
        let staged = made.map_err(NodeError::from).and_then(|made| {
            let context = req.context.as_ref();
            self.stage_image(record, target, req.options, context, req.group)?;
            Ok(Published::Mounted { created: made })
        });
        if staged.is_err() && created {
            let table = self.mounter.mount_table()?;
            if let Err(e) = self.volumes.delete(&record.id, &table) {
                log::warn!(
                    "ephemeral volume {} of a failed publish stays: {e}",
                    record.id
                );
            }
        }
        staged
    }
}
