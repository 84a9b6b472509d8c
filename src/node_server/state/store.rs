//! Metadata on disk: one small JSON file per volume in its [`RecordDir`] (and per snapshot
//! and group snapshot, in their own: any [`Persisted`] record; [`layout`] names them), written
//! atomically (temporary file, fsync, rename, fsync of the directory), so that after a crash
//! each file is either the old or the new record, never a torn one.
//!
//! Mount state is not stored here: the kernel's mount table is its only truth.

use std::io::Write;
use std::marker::PhantomData;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::node_server::grpc::validate::volume_id_problem;
use crate::node_server::state::attributes::Attributes;
#[cfg(doc)]
use crate::node_server::state::layout;
use crate::node_server::state::layout::{RecordDir, RecordName};

/// What we remember about a volume.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    pub id: String,
    /// The CO's name from CreateVolume; empty for ephemeral inline volumes.
    pub name: String,
    pub capacity: u64,
    /// Created by NodePublishVolume and removed by NodeUnpublishVolume.
    pub ephemeral: bool,
    /// The project quota that holds the volume to its capacity; `None` when sizes were not
    /// enforced at its creation (and in records written before quotas existed).
    pub project_id: Option<u32>,
    /// What the volume was created from; `None` (and absent in records written before
    /// snapshots existed) for an empty volume.
    pub source: Option<ContentSource>,
    /// What its VolumeAttributesClass (or StorageClass, or a ControllerModifyVolume) set;
    /// absent in records from before ControllerModifyVolume, which have the defaults.
    pub attributes: Attributes,
    /// A raw block volume: a file of exactly its capacity in its directory, attached to a loop
    /// device while staged. `false` (absent in records written before block volumes) for a
    /// filesystem volume, which is the directory itself.
    pub block: bool,
}

/// CreateVolume's `volume_content_source`: a restore or a clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentSource {
    Snapshot(String),
    Volume(String),
}

impl ContentSource {
    fn to_json(&self) -> Value {
        match self {
            ContentSource::Snapshot(id) => json!({ "snapshot": id }),
            ContentSource::Volume(id) => json!({ "volume": id }),
        }
    }

    /// `None` for a malformed value, `Some(None)` for no source at all.
    fn from_json(value: Option<&Value>) -> Option<Option<Self>> {
        let Some(value) = value else {
            return Some(None);
        };
        let id = |key| Some(value.get(key)?.as_str()?.to_owned());
        match (id("snapshot"), id("volume")) {
            (Some(id), None) => Some(Some(ContentSource::Snapshot(id))),
            (None, Some(id)) => Some(Some(ContentSource::Volume(id))),
            _ => None,
        }
    }
}

impl Record {
    fn to_json(&self) -> Value {
        let mut value = json!({
            "version": 1,
            "id": self.id,
            "name": self.name,
            "capacity_bytes": self.capacity,
            "ephemeral": self.ephemeral,
        });
        // Written only when set: a record without them reads the same to older versions.
        if let Some(id) = self.project_id {
            value["project_id"] = id.into();
        }
        if let Some(source) = &self.source {
            value["content_source"] = source.to_json();
        }
        if !self.attributes.is_empty() {
            value["attributes"] = self.attributes.to_json();
        }
        if self.block {
            value["access_type"] = "block".into();
        }
        value
    }

    fn from_json(value: &Value) -> Option<Self> {
        Some(Self {
            id: value.get("id")?.as_str()?.to_owned(),
            name: value.get("name")?.as_str()?.to_owned(),
            capacity: value.get("capacity_bytes")?.as_u64()?,
            ephemeral: value.get("ephemeral")?.as_bool()?,
            // Optional: records from before project quotas have none.
            project_id: match value.get("project_id") {
                None => None,
                Some(id) => Some(u32::try_from(id.as_u64()?).ok()?),
            },
            source: ContentSource::from_json(value.get("content_source"))?,
            attributes: Attributes::from_json(value.get("attributes"))?,
            block: match value.get("access_type") {
                None => false,
                Some(kind) => match kind.as_str()? {
                    "block" => true,
                    "mount" => false,
                    _ => return None,
                },
            },
        })
    }
}

/// A record kept by a [`Store`]: one JSON file named by its ID.
pub trait Persisted: Sized {
    /// What the record is, for log lines ("volume", "snapshot").
    const KIND: &'static str;
    fn id(&self) -> &str;
    fn to_json(&self) -> Value;
    fn from_json(value: &Value) -> Option<Self>;
}

