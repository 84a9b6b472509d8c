//! The Controller service's volume operations on the [`Driver`]: CreateVolume (empty,
//! restored or cloned; a directory, a block volume's file or an image volume's), DeleteVolume
//! and ControllerExpandVolume.

use super::Driver;
use super::controller_error::{ControllerError, access_name};
use super::image_copies::unshare_in_background;
use crate::linux::{ext4_image, loopdev};
use crate::node_server::state::attributes::Attributes;
use crate::node_server::state::capacity;
use crate::node_server::state::sources::volume_key;
use crate::node_server::state::state_dir::block_image_in;
use crate::node_server::state::volumes::{ContentSource, Layout, Record, VolumeError};

/// What a CreateVolume asks a volume to be: a device or a filesystem, and how it is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    pub block: bool,
    pub layout: Layout,
}

impl Driver {
    /// CreateVolume: the volume of that name if its size, content source and attributes are
    /// the ones asked for, else a new one, restored or cloned from `source` if one is given,
    /// with `attributes` applied.
    pub fn create(
        &self,
        name: &str,
        required: u64,
        limit: u64,
        source: Option<ContentSource>,
        attributes: Attributes,
        kind: Kind,
    ) -> Result<Record, ControllerError> {
        let Kind { block, layout } = kind;
        match self.volumes.records().find_name(name) {
            Some(existing) if existing.block != block => Err(ControllerError::OtherAccessType {
                name: name.to_owned(),
                is: access_name(existing.block),
            }),
            Some(existing) if existing.layout != layout => Err(ControllerError::OtherLayout {
                name: name.to_owned(),
                is: existing.layout.name(),
            }),
            Some(existing) if existing.source != source => Err(ControllerError::OtherSource {
                name: name.to_owned(),
            }),
            Some(existing) if !existing.attributes.agrees_with(&attributes) => {
                Err(ControllerError::OtherAttributes {
                    name: name.to_owned(),
                    existing: existing.attributes.to_map(),
                })
            }
            Some(existing) if capacity::satisfies(existing.capacity, required, limit) => {
                Ok(existing)
            }
            Some(existing) => Err(ControllerError::NameTaken {
                name: name.to_owned(),
                capacity: existing.capacity,
            }),
            None => {
                self.check_attributes(&attributes, None, block, layout)?;
                let content = source.as_ref().map(|s| self.content(s)).transpose()?;
                if let Some(content) = content.as_ref().filter(|c| c.block != block) {
                    return Err(ControllerError::SourceAccessType {
                        is: access_name(content.block),
                        asked: access_name(block),
                    });
                }
                if let Some(content) = content.as_ref().filter(|c| c.layout != layout) {
                    return Err(ControllerError::SourceLayout {
                        is: content.layout.name(),
                        asked: layout.name(),
                    });
                }
                let source_size = content.as_ref().map(|c| c.size);
                let capacity = capacity::size_with_source(required, limit, source_size).ok_or(
                    ControllerError::SourceTooLarge {
                        size: source_size.unwrap_or_default(),
                        limit,
                    },
                )?;
                let capacity = match layout {
                    _ if block => whole_sectors(capacity, limit)?,
                    Layout::Image => image_size(capacity, limit)?,
                    Layout::Directory => capacity,
                };
                let record = Record {
                    id: self.volumes.new_id(),
                    name: name.to_owned(),
                    capacity,
                    source,
                    attributes,
                    block,
                    layout,
                    ..Default::default()
                };
                let created = self.volumes.create_with(record, |record| {
                    let dir = &self.volumes.path_of(&record.id);
                    if block {
                        return self.fill_block(dir, content.as_ref(), capacity);
                    }
                    if record.is_image() {
                        return self.fill_image(dir, capacity, content.as_ref());
                    }
                    if let Some(content) = &content {
                        self.fill_held(dir, record, content)?;
                    }
                    // After the copy, which may have carried the source's root mode.
                    Ok(self.volumes.storage_of(record).apply_root_mode(record)?)
                })?;
                // A restored or cloned image shares its source's blocks: its own writes must
                // not need new ones.
                if created.is_image() && content.is_some() {
                    let file = block_image_in(&self.volumes.path_of(&created.id));
                    let what = format!("volume {}, made from {:?}", created.id, created.source);
                    unshare_in_background(file, what);
                }
                Ok(created)
            }
        }
    }

