//! Raw block volumes on the node: a volume's file ([`StateDir::block_image`]) attached to a
//! loop device at NodeStageVolume, the device node bind-mounted onto the target file at
//! NodePublishVolume, and both undone in reverse.
//!
//! Nothing is stored about it: the kernel's loop state (a device of ours is found by the file's
//! identity and our tag, see [`loopdev`]) says whether a volume is staged, and the mount table
//! with the targets' device numbers says where it is published. After a restart both are as
//! the kernel left them; after a reboot the devices are gone and staging attaches anew. A
//! read-only publish gets a read-only loop device of its own (a read-only bind mount of a
//! device node does not stop writes to the device), detached when its last target goes.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::Driver;
use super::bind_mounts::{BindError, Published};
use super::node_error::NodeError;
use super::node_ops::Stats;
use crate::csi_spec::Field;
use crate::linux::loopdev::{self, AttachOptions, Found, Status};
use crate::linux::mountinfo::MountTable;
use crate::linux::resolve;
#[cfg(doc)]
use crate::node_server::state::state_dir::StateDir;
use crate::node_server::state::volumes::{Record, VolumeError};

fn options(record: &Record, read_only: bool) -> AttachOptions {
    AttachOptions {
        read_only,
        // The backing filesystem already caches the file; a second cache in the device only
        // costs memory (unless the volume's `directIO` says otherwise). Refused (tmpfs)
        // means buffered.
        direct_io: record.attributes.direct_io.unwrap_or(true),
        block_size: 0,
    }
}

/// The device node mounted at `path`, if a device of `found` is (its `st_rdev` says which).
fn device_at(path: &Path, found: &Found) -> Option<Status> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.file_type().is_block_device() {
        return None;
    }
    (found.ours.iter())
        .find(|s| s.device.rdev() == meta.rdev())
        .cloned()
}

/// The device of `found` whose number a mount's root has, if any.
fn ours(found: &Found, rdev: Option<u64>) -> Option<Status> {
    let rdev = rdev?;
    (found.ours.iter())
        .find(|s| s.device.rdev() == rdev)
        .cloned()
}

/// Every mount of a device of `found`: where, and which device. A bind of `/dev/loopN` shows
/// `loopN` as its root; its device number, read through the mount point, proves it.
fn targets(table: &MountTable, found: &Found) -> Vec<(PathBuf, Status)> {
    let names: Vec<String> = (found.ours.iter())
        .map(|s| format!("loop{}", s.device.0))
        .collect();
    let mut seen = Vec::new();
    for entry in table.entries() {
        let named = (entry.root.as_deref())
            .and_then(Path::file_name)
            .is_some_and(|n| names.iter().any(|name| n == name.as_str()));
        if named
            && !seen.iter().any(|(p, _)| *p == entry.mount_point)
            && let Some(status) = device_at(&entry.mount_point, found)
        {
            seen.push((entry.mount_point.clone(), status));
        }
    }
    seen
}

/// Creates the target file publish binds onto (never its parent: that is the CO's), through
/// its parent opened without following links. `Ok(true)`: created now.
fn make_target_file(path: &Path) -> Result<bool, BindError> {
    match resolve::make_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            match std::fs::symlink_metadata(path) {
                Ok(meta) if meta.file_type().is_file() => Ok(false),
                _ => Err(BindError::NotAFile {
                    path: path.to_owned(),
                }),
            }
        }
        Err(source) => Err(BindError::CreateMountPoint {
            field: Field::TargetPath,
            path: path.to_owned(),
            source,
        }),
    }
}

/// Removes a target file publish created: only an empty regular file, never a symlink.
fn remove_target_file(path: &Path) -> Result<(), BindError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_file() && meta.len() == 0 => resolve::remove(path, false)
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            })
            .map_err(|source| BindError::Io {
                op: "remove",
                field: Field::TargetPath,
                path: path.to_owned(),
                source,
            }),
        Ok(_) => {
            log::warn!(
                "leaving {} in place: not the file publish made",
                path.display()
            );
            Ok(())
        }
        Err(_) => Ok(()),
    }
}