impl Persisted for Record {
    const KIND: &'static str = "volume";

    fn id(&self) -> &str {
        &self.id
    }

    fn to_json(&self) -> Value {
        Record::to_json(self)
    }

    fn from_json(value: &Value) -> Option<Self> {
        Record::from_json(value)
    }
}

/// A failed store operation, naming what was attempted and on which path.
#[derive(Debug, thiserror::Error)]
#[error("{op} {}: {source}", path.display())]
pub struct StoreError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// `map_err(err("remove", path))`: an I/O error with its operation and path.
fn err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError {
        op,
        path: path.to_owned(),
        source,
    }
}

/// The metadata directory of one kind of record.
#[derive(Debug)]
pub struct Store<R = Record> {
    dir: RecordDir,
    kind: PhantomData<fn() -> R>,
}

impl<R: Persisted> Store<R> {
    /// Opens (creating if needed) the metadata directory and loads every record in it.
    /// Leftover temporary files from an interrupted write are removed; a record that cannot
    /// be read is reported and skipped, never deleted.
    pub fn open(records_dir: RecordDir) -> Result<(Self, Vec<R>), StoreError> {
        let dir = records_dir.path();
        std::fs::create_dir_all(dir).map_err(err("create", dir))?;
        if let Some(parent) = dir.parent() {
            sync_dir(parent)?;
        }
        let mut records = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(err("list", dir))? {
            let entry = entry.map_err(err("list", dir))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let id = match RecordDir::name(&name) {
                RecordName::Record(id) => id,
                RecordName::Temporary => {
                    log::info!("removing interrupted write {}", path.display());
                    std::fs::remove_file(&path).map_err(err("remove", &path))?;
                    continue;
                }
                RecordName::Other => continue,
            };
            match Self::load(&path) {
                // The file name is the ID; one that could not name a volume directory
                // (`...json` would be `..`) is never trusted.
                Some(record) if record.id() == id && volume_id_problem(id).is_none() => {
                    records.push(record)
                }
                _ => log::error!(
                    "skipping unreadable {} record {} (left in place)",
                    R::KIND,
                    path.display()
                ),
            }
        }
        let kind = PhantomData;
        let dir = records_dir;
        Ok((Self { dir, kind }, records))
    }

    fn load(path: &Path) -> Option<R> {
        let text = std::fs::read(path).ok()?;
        R::from_json(&serde_json::from_slice(&text).ok()?)
    }

    /// Whether a record file for `id` is there, readable or not: data of an ID whose record
    /// could not be read is never treated as left over.
    pub fn has_file(&self, id: &str) -> bool {
        std::fs::symlink_metadata(self.dir.record(id)).is_ok()
    }

