//! Growing an image volume (ControllerExpandVolume, then NodeExpandVolume): the record first,
//! then its file, allocated to the new size (thick, as at creation); on the node, each loop
//! device of ours is told the file's new size (`LOOP_SET_CAPACITY`) and the filesystem,
//! where it is mounted, grows online to it (`EXT4_IOC_RESIZE_FS`). A volume not staged grows
//! at its next stage, which grows every filesystem to its device. Each step is idempotent,
//! so a retry after any failure finishes the growth.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;

use nix::errno::Errno;

use super::Driver;
use super::bind_mounts::BindError;
use super::image::{is_ours, open_root};
use super::node_error::NodeError;
use crate::linux::ext4_image::{self, BLOCK_BYTES};
use crate::linux::loopdev::{self, LoopDevice};
use crate::node_server::state::volumes::{Record, VolumeError};
use crate::path_io::PathIoError;

/// Allocates every hole of the file at `image` from byte `from` up to `bytes` (growing it
/// to that size), durably. A host filesystem without room for it is [`VolumeError::NoSpace`], with what it
/// has free (RESOURCE_EXHAUSTED at creation, not INTERNAL).
pub(super) fn allocate_file(image: &Path, from: u64, bytes: u64) -> Result<(), VolumeError> {
    let allocate = |file: &File| -> std::io::Result<()> {
        ext4_image::allocate_from(file, from, bytes)?;
        file.sync_all()
    };
    let allocated =
        (std::fs::OpenOptions::new().write(true).open(image)).and_then(|file| allocate(&file));
    match allocated {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => {
            let dir = image.parent().unwrap_or(image);
            let available = crate::node_server::state::capacity::free_bytes(dir).unwrap_or(0);
            Err(VolumeError::NoSpace {
                asked: bytes,
                available,
            })
        }
        Err(e) => Err(PathIoError::new("allocate", image, e).into()),
    }
}

impl Driver {
    /// Allocates the file of image volume `id` to `bytes`, durably: its new blocks are the
    /// volume's before any write needs them.
    /// A host filesystem without room for it is [`VolumeError::NoRoomToGrow`] (OUT_OF_RANGE,
    /// as a growth the capacity check refuses).
    pub(super) fn allocate_image(&self, id: &str, bytes: u64) -> Result<(), VolumeError> {
        let image = self.image_of(id);
        let held = std::fs::metadata(&image).map_or(0, |meta| meta.len());
        allocate_file(&image, 0, bytes).map_err(|e| match e {
            VolumeError::NoSpace { available, .. } => VolumeError::NoRoomToGrow {
                growth: bytes.saturating_sub(held),
                available,
            },
            other => other,
        })
    }

    /// NodeExpandVolume of an image volume whose filesystem is mounted at `path`: the file
    /// (again, for a retry), the devices and the filesystem grown to the recorded size; the
    /// filesystem's size then.
    pub(super) fn expand_image_on_node(
        &self,
        record: &Record,
        path: &Path,
    ) -> Result<u64, NodeError> {
        self.allocate_image(&record.id, record.capacity)?;
        let image = self.image_of(&record.id);
        let found = self.found(record)?;
        for status in &found.ours {
            self.loops.refresh_capacity(status.device, &image)?;
        }
        let mounted = (self.mounter.mount_at(path)?).is_some_and(|top| is_ours(&found, top.shows));
        let (true, Some(device)) = (mounted, found.ours.first()) else {
            return Err(BindError::NotStaged {
                staging: path.to_owned(),
            }
            .into());
        };
        let root = open_root(path, &found)?;
        let node = File::open(device.device.path()).map_err(|source| NodeError::Filesystem {
            id: record.id.clone(),
            op: "open the device",
            source,
        })?;
        let superblock = ext4_image::superblock(&node).map_err(|source| NodeError::Filesystem {
            id: record.id.clone(),
            op: "read the superblock",
            source,
        })?;
        let grown = grow_to_device(&record.id, &root, device.device, superblock.bytes)?;
        // The growth zeroes the new groups' inode tables through the device, which punches
        // them out of the file: the grown part allocated again, so the file stays thick.
        allocate_file(&image, superblock.bytes, grown)?;
        Ok(grown)
    }
}

/// Grows the filesystem of volume `id`, of `bytes` now, mounted with its `root`, to its
/// `device`'s size in whole blocks; the size it has then.
pub(super) fn grow_to_device(
    id: &str,
    root: &File,
    device: LoopDevice,
    bytes: u64,
) -> Result<u64, NodeError> {
    let size = loopdev::size(device)? / BLOCK_BYTES * BLOCK_BYTES;
    if bytes >= size {
        return Ok(bytes);
    }
    match ext4_image::grow(&root.as_fd(), size) {
        Ok(()) => {
            log::info!("grew the filesystem of volume {id} from {bytes} to {size} bytes");
            Ok(size)
        }
        Err(Errno::EPERM) => Err(NodeError::NoResizeCapability {
            id: id.to_owned(),
            from: bytes,
            to: size,
        }),
        Err(e) => Err(NodeError::Filesystem {
            id: id.to_owned(),
            op: "grow",
            source: e.into(),
        }),
    }
}
