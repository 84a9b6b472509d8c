//! Where a volume is mounted (its record's staging paths and targets), kept in a file of its
//! own beside the record, `<id>.mounts`, written without any fsync ([`MountNoteFiles`]).
//!
//! The notes mean something only until the next boot: a reboot undoes every mount they
//! describe. A process crash or restart finds what was written (the page cache holds it, and
//! each write is whole there, see [`MountNoteFiles::save`]), so the one loss a missing fsync
//! allows is a power loss's, and the same power loss made the notes false. The record itself
//! is still written durably by [`Store::save`], never holding the notes; an fsync per
//! NodePublishVolume and per NodeUnpublishVolume was the whole cost of keeping them in it.
//!
//! Read back: a notes file wins over notes an earlier version wrote into the record; a notes
//! file that cannot be parsed (only a power loss tears one) is read as no notes at all.

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::volume_record::{Record, Target};
use crate::node_server::state::state_dir::RecordDir;
#[cfg(doc)]
use crate::node_server::state::store::Store;
use crate::node_server::state::store::{Synced, replace_file};
use crate::path_io::PathIoError;

/// The longest notes written in place (see [`MountNoteFiles::save`]).
const ONE_PAGE: usize = 4096;

/// A `<id>.mounts` file's contents.
#[derive(Debug, Default, Serialize, Deserialize)]
struct MountNotes {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    staged_at: Vec<PathBuf>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    targets: Vec<Target>,
}

/// The notes files, beside the volume records in their directory.
#[derive(Debug)]
pub struct MountNoteFiles {
    dir: RecordDir,
}

impl MountNoteFiles {
    pub fn new(dir: RecordDir) -> Self {
        Self { dir }
    }