impl Driver {
    /// A block volume's file.
    pub fn image_of(&self, id: &str) -> PathBuf {
        self.state_dir.block_image(id)
    }

    pub(super) fn found(&self, record: &Record) -> Result<Found, NodeError> {
        Ok(self.loops.find(&self.image_of(&record.id))?)
    }

    /// NodeStageVolume: the volume's file on a loop device of ours, found or attached.
    pub(super) fn stage_block(&self, record: &Record) -> Result<(), NodeError> {
        let image = self.image_of(&record.id);
        let (status, attached) = self.loops.find_or_attach(&image, options(record, false))?;
        if attached {
            log::debug!("staged block volume {} on {}", record.id, status.device);
        }
        Ok(())
    }

    /// NodeUnstageVolume: every device of ours for the file detached, once no target holds one.
    pub(super) fn unstage_block(&self, record: &Record) -> Result<(), NodeError> {
        let image = self.image_of(&record.id);
        if !image.exists() {
            return Ok(());
        }
        let found = self.found(record)?;
        let table = self.mounter.mount_table()?;
        if let Some((at, _)) = targets(&table, &found).into_iter().next() {
            return Err(NodeError::Volume(VolumeError::InUse {
                id: record.id.clone(),
                at,
            }));
        }
        for status in &found.ours {
            self.loops.detach(status.device, &image)?;
        }
        if !found.ours.is_empty() {
            log::debug!("unstaged block volume {}", record.id);
        }
        Ok(())
    }

    /// NodePublishVolume: the staged device (or, read-only, a read-only device of its own)
    /// bind-mounted onto the target file, which is created if it is not there.
    pub(super) fn publish_block(
        &self,
        record: &Record,
        staging: Option<&Path>,
        target: &Path,
        readonly: bool,
        exclusive: bool,
    ) -> Result<Published, NodeError> {
        let image = self.image_of(&record.id);
        let found = self.found(record)?;
        let Some(staged) = found.ours.iter().find(|s| !s.read_only).cloned() else {
            return Err(BindError::NotStaged {
                staging: staging.unwrap_or(&image).to_owned(),
            }
            .into());
        };
        if let Some(top) = self.mounter.mount_at(target)? {
            let Some(status) = ours(&found, top.block_rdev) else {
                return Err(BindError::OtherMount {
                    field: Field::TargetPath,
                    path: target.to_owned(),
                }
                .into());
            };
            if status.read_only == readonly && top.is_readonly() == readonly {
                return Ok(Published::Already);
            }
            return Err(BindError::OtherOptions {
                field: Field::TargetPath,
                path: target.to_owned(),
                options: if status.read_only { "ro" } else { "rw" }.into(),
            }
            .into());
        }
        // Whether a device of the volume is mounted anywhere: only the whole table says.
        if exclusive && let Some((at, _)) = targets(&self.mounter.mount_table()?, &found).first() {
            return Err(BindError::PublishedElsewhere { at: at.clone() }.into());
        }
        let (device, attached) = match readonly {
            false => (staged, false),
            true => self.loops.find_or_attach(&image, options(record, true))?,
        };
        let created = make_target_file(target)?;
        let bound = self
            .mounter
            .bind_file(&device.device.path(), target, readonly);
        if let Err(e) = bound {
            if created && let Err(left) = remove_target_file(target) {
                log::warn!("target file of a failed publish stays: {left}");
            }
            if attached && let Err(left) = self.loops.detach(device.device, &image) {
                log::warn!("read-only device of a failed publish stays: {left}");
            }
            return Err(BindError::Mount(e).into());
        }
        Ok(Published::Mounted { created })
    }

