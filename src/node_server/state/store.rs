//! Metadata on disk: one small JSON file per volume in its [`RecordDir`] (and per snapshot
//! and group snapshot, in their own: any [`Persisted`] record; [`layout`] names them), written
//! atomically (temporary file, fsync, rename, fsync of the directory), so that after a crash
//! each file is either the old or the new record, never a torn one. Where a volume is mounted,
//! which a reboot makes stale anyway, is kept beside its record without any fsync
//! ([`mount_notes`]).
//!
//! Whether something is mounted is not stored here: the kernel's mount table is its only
//! truth. What a record keeps is what the table cannot say: which path each call used, and
//! which mount points this driver made.

use std::io::Write;
use std::marker::PhantomData;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::node_server::state::attributes::Attributes;
#[cfg(doc)]
use crate::node_server::state::layout;
use crate::node_server::state::layout::volume_id_problem;
use crate::node_server::state::layout::{RecordDir, RecordName};
use crate::path_io::PathIoError;

/// What we remember about a volume.
///
/// On disk (see [`encode`]): `id`, `name`, `capacity_bytes`, `ephemeral` always; the others
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
    /// refused. Kept in the volume's mount notes ([`mount_notes`]), never written into the
    /// record; read from records of the versions that kept it there.
    #[serde(default, skip_serializing)]
    pub staged_at: Vec<PathBuf>,
    /// Where NodePublishVolume published it: a NodeUnstageVolume there is refused, and
    /// NodeUnpublishVolume removes only a mount point publish made. Kept as `staged_at` is.
    #[serde(default, skip_serializing)]
    pub targets: Vec<Target>,
}

/// A target a volume was published at, and whether publish made the mount point (the
/// directory, or a block volume's file) there: the mount table cannot tell either.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub path: PathBuf,
    pub created: bool,
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

/// A record kept by a [`Store`]: one JSON file named by its ID, its fields as serde spells
/// them.
pub trait Persisted: Serialize + DeserializeOwned {
    /// What the record is, for log lines ("volume", "snapshot").
    const KIND: &'static str;
    fn id(&self) -> &str;
    /// Why a record that parsed is refused all the same (a rule across its fields).
    fn problem(&self) -> Option<String> {
        None
    }
}

impl Persisted for Record {
    const KIND: &'static str = "volume";

    fn id(&self) -> &str {
        &self.id
    }
}

/// The format every record states in its `"version"` key. Written, never read: no reader,
/// this one or any before it, has looked at it; it is there for a reader that one day must.
const FORMAT_VERSION: u32 = 1;

/// A record's bytes on disk: its fields and `"version": 1`, as compact JSON with the keys in
/// alphabetical order. It goes through [`serde_json::Value`], whose maps are sorted (the
/// `preserve_order` feature is off), so the bytes are the ones the hand-written encoders of
/// earlier versions wrote for the same record.
pub fn encode<R: Persisted>(record: &R) -> serde_json::Result<Vec<u8>> {
    let mut value = serde_json::to_value(record)?;
    if let serde_json::Value::Object(map) = &mut value {
        map.insert("version".to_owned(), FORMAT_VERSION.into());
    }
    serde_json::to_vec(&value)
}

/// A record from its bytes on disk; keys it does not know (`"version"` among them) are
/// ignored.
pub fn decode<R: Persisted>(bytes: &[u8]) -> serde_json::Result<R> {
    serde_json::from_slice(bytes)
}

/// The metadata directory of one kind of record.
#[derive(Debug)]
pub struct Store<R = Record> {
    dir: RecordDir,
    kind: PhantomData<fn() -> R>,
}