    /// Writes where `record` says its volume is mounted, neither synced (see the module's
    /// comment for why nothing is lost).
    ///
    /// Notes that fit in one page overwrite the file in place with one `pwrite` at offset 0,
    /// padded with spaces (which JSON allows after a value) to the file's length: a write
    /// within one page is copied whole or not at all, even by a process being killed, so a
    /// restart reads the old notes or the new ones. Writing a temporary file and renaming it
    /// over would make and free an inode per call, and ext4 scans past every inode freed in the
    /// last moments when it allocates one: at hundreds of publishes a second that scan was a
    /// third of a publish's CPU. Longer notes take the temporary file and the rename.
    pub fn save(&self, record: &Record) -> Result<(), PathIoError> {
        let path = self.dir.mount_notes(&record.id);
        let notes = MountNotes {
            staged_at: record.staged_at.clone(),
            targets: record.targets.clone(),
        };
        let mut body = serde_json::to_vec(&notes)
            .map_err(std::io::Error::other)
            .map_err(PathIoError::at("encode", &path))?;
        if body.len() > ONE_PAGE {
            return self.replace(&record.id, &body);
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(PathIoError::at("open", &path))?;
        let length = file
            .metadata()
            .map_err(PathIoError::at("stat", &path))?
            .len();
        if length > ONE_PAGE as u64 {
            return self.replace(&record.id, &body);
        }
        body.resize(body.len().max(length as usize), b' ');
        file.write_all_at(&body, 0)
            .map_err(PathIoError::at("write", &path))
    }

    /// Notes longer than a page: a temporary file renamed over the notes.
    fn replace(&self, id: &str, body: &[u8]) -> Result<(), PathIoError> {
        let path = self.dir.mount_notes(id);
        let temp = self.dir.temporary_mount_notes(id);
        replace_file(&temp, &path, body, Synced::No)
    }

    /// Puts the notes kept beside `record` into it; without a notes file the record keeps
    /// what an earlier version wrote into it (or nothing).
    pub fn read(&self, record: &mut Record) {
        let path = self.dir.mount_notes(&record.id);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                log::warn!(
                    "{}: {e}; keeping the record's own mount notes",
                    path.display()
                );
                return;
            }
        };
        let notes = serde_json::from_slice::<MountNotes>(&bytes).unwrap_or_else(|e| {
            log::warn!(
                "{}: {e}; read as no mounts (only a power loss tears these notes, and it \
                 undid the mounts as well)",
                path.display()
            );
            MountNotes::default()
        });
        record.staged_at = notes.staged_at;
        record.targets = notes.targets;
    }

    /// Removes a volume's notes (before its record, so no notes outlive their record);
    /// notes already gone are fine.
    pub fn remove(&self, id: &str) -> Result<(), PathIoError> {
        let path = self.dir.mount_notes(id);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(PathIoError::at("remove", &path)(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_server::state::store::Store;

    fn published(id: &str) -> Record {
        Record {
            id: id.into(),
            name: format!("pvc-{id}"),
            capacity: 42,
            staged_at: vec![PathBuf::from("/var/lib/kubelet/staging/a")],
            targets: vec![Target {
                path: PathBuf::from("/var/lib/kubelet/pods/p/mount"),
                created: true,
                pod: None,
            }],
            ..Default::default()
        }
    }

    /// A store holding `published("vol-1")`, its notes written.
    fn published_with_notes() -> (tempfile::TempDir, RecordDir, Store<Record>, Record) {
        let dir = tempfile::tempdir().unwrap();
        let records = RecordDir::at(dir.path().join("meta"));
        let (store, _) = Store::<Record>::open(records.clone()).unwrap();
        let record = published("vol-1");
        store.save(&record).unwrap();
        MountNoteFiles::new(records.clone()).save(&record).unwrap();
        (dir, records, store, record)
    }

    fn reopen(dir: &RecordDir) -> Vec<Record> {
        let (_store, mut records) = Store::<Record>::open(dir.clone()).unwrap();
        let notes = MountNoteFiles::new(dir.clone());
        records.iter_mut().for_each(|r| notes.read(r));
        records
    }

    #[test]
    fn mount_notes_live_beside_the_record_and_never_in_it() {
        let (_dir, records, _store, record) = published_with_notes();
        let on_disk = std::fs::read_to_string(records.record("vol-1")).unwrap();
        assert!(
            !on_disk.contains("staged_at") && !on_disk.contains("targets"),
            "{on_disk}"
        );
        assert_eq!(reopen(&records), vec![record.clone()]);

        let unpublished = Record {
            targets: Vec::new(),
            ..record
        };
        MountNoteFiles::new(records.clone())
            .save(&unpublished)
            .unwrap();
        assert_eq!(reopen(&records), vec![unpublished]);
    }

    #[test]
    fn an_earlier_versions_notes_in_the_record_are_read_until_notes_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let records = RecordDir::at(dir.path().join("meta"));
        std::fs::create_dir_all(records.path()).unwrap();
        std::fs::write(
            records.record("vol-1"),
            r#"{"capacity_bytes":42,"ephemeral":false,"id":"vol-1","name":"pvc-vol-1","staged_at":["/var/lib/kubelet/staging/a"],"targets":[{"created":true,"path":"/var/lib/kubelet/pods/p/mount"}],"version":1}"#,
        )
        .unwrap();
        assert_eq!(reopen(&records), vec![published("vol-1")]);

        let unmounted = Record {
            id: "vol-1".into(),
            ..Default::default()
        };
        MountNoteFiles::new(records.clone())
            .save(&unmounted)
            .unwrap();
        assert!(
            reopen(&records)[0].targets.is_empty(),
            "the notes file wins"
        );
    }

    #[test]
    fn shorter_notes_are_padded_in_place_and_notes_over_a_page_replace_the_file() {
        let (_dir, records, _store, record) = published_with_notes();
        let file = records.mount_notes("vol-1");
        let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&file).unwrap());
        let long = std::fs::read(&file).unwrap().len();
        let unpublished = Record {
            targets: Vec::new(),
            ..record.clone()
        };
        MountNoteFiles::new(records.clone())
            .save(&unpublished)
            .unwrap();
        let bytes = std::fs::read(&file).unwrap();
        assert_eq!(bytes.len(), long, "padded to the old length");
        assert!(
            bytes.trim_ascii_end().ends_with(b"}") && bytes.ends_with(b" "),
            "{}",
            String::from_utf8_lossy(&bytes)
        );
        let same = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&file).unwrap());
        assert_eq!(same, inode, "written in place");
        assert_eq!(reopen(&records), vec![unpublished]);

        let crowded = Record {
            targets: (0..60)
                .map(|n| Target {
                    path: PathBuf::from(format!("/var/lib/kubelet/pods/{n:0>60}/mount")),
                    created: false,
                    pod: None,
                })
                .collect(),
            ..record
        };
        MountNoteFiles::new(records.clone()).save(&crowded).unwrap();
        assert!(std::fs::read(&file).unwrap().len() > ONE_PAGE);
        assert_eq!(reopen(&records), vec![crowded.clone()]);
        MountNoteFiles::new(records.clone()).save(&crowded).unwrap();
        assert_eq!(reopen(&records), vec![crowded]);
    }

    #[test]
    fn torn_notes_read_as_no_mounts_and_removal_takes_them_away() {
        let dir = tempfile::tempdir().unwrap();
        let records = RecordDir::at(dir.path().join("meta"));
        let (store, _) = Store::<Record>::open(records.clone()).unwrap();
        store.save(&published("vol-1")).unwrap();
        std::fs::write(records.mount_notes("vol-1"), b"{\"staged_at\":[\"/va").unwrap();
        let loaded = reopen(&records);
        assert!(loaded[0].staged_at.is_empty() && loaded[0].targets.is_empty());

        MountNoteFiles::new(records.clone())
            .remove("vol-1")
            .unwrap();
        MountNoteFiles::new(records.clone())
            .remove("vol-1")
            .unwrap();
        assert!(!records.mount_notes("vol-1").exists());
        std::fs::write(records.temporary_mount_notes("vol-1"), b"{").unwrap();
        reopen(&records);
        assert!(
            !records.temporary_mount_notes("vol-1").exists(),
            "an interrupted write is removed at start"
        );
    }
}