    /// DeleteVolume: gone already is fine. Refused (ABORTED) while the volume is being copied
    /// (a snapshot, a clone), and (FAILED_PRECONDITION) while a block or image volume's file
    /// is on a loop device; its snapshots stay.
    pub fn delete(&self, id: &str) -> Result<(), ControllerError> {
        if self.volumes.records().get(id).is_none() {
            return Ok(());
        }
        let _deleting = self.sources.delete(&volume_key(id))?;
        if let Some(record) = self.volumes.records().get(id).filter(|r| r.has_own_file())
            && let Some(at) = self.block_user(&record)?
        {
            return Err(VolumeError::InUse {
                id: id.to_owned(),
                at,
            }
            .into());
        }
        let table = self.mounter.mount_table()?;
        Ok(self.volumes.delete(id, &table)?)
    }

    /// ControllerExpandVolume: grows the accounted size to `required`, never shrinks (a block
    /// volume's file with it, in whole sectors; an image volume's, allocated, in whole
    /// blocks). Also says whether the node must expand too (their devices and filesystems).
    /// `call` names the call growing it (NodeExpandVolume does too, on the node-only path).
    pub fn expand(
        &self,
        id: &str,
        required: u64,
        limit: u64,
        call: &'static str,
    ) -> Result<(u64, bool), ControllerError> {
        let record = self.volumes.records().provisioned(id, call)?;
        if record.is_image() {
            let required = image_size(required, limit)?;
            let capacity = self.expand_accounted(&record, required, limit)?;
            if let Err(e) = self.allocate_image(id, capacity) {
                // No room for the file after all: the record goes back to what the file is.
                if capacity > record.capacity
                    && let Err(left) = self.volumes.resize(id, record.capacity)
                {
                    log::error!("volume {id} stays recorded at {capacity} bytes: {left}");
                }
                return Err(e.into());
            }
            return Ok((capacity, true));
        }
        if record.block {
            let required = whole_sectors(required, limit)?;
            let capacity = self.expand_accounted(&record, required, limit)?;
            loopdev::grow_backing_file(&self.image_of(id), capacity)?;
            return Ok((capacity, true));
        }
        Ok((self.expand_accounted(&record, required, limit)?, false))
    }

    fn expand_accounted(
        &self,
        record: &Record,
        required: u64,
        limit: u64,
    ) -> Result<u64, ControllerError> {
        let id = &record.id;
        if limit > 0 && record.capacity > limit {
            return Err(ControllerError::WouldShrink {
                id: id.to_owned(),
                capacity: record.capacity,
                limit,
            });
        }
        if required <= record.capacity {
            // A retry after a failed expansion: the record grew, the limit may not have.
            self.volumes.hold_to_size(record)?;
            return Ok(record.capacity);
        }
        Ok(self.volumes.resize(id, required)?.capacity)
    }
}

/// A block volume's size: whole 512-byte sectors, the loop device's unit, within `limit`.
fn whole_sectors(size: u64, limit: u64) -> Result<u64, ControllerError> {
    let rounded = size.max(1).next_multiple_of(512);
    if limit > 0 && rounded > limit {
        return Err(ControllerError::BlockSize { size, limit });
    }
    Ok(rounded)
}

/// An image volume's size: its filesystem's, whole 4 KiB blocks and at least the empty
/// template's 16 MiB, within `limit`.
fn image_size(size: u64, limit: u64) -> Result<u64, ControllerError> {
    let rounded = ext4_image::fs_bytes(size);
    if limit > 0 && rounded > limit {
        return Err(ControllerError::ImageSize {
            size,
            least: ext4_image::TEMPLATE_BYTES,
            limit,
        });
    }
    Ok(rounded)
}
