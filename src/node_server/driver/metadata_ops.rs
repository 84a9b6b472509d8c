//! The SnapshotMetadata service below its handlers: the snapshots a block map is read from,
//! checked to be raw block snapshots (of one volume, for a delta), opened, and held as copy
//! sources while the map is streamed, so a DeleteSnapshot meanwhile is ABORTED and retried
//! rather than freeing blocks under the comparison.

use std::fs::File;

use super::Driver;
use crate::node_server::state::snapshots::{Snapshot, SnapshotError};
use crate::node_server::state::sources::{Reading, snapshot_key};
use crate::node_server::state::state_dir::block_image_in;
use crate::path_io::PathIoError;
use crate::runtime::WorkerError;

/// What a block map is read from: the snapshots' files, held until it is dropped.
#[derive(Debug)]
pub struct MapSource {
    _held: Vec<Reading>,
    /// The base of a delta.
    pub base: Option<File>,
    pub target: File,
    /// The volume's size when the (target) snapshot was cut: where the map ends.
    pub capacity: u64,
}

/// Why a block map cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error(
        "snapshot {id} is of a filesystem volume: block metadata is served for snapshots of raw \
         block volumes only"
    )]
    NotBlock { id: String },
    #[error(
        "snapshots {base} and {target} are of different volumes ({base_volume} and \
         {target_volume}): a delta is between two snapshots of one volume"
    )]
    OtherVolumes {
        base: String,
        target: String,
        base_volume: String,
        target_volume: String,
    },
    #[error("starting_offset {offset} is past the end of the volume ({capacity} bytes)")]
    PastEnd { offset: u64, capacity: u64 },
    #[error(transparent)]
    Io(#[from] PathIoError),
    #[error(transparent)]
    Worker(#[from] WorkerError),
}

impl Driver {
    /// GetMetadataAllocated's source: the snapshot `id`, from `start`.
    pub fn allocated_source(&self, id: &str, start: u64) -> Result<MapSource, MetadataError> {
        let (held, snapshot, file) = self.held_block_snapshot(id)?;
        within(start, snapshot.size)?;
        Ok(MapSource {
            _held: vec![held],
            base: None,
            target: file,
            capacity: snapshot.size,
        })
    }

    /// GetMetadataDelta's source: `base` and `target`, snapshots of one volume, from `start`.
    pub fn delta_source(
        &self,
        base: &str,
        target: &str,
        start: u64,
    ) -> Result<MapSource, MetadataError> {
        let (held_base, base_snapshot, base_file) = self.held_block_snapshot(base)?;
        let (held_target, target_snapshot, target_file) = self.held_block_snapshot(target)?;
        if base_snapshot.source_volume != target_snapshot.source_volume {
            return Err(MetadataError::OtherVolumes {
                base: base.to_owned(),
                target: target.to_owned(),
                base_volume: base_snapshot.source_volume,
                target_volume: target_snapshot.source_volume,
            });
        }
        within(start, target_snapshot.size)?;
        Ok(MapSource {
            _held: vec![held_base, held_target],
            base: Some(base_file),
            target: target_file,
            capacity: target_snapshot.size,
        })
    }

    /// The snapshot `id`, held as a copy source (first, so that a deletion finishing between
    /// the lookup and the hold cannot go unnoticed), a raw block volume's, its file open.
    fn held_block_snapshot(&self, id: &str) -> Result<(Reading, Snapshot, File), MetadataError> {
        let held = (self.sources.read(&snapshot_key(id))).map_err(SnapshotError::from)?;
        let snapshot = self.snapshots.known(id)?;
        if !snapshot.block {
            return Err(MetadataError::NotBlock { id: id.to_owned() });
        }
        let path = block_image_in(&self.snapshots.path_of(id));
        let file = File::open(&path).map_err(PathIoError::at("open", &path))?;
        Ok((held, snapshot, file))
    }
}

/// A starting offset at the end of the volume is an empty map; past it, OUT_OF_RANGE.
fn within(start: u64, capacity: u64) -> Result<(), MetadataError> {
    if start > capacity {
        return Err(MetadataError::PastEnd {
            offset: start,
            capacity,
        });
    }
    Ok(())
}
