//! What we remember about a volume, and its JSON on disk: the record the [`Store`] keeps for
//! each volume (the snapshot records have theirs beside it, `state::snapshots::records`), with
//! its content source and the access type a snapshot of it keeps too.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::layout::Layout;
use crate::node_server::state::attributes::Attributes;
use crate::node_server::state::store::Persisted;
#[cfg(doc)]
use crate::node_server::state::store::Store;

/// What we remember about a volume.
///
/// On disk (see [`encode`](crate::node_server::state::store::encode)): `id`, `name`, `capacity_bytes`, `ephemeral` always; the others
/// only when set, so that a record without them reads the same to older versions, and a
/// record from before they existed reads with their defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    /// The CO's name from CreateVolume; empty for ephemeral inline volumes.
    pub name: String,
    #[serde(rename = "capacity_bytes")]
    pub capacity: u64,
    /// Created by NodePublishVolume and removed by NodeUnpublishVolume.
    pub ephemeral: bool,
    /// The project quota that holds the volume to its capacity; `None` when sizes were not
    /// enforced at its creation (and in records written before quotas existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<u32>,
    /// What the volume was created from; `None` (and absent in records written before
    /// snapshots existed) for an empty volume.
    #[serde(
        rename = "content_source",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub source: Option<ContentSource>,
    /// What its VolumeAttributesClass (or StorageClass, or a ControllerModifyVolume) set;
    /// absent in records from before ControllerModifyVolume, which have the defaults.
    #[serde(default, skip_serializing_if = "Attributes::is_empty")]
    pub attributes: Attributes,
    /// A raw block volume: a file of exactly its capacity in its directory, attached to a loop
    /// device while staged. `false` (absent in records written before block volumes) for a
    /// filesystem volume, which is the directory itself.
    #[serde(
        rename = "access_type",
        default,
        skip_serializing_if = "access_type::is_mount",
        with = "access_type"
    )]
    pub block: bool,
    /// A filesystem volume's layout: `image` for a file holding a filesystem of its own;
    /// absent for a directory (and in records from before layouts).
    #[serde(default, skip_serializing_if = "Layout::is_directory")]
    pub layout: Layout,
    /// DeleteVolume began: written before any data is removed, so a crash or a file that
    /// cannot be removed leaves a volume that is not listed and whose deletion the next
    /// DeleteVolume or start-up finishes. Absent (`false`) otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
    /// Deleted, its data gone, but files elsewhere are still charged to its project, which
    /// keeps a least limit (and its ID) until they are gone: the record stays, marked
    /// deleting, for the next start or DeleteVolume to release it. Absent (`false`) otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub leftover: bool,
    /// Where NodeStageVolume staged it (resolved paths): a NodeUnpublishVolume there is
    /// refused. Kept in the volume's mount notes ([`mount_notes`](super::mount_notes)), never
    /// written into the
    /// record; read from records of the versions that kept it there.
    #[serde(default, skip_serializing)]
    pub staged_at: Vec<PathBuf>,
    /// Where NodePublishVolume published it: a NodeUnstageVolume there is refused, and
    /// NodeUnpublishVolume removes only a mount point publish made. Kept as `staged_at` is.
    #[serde(default, skip_serializing)]
    pub targets: Vec<Target>,
}

impl Record {
    /// Whether the volume's data is one file of exactly its size in its private directory (a
    /// block volume's, or an image volume's holding its filesystem): it needs no project and
    /// promises no inodes of the state directory's filesystem.
    pub fn has_own_file(&self) -> bool {
        self.block || self.layout == Layout::Image
    }

    pub fn is_image(&self) -> bool {
        self.layout == Layout::Image
    }
}

/// A target a volume was published at, and whether publish made the mount point (the
/// directory, or a block volume's file) there: the mount table cannot tell either.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub path: PathBuf,
    pub created: bool,
    /// The UID of the pod it was published to, where the kubelet said (`podInfoOnMount`):
    /// whose cgroup holds the volume's IO limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

/// A record's `access_type`: `"block"` for a raw block volume (or its snapshot), written only
/// then; `"mount"` (never written) or absent for a filesystem volume.
pub mod access_type {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Not written: a filesystem volume's record has no `access_type`.
    pub fn is_mount(block: &bool) -> bool {
        !*block
    }

    #[derive(Serialize, Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum AccessType {
        Block,
        Mount,
    }

    pub fn serialize<S: Serializer>(block: &bool, to: S) -> Result<S::Ok, S::Error> {
        match block {
            true => AccessType::Block,
            false => AccessType::Mount,
        }
        .serialize(to)
    }

    /// `"block"` or `"mount"`; anything else is refused.
    pub fn deserialize<'de, D: Deserializer<'de>>(from: D) -> Result<bool, D::Error> {
        Ok(matches!(AccessType::deserialize(from)?, AccessType::Block))
    }

    /// Any string, `"block"` alone meaning block: how snapshot records have always been read.
    pub fn deserialize_any_string<'de, D: Deserializer<'de>>(from: D) -> Result<bool, D::Error> {
        Ok(String::deserialize(from)? == "block")
    }
}

/// CreateVolume's `volume_content_source`: a restore or a clone. On disk
/// `{"snapshot": "<id>"}` or `{"volume": "<id>"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", try_from = "SourceKeys")]
pub enum ContentSource {
    Snapshot(String),
    Volume(String),
}

/// A content source as read: exactly one of the two keys (other keys are ignored, as they
/// always were).
#[derive(Deserialize)]
struct SourceKeys {
    snapshot: Option<String>,
    volume: Option<String>,
}

impl TryFrom<SourceKeys> for ContentSource {
    type Error = &'static str;

    fn try_from(keys: SourceKeys) -> Result<Self, Self::Error> {
        match (keys.snapshot, keys.volume) {
            (Some(id), None) => Ok(ContentSource::Snapshot(id)),
            (None, Some(id)) => Ok(ContentSource::Volume(id)),
            (None, None) => Err("content_source names neither a snapshot nor a volume"),
            (Some(_), Some(_)) => Err("content_source names both a snapshot and a volume"),
        }
    }
}

impl Persisted for Record {
    const KIND: &'static str = "volume";

    fn id(&self) -> &str {
        &self.id
    }
}
