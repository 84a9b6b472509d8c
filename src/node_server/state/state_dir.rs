//! The state directory's layout: every name under `--state-dir`, spelled here and nowhere else.
//!
//! ```text
//! <state-dir>/                        canonical (mount points in mountinfo are)
//!   node-server.lock                  flocked by the one node-server using the directory
//!   reserve                           room kept for records on a full filesystem (1 MiB)
//!   meta/<volume-id>.json             a volume's record
//!   meta/<volume-id>.mounts           where it is staged and published (this boot's notes)
//!   volumes/<volume-id>/              its data: a filesystem volume's tree, or
//!   volumes/<volume-id>/volume.img      a block volume's file
//!   snapshot-meta/<snapshot-id>.json  a snapshot's record
//!   snapshots/<snapshot-id>/          its data: a copy of the volume's directory
//!   group-meta/<group-id>.json        a group snapshot's record (its members are snapshots)
//! ```
//!
//! In a record directory, `.tmp-<id>.json` is a record being written (renamed over
//! `<id>.json` when complete), `.tmp-<id>.mounts` likewise a volume's mount notes; IDs never
//! start with a dot, so the names cannot collide. In
//! `volumes/` and `snapshots/`, `.partial-<pid>-<n>-<id>` is a copy being built: that name is
//! the copy engine's own ([`crate::linux::copy`]), the same beside any destination. Also in
//! `volumes/` and `snapshots/`, `.orphan-<hex>` is what an interrupted operation left (a copy's
//! temporary tree, a directory without a record), set aside at start-up under a name no ID can
//! have and removed in the background ([`super::orphans`]).
//!
//! These names are the on-disk format: existing nodes have them, so they never change.
//!
//! Everything here but a pod's view is root-only whatever the umask: the directories are 0700
//! (created so, and an existing looser one tightened at start, [`StateDir::make_private`]),
//! records and the lock file 0600. A volume's root keeps its `rootMode` (pods reach it through
//! their bind mounts, not through `volumes/`), and so does a snapshot's copy of it, which
//! the 0700 `snapshots/` above it keeps out of reach.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

const VOLUME_RECORDS: &str = "meta";
const VOLUME_DATA: &str = "volumes";
const SNAPSHOT_RECORDS: &str = "snapshot-meta";
const SNAPSHOT_DATA: &str = "snapshots";
const GROUP_RECORDS: &str = "group-meta";
/// The owner's lock file (see [`super::owner`]).
const OWNER_LOCK: &str = "node-server.lock";
/// A block volume's file, in its directory (and so in its snapshots' copies).
const BLOCK_IMAGE: &str = "volume.img";
const RECORD_SUFFIX: &str = ".json";
const TEMP_PREFIX: &str = ".tmp-";
const MOUNT_NOTES_SUFFIX: &str = ".mounts";
/// Leftovers set aside for removal; IDs never start with a dot, so none can be claimed.
const ORPHAN_PREFIX: &str = ".orphan-";

/// The state directory could not be created or resolved.
#[derive(Debug, thiserror::Error)]
#[error("{op} state directory {}: {source}", path.display())]
pub struct StateDirError {
    pub op: &'static str,
    /// As given.
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// The state directory, resolved once: where every volume, snapshot and record is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateDir {
    root: PathBuf,
    volume_data: PathBuf,
    snapshot_data: PathBuf,
    volume_records: RecordDir,
    snapshot_records: RecordDir,
    group_records: RecordDir,
}

impl StateDir {
    /// Creates the directory `given` (as `--state-dir` names it) if needed and resolves it;
    /// the directories inside are created by those who keep them.
    pub fn open(given: &Path) -> Result<Self, StateDirError> {
        let fail = |op| {
            move |source| StateDirError {
                op,
                path: given.to_owned(),
                source,
            }
        };
        private_dir_builder()
            .recursive(true)
            .create(given)
            .map_err(fail("create"))?;
        let root = given.canonicalize().map_err(fail("resolve"))?;
        Ok(Self::at(root))
    }

