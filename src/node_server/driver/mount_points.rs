//! The checks every staging and target path of a Node request goes through before anything
//! is mounted there: resolved as the kernel will see it, not inside or above the state
//! directory, not the other call's path, not inside a mount of one of our volumes, and for a
//! single writer, not staged elsewhere.

use std::path::{Path, PathBuf};

use super::Driver;
use super::bind_mounts;
use super::node_error::NodeError;
use crate::csi_spec::Field;
use crate::linux::mountinfo::Unlocatable;
use crate::node_server::state::volumes::roles::Role;
use crate::node_server::state::volumes::{Record, VolumeError};

impl Driver {
    /// A mount point from a request, resolved; refused inside or above the state directory,
    /// where a mount could cover or be deleted with volume data. `None`: its parent is missing.
    pub(super) fn mount_point(
        &self,
        field: Field,
        path: &Path,
    ) -> Result<Option<PathBuf>, NodeError> {
        let resolved = bind_mounts::resolve(field, path)?;
        let state_dir = self.state_dir.root();
        if let Some(real) = &resolved
            && (real.starts_with(state_dir) || state_dir.starts_with(real))
        {
            return Err(NodeError::OverlapsState {
                field,
                path: path.to_owned(),
                state_dir: state_dir.to_owned(),
            });
        }
        Ok(resolved)
    }

    /// A mount point whose parent must exist.
    pub(super) fn existing_mount_point(
        &self,
        field: Field,
        path: &Path,
    ) -> Result<PathBuf, NodeError> {
        self.mount_point(field, path)?
            .ok_or(NodeError::MissingParent { field })
    }

    /// Refuses a path that another call owns: a staging path where a target is expected (or
    /// the other way round), by any volume's record.
    pub(super) fn not_the_other_calls(&self, role: Role, path: &Path) -> Result<(), NodeError> {
        let other = match role {
            Role::Staging => Role::Target,
            Role::Target => Role::Staging,
        };
        match self.volumes.records().using(path, other) {
            Some(id) => Err(NodeError::OtherCallsPath {
                field: role.field(),
                path: path.to_owned(),
                is: other.field(),
                id,
            }),
            None => Ok(()),
        }
    }

    /// Refuses a mount point whose parent lies in a mount of one of our volumes (a staging or
    /// target mount of any volume, or an image volume's own filesystem wherever it is
    /// mounted): making it would write into that volume's data. Asked of
    /// the two mounts concerned (the parent's, the volume data's), not the whole table.
    pub(super) fn not_inside_a_volume(&self, field: Field, path: &Path) -> Result<(), NodeError> {
        let Some(parent) = path.parent() else {
            return Ok(());
        };
        let data_dir = self.state_dir.volume_data();
        let unlocatable = || VolumeError::from(Unlocatable(data_dir.to_owned()));
        let data = (self.mounter.containing(data_dir)?)
            .and_then(|mount| mount.source_of(data_dir))
            .ok_or_else(unlocatable)?;
        let Some(mount) = self.mounter.containing(parent)? else {
            return Ok(());
        };
        let inside = (mount.dev == data.dev && mount.root.starts_with(&data.path))
            || self.is_an_image_volumes(mount.dev, data.dev)?;
        if inside {
            return Err(NodeError::InsideVolume {
                field,
                path: path.to_owned(),
                mount: mount.mount_point,
            });
        }
        Ok(())
    }

    /// Whether the filesystem with device number `dev` is an image volume's own: on a loop
    /// device of ours backed by a file on the volume data's filesystem (`data_dev`).
    fn is_an_image_volumes(
        &self,
        dev: (u32, u32),
        data_dev: (u32, u32),
    ) -> Result<bool, NodeError> {
        let Some(status) = self.loops.with_number(dev)? else {
            return Ok(false);
        };
        let data_dev = nix::libc::makedev(data_dev.0, data_dev.1);
        Ok(status.file_name.starts_with(crate::linux::loopdev::TAG)
            && status.backing.dev == data_dev)
    }

    /// Another staging path the volume is staged at still: recorded, and still mounted (a
    /// block volume: still on a device of ours). A record a reboot outdated does not count.
    /// Each recorded path is asked by itself (statx), not the whole mount table.
    pub(super) fn staged_elsewhere(
        &self,
        record: &Record,
        staging: &Path,
    ) -> Result<Option<PathBuf>, NodeError> {
        let mut others = record.staged_at.iter().filter(|p| *p != staging);
        if record.block {
            let attached = !self.found(record)?.ours.is_empty();
            return Ok(others.next().filter(|_| attached).cloned());
        }
        for other in others {
            if self.mounter.mount_at(other)?.is_some() {
                return Ok(Some(other.clone()));
            }
        }
        Ok(None)
    }
}
