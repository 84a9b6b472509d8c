//! CreateVolume's content sources: a restore from a snapshot, a clone of a volume. The source
//! is held as a copy source (so it cannot be deleted while it is copied) and its tree is copied,
//! with reflinks where the filesystem shares extents, into the volume directory that the
//! normal create path prepared (`Volumes::create_with`):
//! a restored or cloned volume is made like any other, with its content added before its
//! record, so whatever that path gives the directory (its mode, a quota project that every
//! copied file inherits) it gives these too. A crash before the record leaves a directory
//! without one, which the next start-up removes.
//!
//! Where sizes are enforced, a copy is held to the new volume's size like a pod's writes: the
//! source's real usage is
//! checked against the size before anything is copied, the copy runs on a thread without
//! CAP_SYS_RESOURCE (which ext4 exempts from hard limits), and what the copy holds afterwards
//! is checked again. While it runs, the limit has [`COPY_HEADROOM`] on top: a filesystem's
//! transactions reserve blocks beyond what they keep (XFS's reflinks refuse a source that
//! fills the size exactly without it), and the headroom is gone before the volume is.

use std::path::{Path, PathBuf};

use super::Driver;
use super::controller_error::ControllerError;
use super::image_copies::Frozen;
use crate::linux::copy::{self, Options, SkipReason, TreeUsage};
use crate::linux::loopdev;
use crate::linux::privilege;
use crate::node_server::state::sources::{Reading, snapshot_key, volume_key};
use crate::node_server::state::state_dir::block_image_in;
use crate::node_server::state::volumes::project_quotas::Hold;
use crate::node_server::state::volumes::{ContentSource, Layout, Record, VolumeError};
use crate::path_io::PathIoError;

/// What a new volume's limit is raised by while its content is copied in.
pub const COPY_HEADROOM: u64 = 1 << 20;

/// A content source, found and held.
pub struct Content {
    /// Its tree: a snapshot's data or a volume's directory.
    dir: PathBuf,
    /// The least size a volume made from it may have.
    pub size: u64,
    /// A block volume's (or its snapshot's): its tree is the volume's file.
    pub block: bool,
    /// An image volume's (or its snapshot's): its tree is the file holding its filesystem.
    pub layout: Layout,
    _reading: Reading,
    /// A cloned image volume's filesystem, held still until the copy is made (thawed by
    /// [`Content::fill`] or the drop).
    frozen: std::sync::Mutex<Vec<Frozen>>,
}

impl Driver {
    /// Finds and holds the source of a restore or clone.
    pub(super) fn content(&self, source: &ContentSource) -> Result<Content, ControllerError> {
        let not_found = |kind, id: &str| ControllerError::SourceNotFound {
            kind,
            id: id.to_owned(),
        };
        // Held first, so a source found below cannot be deleted before it is copied.
        match source {
            ContentSource::Snapshot(id) => {
                let reading = self.sources.read(&snapshot_key(id))?;
                let snapshot = self
                    .snapshots
                    .get(id)
                    .ok_or_else(|| not_found("snapshot", id))?;
                Ok(Content {
                    dir: self.snapshots.path_of(id),
                    size: snapshot.size,
                    block: snapshot.block,
                    layout: snapshot.layout,
                    _reading: reading,
                    frozen: Default::default(),
                })
            }
            ContentSource::Volume(id) => {
                let reading = self.sources.read(&volume_key(id))?;
                let volume = self
                    .volumes
                    .records()
                    .get(id)
                    .ok_or_else(|| not_found("volume", id))?;
                if volume.block {
                    self.flush_block(&volume)?;
                }
                let frozen = self.freeze_images(std::slice::from_ref(&volume))?;
                Ok(Content {
                    dir: self.volumes.path_of(id),
                    size: volume.capacity,
                    block: volume.block,
                    layout: volume.layout,
                    _reading: reading,
                    frozen: std::sync::Mutex::new(frozen),
                })
            }
        }
    }