    /// Writes a record so that it survives a crash at any point.
    pub fn save(&self, record: &R) -> Result<(), StoreError> {
        let path = self.dir.record(record.id());
        let temp = self.dir.temporary(record.id());
        let body = record.to_json().to_string();
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&temp)?;
            file.write_all(body.as_bytes())?;
            file.sync_all()
        };
        write()
            .map_err(err("write", &temp))
            .and_then(|()| std::fs::rename(&temp, &path).map_err(err("rename into", &path)))
            .inspect_err(|_| {
                let _ = std::fs::remove_file(&temp);
            })?;
        self.sync_dir()
    }

    /// Removes a record durably; a record that is already gone is fine.
    pub fn remove(&self, id: &str) -> Result<(), StoreError> {
        let path = self.dir.record(id);
        match std::fs::remove_file(&path) {
            Ok(()) => self.sync_dir(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(err("remove", &path)(e)),
        }
    }

    /// A rename or unlink is durable only once its directory is synced.
    fn sync_dir(&self) -> Result<(), StoreError> {
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

/// Makes the entries of a directory (created, renamed, removed) durable.
pub fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    std::fs::File::open(dir)
        .and_then(|file| file.sync_all())
        .map_err(err("sync", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store's directory: any will do.
    fn records(dir: &tempfile::TempDir) -> RecordDir {
        RecordDir::at(dir.path().join("records"))
    }

    fn record(id: &str) -> Record {
        Record {
            id: id.into(),
            name: format!("pvc-{id}"),
            capacity: 42,
            ephemeral: false,
            project_id: None,
            source: None,
            attributes: Attributes::default(),
            block: false,
        }
    }

    #[test]
    fn saved_records_are_loaded_back_after_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (store, loaded) = Store::<Record>::open(records(&dir)).unwrap();
        assert!(loaded.is_empty());
        store.save(&record("a")).unwrap();
        store.save(&record("b")).unwrap();
        store.remove("b").unwrap();
        store.remove("never-existed").unwrap();
        let (_, loaded) = Store::<Record>::open(records(&dir)).unwrap();
        assert_eq!(loaded, vec![record("a")]);
    }

    #[test]
    fn a_rewrite_replaces_the_record_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::<Record>::open(records(&dir)).unwrap();
        store.save(&record("a")).unwrap();
        let bigger = Record {
            capacity: 1 << 40,
            ..record("a")
        };
        store.save(&bigger).unwrap();
        let (_, loaded) = Store::<Record>::open(records(&dir)).unwrap();
        assert_eq!(loaded, vec![bigger]);
    }

    #[test]
    fn a_project_id_is_kept_and_records_without_one_still_load() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::<Record>::open(records(&dir)).unwrap();
        let quota = Record {
            project_id: Some(1 << 30),
            ..record("q")
        };
        store.save(&quota).unwrap();
        // As written before project quotas existed.
        let old =
            r#"{"version":1,"id":"old","name":"pvc-old","capacity_bytes":7,"ephemeral":false}"#;
        std::fs::write(records(&dir).record("old"), old).unwrap();
        let (_, mut loaded) = Store::<Record>::open(records(&dir)).unwrap();
        loaded.sort_by(|a, b| a.id.cmp(&b.id));
        let old = Record {
            name: "pvc-old".into(),
            capacity: 7,
            ..record("old")
        };
        assert_eq!(loaded, vec![old, quota]);
    }

    #[test]
    fn a_content_source_is_kept_and_records_from_before_snapshots_still_load() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::<Record>::open(records(&dir)).unwrap();
        let restored = Record {
            source: Some(ContentSource::Snapshot("snap-1".into())),
            ..record("a")
        };
        let cloned = Record {
            source: Some(ContentSource::Volume("b".into())),
            ..record("c")
        };
        store.save(&restored).unwrap();
        store.save(&cloned).unwrap();
        let old = r#"{"version":1,"id":"d","name":"pvc-d","capacity_bytes":42,"ephemeral":false}"#;
        std::fs::write(records(&dir).record("d"), old).unwrap();
        let bad =
            r#"{"id":"e","name":"","capacity_bytes":1,"ephemeral":false,"content_source":{}}"#;
        std::fs::write(records(&dir).record("e"), bad).unwrap();
        let (_, mut loaded) = Store::<Record>::open(records(&dir)).unwrap();
        loaded.sort_by(|a, b| a.id.cmp(&b.id));
        assert_eq!(loaded, vec![restored, cloned, record("d")]);
    }

    #[test]
    fn attributes_and_the_block_access_type_are_kept_and_older_records_load_with_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::<Record>::open(records(&dir)).unwrap();
        let modified = Record {
            attributes: Attributes {
                inode_limit: Some(5000),
                root_mode: Some(0o750),
                direct_io: None,
            },
            ..record("a")
        };
        store.save(&modified).unwrap();
        let block = Record {
            block: true,
            ..record("c")
        };
        store.save(&block).unwrap();
        let old = r#"{"version":1,"id":"b","name":"pvc-b","capacity_bytes":42,"ephemeral":false}"#;
        std::fs::write(records(&dir).record("b"), old).unwrap();
        let (_, mut loaded) = Store::<Record>::open(records(&dir)).unwrap();
        loaded.sort_by(|a, b| a.id.cmp(&b.id));
        assert_eq!(loaded, vec![modified, record("b"), block]);
    }

    #[test]
    fn interrupted_writes_are_cleaned_up_and_torn_records_left_in_place() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(records(&dir).path()).unwrap();
        std::fs::write(records(&dir).temporary("a"), "{\"half").unwrap();
        std::fs::write(records(&dir).record("b"), "not json").unwrap();
        std::fs::write(
            records(&dir).record("c"),
            record("other").to_json().to_string(),
        )
        .unwrap();
        let (_, loaded) = Store::<Record>::open(records(&dir)).unwrap();
        assert!(loaded.is_empty());
        assert!(!records(&dir).temporary("a").exists());
        assert!(records(&dir).record("b").exists(), "evidence is kept");
        assert!(records(&dir).record("c").exists());
    }
}