/// Why a record file was not loaded (it is skipped and left in place).
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("read: {0}")]
    Read(#[source] std::io::Error),
    /// Not JSON, or not the JSON of this kind of record: serde's message, with the line and
    /// column.
    #[error("parse: {0}")]
    Parse(#[source] serde_json::Error),
    /// Well-formed, but a value that cannot be trusted.
    #[error("refused: {0}")]
    Refused(String),
}

impl<R: Persisted> Store<R> {
    /// Opens (creating if needed) the metadata directory and loads every record in it.
    /// Leftover temporary files from an interrupted write are removed; a record that cannot
    /// be read is logged (once, with its path and why) and skipped, never deleted.
    pub fn open(records_dir: RecordDir) -> Result<(Self, Vec<R>), PathIoError> {
        Self::open_reporting(records_dir, |path, why| {
            log::error!(
                "skipping unreadable {} record {} (left in place): {why}",
                R::KIND,
                path.display()
            )
        })
    }

    /// [`Self::open`], telling `skipped` about each record that could not be loaded.
    fn open_reporting(
        records_dir: RecordDir,
        mut skipped: impl FnMut(&Path, RecordError),
    ) -> Result<(Self, Vec<R>), PathIoError> {
        let dir = records_dir.path();
        std::fs::create_dir_all(dir).map_err(PathIoError::at("create", dir))?;
        if let Some(parent) = dir.parent() {
            sync_dir(parent)?;
        }
        let mut records = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(PathIoError::at("list", dir))? {
            let entry = entry.map_err(PathIoError::at("list", dir))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let id = match RecordDir::name(&name) {
                RecordName::Record(id) => id,
                RecordName::Temporary => {
                    log::info!("removing interrupted write {}", path.display());
                    std::fs::remove_file(&path).map_err(PathIoError::at("remove", &path))?;
                    continue;
                }
                RecordName::Other => continue,
            };
            match Self::load(&path, id) {
                Ok(record) => records.push(record),
                Err(why) => skipped(&path, why),
            }
        }
        let kind = PhantomData;
        let dir = records_dir;
        Ok((Self { dir, kind }, records))
    }

    /// The record of `id` in the file at `path`, if it can be trusted.
    pub fn load(path: &Path, id: &str) -> Result<R, RecordError> {
        // The file name is the ID; one that could not name a volume directory (`...json`
        // would be `..`) is never trusted.
        if let Some(problem) = volume_id_problem(id) {
            return Err(RecordError::Refused(format!(
                "the ID its file name gives, {id:?}, {problem}"
            )));
        }
        let bytes = std::fs::read(path).map_err(RecordError::Read)?;
        let record: R = decode(&bytes).map_err(RecordError::Parse)?;
        if record.id() != id {
            return Err(RecordError::Refused(format!(
                "it holds the record of {:?}, not of {id:?} as its file name says",
                record.id()
            )));
        }
        match record.problem() {
            Some(problem) => Err(RecordError::Refused(problem)),
            None => Ok(record),
        }
    }

    /// Whether a record file for `id` is there, readable or not: data of an ID whose record
    /// could not be read is never treated as left over.
    pub fn has_file(&self, id: &str) -> bool {
        std::fs::symlink_metadata(self.dir.record(id)).is_ok()
    }

    /// Writes a record so that it survives a crash at any point.
    pub fn save(&self, record: &R) -> Result<(), PathIoError> {
        self.write(record)?;
        self.sync_dir()
    }

    /// The record written to a temporary file, synced, renamed over the old one.
    fn write(&self, record: &R) -> Result<(), PathIoError> {
        let path = self.dir.record(record.id());
        let temp = self.dir.temporary(record.id());
        let body = encode(record)
            .map_err(std::io::Error::other)
            .map_err(PathIoError::at("encode", &path))?;
        replace_file(&temp, &path, &body, Synced::Yes)
    }

    /// Removes a record durably; a record that is already gone is fine.
    pub fn remove(&self, id: &str) -> Result<(), PathIoError> {
        let path = self.dir.record(id);
        match std::fs::remove_file(&path) {
            Ok(()) => self.sync_dir(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(PathIoError::at("remove", &path)(e)),
        }
    }

    /// A rename or unlink is durable only once its directory is synced.
    fn sync_dir(&self) -> Result<(), PathIoError> {
        sync_dir(self.dir.path())
    }
}

/// A fresh ID: `prefix` and 32 random hex digits (std's per-process random hasher keys and
/// the clock), never one that `taken` says is in use.
pub fn new_id(prefix: &str, taken: impl Fn(&str) -> bool) -> String {
    use std::hash::{BuildHasher, Hasher};
    loop {
        let mut id = String::from(prefix);
        for _ in 0..2 {
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos(),
            );
            id.push_str(&format!("{:016x}", hasher.finish()));
        }
        if !taken(&id) {
            return id;
        }
    }
}

/// Whether [`replace_file`] syncs the new file before the rename.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Synced {
    Yes,
    No,
}

/// `body` written to `temp` (0600), synced if asked, renamed over `path`; `temp` is removed
/// when any step fails.
fn replace_file(temp: &Path, path: &Path, body: &[u8], synced: Synced) -> Result<(), PathIoError> {
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(temp)?;
        file.write_all(body)?;
        match synced {
            Synced::Yes => file.sync_all(),
            Synced::No => Ok(()),
        }
    };
    write()
        .map_err(PathIoError::at("write", temp))
        .and_then(|()| std::fs::rename(temp, path).map_err(PathIoError::at("rename into", path)))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(temp);
        })
}

/// Makes the entries of a directory (created, renamed, removed) durable.
pub fn sync_dir(dir: &Path) -> Result<(), PathIoError> {
    std::fs::File::open(dir)
        .and_then(|file| file.sync_all())
        .map_err(PathIoError::at("sync", dir))
}

pub mod mount_notes;
#[cfg(test)]
mod tests;