    /// NodeUnpublishVolume: every mount of the volume's devices stacked at the target undone,
    /// the target file removed if publish `created` it, and a read-only device no other target
    /// holds detached.
    pub(super) fn unpublish_block(
        &self,
        record: &Record,
        target: &Path,
        created: bool,
    ) -> Result<(), NodeError> {
        let found = self.found(record)?;
        let mut unmounted = None;
        while let Some(top) = self.mounter.mount_at(target)? {
            let Some(status) = ours(&found, top.block_rdev) else {
                return Err(BindError::ForeignMount {
                    field: Field::TargetPath,
                    path: target.to_owned(),
                }
                .into());
            };
            self.mounter.unmount(target, &top)?;
            unmounted = Some(status);
        }
        if created {
            remove_target_file(target)?;
        }
        let Some(status) = unmounted else {
            return Ok(());
        };
        log::debug!(
            "unpublished block volume {} from {}",
            record.id,
            target.display()
        );
        // A read-only device is its publish's own: detached once no mount anywhere shows it,
        // which only the whole table tells. A writable one stays until unstage.
        let still_used = || -> Result<bool, NodeError> {
            let table = self.mounter.mount_table()?;
            Ok((targets(&table, &found).iter()).any(|(_, s)| s.device == status.device))
        };
        if status.read_only && !still_used()? {
            // Open in a pod still: it stays until unstage, which reports that.
            if let Err(e) = self.loops.detach(status.device, &self.image_of(&record.id)) {
                log::info!(
                    "read-only device of volume {} stays for now: {e}",
                    record.id
                );
            }
        }
        Ok(())
    }

    /// NodeGetVolumeStats: the capacity (a block device has no used or free space to tell),
    /// healthy when a device of the volume is at the path.
    pub(super) fn block_stats(&self, record: &Record, path: &Path) -> Result<Stats, NodeError> {
        let found = self.found(record)?;
        let abnormal = match device_at(path, &found) {
            Some(_) => None,
            None => Some(format!(
                "no loop device of block volume {} is at {}",
                record.id,
                path.display()
            )),
        };
        Ok(Stats {
            statvfs: None,
            hold: None,
            abnormal,
            block_capacity: Some(record.capacity),
        })
    }

    /// NodeExpandVolume: the file grown to the recorded size (if a crash left it behind) and
    /// every device of ours told its new size; returns the size the devices now have.
    pub(super) fn expand_block_on_node(&self, record: &Record) -> Result<u64, NodeError> {
        let image = self.image_of(&record.id);
        loopdev::grow_backing_file(&image, record.capacity)?;
        let mut size = record.capacity;
        for status in &self.found(record)?.ours {
            size = self.loops.refresh_capacity(status.device, &image)?;
        }
        Ok(size)
    }

    /// Whether a block volume's file is attached anywhere (ours or someone else's): deleting
    /// it then would pull the data from under a device.
    pub(super) fn block_user(
        &self,
        record: &Record,
    ) -> Result<Option<PathBuf>, loopdev::LoopError> {
        let image = self.image_of(&record.id);
        if !image.exists() {
            return Ok(None);
        }
        let found = self.loops.find(&image)?;
        Ok((found.ours.iter().chain(&found.foreign))
            .map(|s| s.device.path())
            .next())
    }

    /// ControllerModifyVolume's `directIO`, switched on every attached device of the volume.
    pub(super) fn apply_direct_io(&self, record: &Record) -> Result<(), loopdev::LoopError> {
        let Some(on) = record.attributes.direct_io else {
            return Ok(());
        };
        let image = self.image_of(&record.id);
        for status in self.loops.find(&image)?.ours {
            if status.direct_io != on && !self.loops.set_direct_io(status.device, &image, on)? {
                log::info!(
                    "{} of volume {} stays buffered: its file cannot do direct I/O",
                    status.device,
                    record.id
                );
            }
        }
        Ok(())
    }

    /// Before a block volume is copied: what its staged devices acknowledged is on disk.
    pub(super) fn flush_block(&self, record: &Record) -> Result<(), loopdev::LoopError> {
        let image = self.image_of(&record.id);
        if !image.exists() {
            return Ok(());
        }
        for status in self
            .loops
            .find(&image)?
            .ours
            .iter()
            .filter(|s| !s.read_only)
        {
            self.loops.flush(status.device)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