    /// Creates the directories inside 0700 and tightens any of them (the state directory
    /// too) that group or others may enter, saying so in one line: node-servers before this one
    /// made them 0755. Run by the owner, before anything is read.
    pub fn make_private(&self) -> Result<(), StateDirError> {
        let fail = |op, path: &Path| {
            let path = path.to_owned();
            move |source| StateDirError { op, path, source }
        };
        let mut tightened = Vec::new();
        for dir in self.private_dirs() {
            match private_dir_builder().create(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(fail("create", dir)(e)),
            }
            let meta = std::fs::symlink_metadata(dir).map_err(fail("inspect", dir))?;
            let mode = meta.permissions().mode() & 0o7777;
            if !meta.is_dir() || mode == 0o700 {
                // A non-directory fails where its keeper opens it, naming it.
                continue;
            }
            let private = std::fs::Permissions::from_mode(0o700);
            std::fs::set_permissions(dir, private).map_err(fail("tighten", dir))?;
            tightened.push(format!("{} ({mode:04o} to 0700)", dir.display()));
        }
        let records = [
            self.volume_records.path(),
            self.snapshot_records.path(),
            self.group_records.path(),
        ];
        let files = super::loose_files::tighten(&records, &[&self.owner_lock()]).map_err(|e| {
            StateDirError {
                op: e.op,
                path: e.path,
                source: e.source,
            }
        })?;
        if files > 0 {
            tightened.push(format!("{files} file(s) (0600)"));
        }
        if !tightened.is_empty() {
            log::info!("made root-only: {}", tightened.join(", "));
        }
        super::reserve::take(&self.root.join(super::reserve::RESERVE));
        Ok(())
    }

    /// The entries of the state directory that no node-server made: all but the layout's
    /// directories, the lock file, a filesystem's `lost+found` and the socket `endpoint` (when
    /// it is directly inside), sorted. None when the directory does not exist yet, or when it
    /// is a node-server's already: it holds the lock file, `snapshot-meta/` or `group-meta/`
    /// (names no other program uses, unlike `volumes/`, which Docker's directory has too; and
    /// not the lock file alone, which a neighbour can unlink). A directory with any is someone
    /// else's (`/`, `/tmp`, a kubelet's): start-up would tighten it to 0700 and take what it
    /// holds for leftovers, so it is refused.
    pub fn foreign_entries(&self, endpoint: &Path) -> std::io::Result<Vec<std::ffi::OsString>> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let ours = [
            VOLUME_RECORDS,
            VOLUME_DATA,
            SNAPSHOT_RECORDS,
            SNAPSHOT_DATA,
            GROUP_RECORDS,
            OWNER_LOCK,
            super::reserve::RESERVE,
            "lost+found",
        ];
        let socket = (endpoint.parent() == Some(self.root.as_path()))
            .then(|| endpoint.file_name())
            .flatten();
        let marks = [OWNER_LOCK, SNAPSHOT_RECORDS, GROUP_RECORDS];
        let mut foreign = Vec::new();
        for entry in entries {
            let name = entry?.file_name();
            if marks.iter().any(|mark| name == *mark) {
                return Ok(Vec::new());
            }
            if !ours.iter().any(|ours| name == *ours) && Some(name.as_os_str()) != socket {
                foreign.push(name);
            }
        }
        foreign.sort();
        Ok(foreign)
    }

    /// The directories whose entries start-up takes for its own (records, data, leftovers to
    /// set aside): nothing else may live there.
    pub fn kept_dirs(&self) -> [&Path; 5] {
        let [_, dirs @ ..] = self.private_dirs();
        dirs
    }

    fn private_dirs(&self) -> [&Path; 6] {
        [
            &self.root,
            self.volume_records.path(),
            &self.volume_data,
            self.snapshot_records.path(),
            &self.snapshot_data,
            self.group_records.path(),
        ]
    }

    /// The layout under `root`, taken as canonical (nothing is created or resolved).
    pub fn at(root: PathBuf) -> Self {
        Self {
            volume_data: root.join(VOLUME_DATA),
            snapshot_data: root.join(SNAPSHOT_DATA),
            volume_records: RecordDir::at(root.join(VOLUME_RECORDS)),
            snapshot_records: RecordDir::at(root.join(SNAPSHOT_RECORDS)),
            group_records: RecordDir::at(root.join(GROUP_RECORDS)),
            root,
        }
    }

    /// The state directory itself, canonical.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file the one node-server using this directory holds an exclusive `flock` on.
    pub fn owner_lock(&self) -> PathBuf {
        self.root.join(OWNER_LOCK)
    }

    /// Where volume directories are.
    pub fn volume_data(&self) -> &Path {
        &self.volume_data
    }

    /// A volume's directory (which may not exist).
    pub fn volume(&self, id: &str) -> PathBuf {
        self.volume_data.join(id)
    }

    /// A block volume's file.
    pub fn block_image(&self, id: &str) -> PathBuf {
        block_image_in(&self.volume(id))
    }

    /// Where snapshots' data directories are.
    pub fn snapshot_data(&self) -> &Path {
        &self.snapshot_data
    }

    /// A snapshot's data directory (which may not exist).
    pub fn snapshot(&self, id: &str) -> PathBuf {
        self.snapshot_data.join(id)
    }

    pub fn volume_records(&self) -> &RecordDir {
        &self.volume_records
    }

    pub fn snapshot_records(&self) -> &RecordDir {
        &self.snapshot_records
    }

    pub fn group_records(&self) -> &RecordDir {
        &self.group_records
    }
}

