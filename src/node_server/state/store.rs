//! Metadata on disk: one small JSON file per volume in its [`RecordDir`] (and per snapshot
//! and group snapshot, in their own: any [`Persisted`] record; [`state_dir`] names them), written
//! atomically (temporary file, fsync, rename, fsync of the directory), so that after a crash
//! each file is either the old or the new record, never a torn one. (Where a volume is
//! mounted, which a reboot makes stale anyway, is kept beside its record without any fsync:
//! `state::volumes::mount_notes`, written with [`replace_file`] when it is long.)

use std::io::Write;
use std::marker::PhantomData;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

#[cfg(doc)]
use crate::node_server::state::state_dir;
use crate::node_server::state::state_dir::volume_id_problem;
use crate::node_server::state::state_dir::{RecordDir, RecordName};
use crate::path_io::PathIoError;

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
pub struct Store<R> {
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
pub(crate) enum Synced {
    Yes,
    No,
}

/// `body` written to `temp` (0600), synced if asked, renamed over `path`; `temp` is removed
/// when any step fails.
pub(crate) fn replace_file(
    temp: &Path,
    path: &Path,
    body: &[u8],
    synced: Synced,
) -> Result<(), PathIoError> {
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
    let full = |e: &std::io::Error| e.raw_os_error() == Some(nix::libc::ENOSPC);
    let written = match write() {
        // A full filesystem: the room kept for records, then once more.
        Err(e) if full(&e) && super::reserve::give_up(path) => write(),
        other => other,
    };
    written
        .map_err(PathIoError::at("write", temp))
        .and_then(|()| std::fs::rename(temp, path).map_err(PathIoError::at("rename into", path)))
        .inspect(|()| super::reserve::retake(path))
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

#[cfg(test)]
mod tests;