    /// A new block volume's directory: private (only node-server reaches the file), holding
    /// the file — the source's, copied with reflinks where the filesystem shares extents and
    /// sparse elsewhere, then grown to `capacity` — or a new sparse one of exactly `capacity`.
    pub(super) fn fill_block(
        &self,
        dir: &Path,
        content: Option<&Content>,
        capacity: u64,
    ) -> Result<(), ControllerError> {
        use std::os::unix::fs::PermissionsExt;
        let image = block_image_in(dir);
        match content {
            Some(content) => {
                content.fill(dir)?;
                loopdev::grow_backing_file(&image, capacity)?;
            }
            None => {
                loopdev::create_backing_file(&image, capacity)?;
            }
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(PathIoError::at("set the mode of", dir))
            .map_err(VolumeError::from)?;
        Ok(())
    }

    /// Fills a new filesystem volume's directory `dir` (already in its project, under the
    /// limit of `record`) with `content`, held to the volume's size: see the module's docs.
    pub(super) fn fill_held(
        &self,
        dir: &Path,
        record: &Record,
        content: &Content,
    ) -> Result<(), ControllerError> {
        // Where sizes are only accounted, a volume may hold more than its size, and so may
        // a copy of it: there is no limit to hold the copy to.
        if record.project_id.is_none() {
            return content.fill(dir);
        }
        content.fits(record)?;
        let storage = self.volumes.storage_of(record);
        storage.allow_copy(record, COPY_HEADROOM)?;
        let filled = content.fill(dir);
        // The headroom goes whatever the copy did; the copy's own error comes first.
        let limited = self.volumes.hold_to_size(record);
        filled?;
        limited?;
        if let Hold::Enforced { usage, .. } = storage.hold(record)?
            && usage.bytes > record.capacity
        {
            return Err(ControllerError::CopyTooLarge {
                held: usage.bytes,
                capacity: record.capacity,
            });
        }
        Ok(())
    }
}

impl Content {
    /// What the source's tree really holds.
    pub fn usage(&self) -> Result<TreeUsage, ControllerError> {
        Ok(copy::tree_usage(&self.dir)?)
    }

    /// Refuses a source that holds more than the volume `record` is to have: more bytes than
    /// its size (a source can hold more than its own size, if its limit did not hold), or
    /// more inodes than its inode limit (its `inodeLimit`, else the default for its size).
    fn fits(&self, record: &Record) -> Result<(), ControllerError> {
        let used = self.usage()?;
        let inode_limit = crate::node_server::state::capacity::inode_limit(
            record.attributes.inode_limit,
            record.capacity,
        );
        if used.bytes > record.capacity || (inode_limit > 0 && used.inodes > inode_limit) {
            return Err(ControllerError::SourceHolds {
                bytes: used.bytes,
                inodes: used.inodes,
                capacity: record.capacity,
                inode_limit,
            });
        }
        Ok(())
    }

    /// Copies the source's tree into the new volume's empty directory `dir`, on a thread
    /// without CAP_SYS_RESOURCE, so the volume's limit holds the copy as it holds a pod.
    pub fn fill(&self, dir: &Path) -> Result<(), ControllerError> {
        let report = privilege::without_quota_override(|| {
            copy::copy_tree_into(&self.dir, dir, Options::default())
        });
        // The copy is made: the source's writers go on.
        crate::mutex::lock(&self.frozen).clear();
        let report = report??;
        for skipped in &report.skipped {
            if skipped.reason == SkipReason::MountPoint {
                log::warn!(
                    "{} is a mount point inside {}; not copied",
                    skipped.path.display(),
                    self.dir.display()
                );
            }
        }
        if report.churned() > 0 {
            log::info!(
                "copying {}: left out {} entries that vanished or changed type while they were \
                 copied",
                self.dir.display(),
                report.churned()
            );
        }
        log::debug!(
            "copied {} into {}: {} files, {} bytes, {} reflinked",
            self.dir.display(),
            dir.display(),
            report.files,
            report.bytes,
            report.bytes_reflinked
        );
        Ok(())
    }
}