/// Directories under the state directory are made 0700; the umask can only narrow that.
fn private_dir_builder() -> std::fs::DirBuilder {
    let mut builder = std::fs::DirBuilder::new();
    builder.mode(0o700);
    builder
}

/// The name a leftover is set aside under in its data directory, `tag` making it unique.
pub fn orphan_name(tag: &str) -> String {
    format!("{ORPHAN_PREFIX}{tag}")
}

/// Whether an entry of a data directory is a leftover set aside for removal.
pub fn is_orphan(name: &std::ffi::OsStr) -> bool {
    name.as_encoded_bytes()
        .starts_with(ORPHAN_PREFIX.as_bytes())
}

/// A block volume's file in `dir`, a volume's directory (or a copy of one being filled).
pub fn block_image_in(dir: &Path) -> PathBuf {
    dir.join(BLOCK_IMAGE)
}

/// A directory of records of one kind: `<id>.json` each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordDir(PathBuf);

/// What a name in a [`RecordDir`] is.
#[derive(Debug, PartialEq, Eq)]
pub enum RecordName<'a> {
    /// The record of this ID.
    Record(&'a str),
    /// A record being written, or one whose write was interrupted.
    Temporary,
    /// Anything else (left alone).
    Other,
}

impl RecordDir {
    /// Records in `dir` (the state directory's own are [`StateDir`]'s).
    pub fn at(dir: PathBuf) -> Self {
        Self(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The record of `id`.
    pub fn record(&self, id: &str) -> PathBuf {
        self.0.join(format!("{id}{RECORD_SUFFIX}"))
    }

    /// Where the record of `id` is written before it is renamed into place.
    pub fn temporary(&self, id: &str) -> PathBuf {
        self.0.join(format!("{TEMP_PREFIX}{id}{RECORD_SUFFIX}"))
    }

    /// Where a volume's mount notes (its staging paths and targets) are kept beside its record.
    pub fn mount_notes(&self, id: &str) -> PathBuf {
        self.0.join(format!("{id}{MOUNT_NOTES_SUFFIX}"))
    }

    /// The mark of a freeze of volume `id`'s filesystem, there from just before the freeze
    /// to just after the thaw: what a crash in between left frozen.
    pub fn frozen_mark(&self, id: &str) -> PathBuf {
        self.0.join(format!("{id}.frozen"))
    }

    /// Where the mount notes of `id` are written before they are renamed into place.
    pub fn temporary_mount_notes(&self, id: &str) -> PathBuf {
        self.0
            .join(format!("{TEMP_PREFIX}{id}{MOUNT_NOTES_SUFFIX}"))
    }

    /// What the entry `name` in this directory is.
    pub fn name(name: &str) -> RecordName<'_> {
        if name.starts_with(TEMP_PREFIX) {
            return RecordName::Temporary;
        }
        match name.strip_suffix(RECORD_SUFFIX) {
            Some(id) => RecordName::Record(id),
            None => RecordName::Other,
        }
    }
}

/// The longest volume ID we accept: it becomes a file name (NAME_MAX), with room for the
/// `.json` and temporary-file decorations of its metadata file.
pub const MAX_VOLUME_ID: usize = 200;

/// Why a volume ID cannot name a directory: it must be one plain path component.
pub fn volume_id_problem(id: &str) -> Option<&'static str> {
    if id.is_empty() {
        Some("is empty")
    } else if id.len() > MAX_VOLUME_ID {
        Some("is longer than 200 bytes")
    } else if id.contains('/') || id.contains('\0') {
        Some("contains a path separator or NUL")
    } else if id == "." || id == ".." || id.starts_with('.') {
        Some("begins with a dot")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The on-disk names, spelled out from outside on purpose: nodes have them, so a change
    /// here is an incompatible format change, never a refactoring.
    #[test]
    fn the_layout_is_the_one_on_disk() {
        let state = StateDir::at(PathBuf::from("/var/lib/csi-nodekit"));
        let at = |path: &Path| path.to_str().unwrap().to_owned();
        assert_eq!(at(state.root()), "/var/lib/csi-nodekit");
        assert_eq!(
            at(&state.volume("vol-1")),
            "/var/lib/csi-nodekit/volumes/vol-1"
        );
        assert_eq!(
            at(&state.block_image("vol-1")),
            "/var/lib/csi-nodekit/volumes/vol-1/volume.img"
        );
        assert_eq!(
            at(&state.volume_records().record("vol-1")),
            "/var/lib/csi-nodekit/meta/vol-1.json"
        );
        assert_eq!(
            at(&state.volume_records().temporary("vol-1")),
            "/var/lib/csi-nodekit/meta/.tmp-vol-1.json"
        );
        assert_eq!(
            at(&state.snapshot("snap-1")),
            "/var/lib/csi-nodekit/snapshots/snap-1"
        );
        assert_eq!(
            at(&state.snapshot_records().record("snap-1")),
            "/var/lib/csi-nodekit/snapshot-meta/snap-1.json"
        );
        assert_eq!(
            at(&state.group_records().record("group-1")),
            "/var/lib/csi-nodekit/group-meta/group-1.json"
        );
        assert_eq!(at(state.volume_data()), "/var/lib/csi-nodekit/volumes");
        assert_eq!(
            at(&state.owner_lock()),
            "/var/lib/csi-nodekit/node-server.lock"
        );
        assert_eq!(at(state.snapshot_data()), "/var/lib/csi-nodekit/snapshots");
        assert_eq!(orphan_name("0a1b"), ".orphan-0a1b");
        assert!(is_orphan(std::ffi::OsStr::new(".orphan-0a1b")));
        assert!(
            volume_id_problem(&orphan_name("x")).is_some(),
            "never an ID"
        );
    }

    #[test]
    fn a_looser_state_directory_is_made_root_only_with_its_directories_and_volumes_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(&dir.path().join("state")).unwrap();
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(state.root()), 0o700);
        std::fs::set_permissions(state.root(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(state.volume_data()).unwrap();
        std::fs::set_permissions(state.volume_data(), std::fs::Permissions::from_mode(0o777))
            .unwrap();
        std::fs::create_dir(state.volume("vol-1")).unwrap();
        std::fs::set_permissions(
            state.volume("vol-1"),
            std::fs::Permissions::from_mode(0o777),
        )
        .unwrap();
        state.make_private().unwrap();
        for private in state.private_dirs() {
            assert_eq!(mode(private), 0o700, "{}", private.display());
        }
        assert_eq!(
            mode(&state.volume("vol-1")),
            0o777,
            "a volume keeps its rootMode"
        );
    }

    #[test]
    fn names_in_a_record_directory_are_told_apart() {
        assert_eq!(RecordDir::name("vol-1.json"), RecordName::Record("vol-1"));
        assert_eq!(RecordDir::name(".tmp-vol-1.json"), RecordName::Temporary);
        assert_eq!(RecordDir::name(".tmp-"), RecordName::Temporary);
        assert_eq!(RecordDir::name("vol-1.json~"), RecordName::Other);
        assert_eq!(RecordDir::name("notes"), RecordName::Other);
        assert_eq!(RecordDir::name("vol-1.mounts"), RecordName::Other);
        assert_eq!(RecordDir::name(".tmp-vol-1.mounts"), RecordName::Temporary);
    }

    #[test]
    fn opening_creates_and_resolves_but_keeps_the_given_path_for_errors() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("link");
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("real"), &link).unwrap();
        let state = StateDir::open(&link.join("state")).unwrap();
        let real = dir.path().canonicalize().unwrap().join("real/state");
        assert_eq!(state.root(), real);
        assert!(real.is_dir());
        std::fs::write(dir.path().join("file"), b"").unwrap();
        let given = dir.path().join("file/state");
        let err = StateDir::open(&given).unwrap_err();
        assert_eq!((err.op, &err.path), ("create", &given));
    }
}
