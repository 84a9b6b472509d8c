//! Which call each path of a volume belongs to: the staging paths NodeStageVolume used and the
//! targets NodePublishVolume used (with whether it made the mount point), kept in the volume's
//! mount notes beside its record ([`mount_notes`]), so one call cannot act on the other's path
//! and unpublish removes only what it made.

use std::path::{Path, PathBuf};

use crate::csi_spec::Field;

use super::catalog::Catalog;
#[cfg(doc)]
use super::mount_notes;
use super::volume_error::VolumeError;
use super::volume_record::{Record, Target};

/// What a path is to a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Staging,
    Target,
}

impl Role {
    /// The request field that names a path in this role.
    pub fn field(self) -> Field {
        match self {
            Role::Staging => Field::StagingTargetPath,
            Role::Target => Field::TargetPath,
        }
    }
}

impl Catalog {
    /// The volume (its ID) that uses `path` in `role`, if one does.
    pub fn using(&self, path: &Path, role: Role) -> Option<String> {
        self.with_all(|records| {
            let mut records = records.values();
            let found = match role {
                Role::Staging => records.find(|r| r.staged_at.iter().any(|p| p == path)),
                Role::Target => records.find(|r| r.targets.iter().any(|t| t.path == path)),
            };
            found.map(|r| r.id.clone())
        })
    }

    /// Changes where a volume's record says it is mounted with `change` and saves its mount
    /// notes, if it changed anything: unsynced, as a reboot undoes the mounts themselves.
    fn amend(&self, id: &str, change: impl FnOnce(&mut Record)) -> Result<(), VolumeError> {
        let Some(mut record) = self.get(id) else {
            return Ok(());
        };
        let before = record.clone();
        change(&mut record);
        if record != before {
            self.save_notes(record)?;
        }
        Ok(())
    }

    /// Remembers that the volume is staged at `path`.
    pub fn note_staged(&self, id: &str, path: &Path) -> Result<(), VolumeError> {
        self.amend(id, |r| {
            if !r.staged_at.iter().any(|p| p == path) {
                r.staged_at.push(path.to_owned());
            }
        })
    }

    /// Forgets the staging path `path`.
    pub fn forget_staged(&self, id: &str, path: &Path) -> Result<(), VolumeError> {
        self.amend(id, |r| r.staged_at.retain(|p| p != path))
    }

    /// Remembers that the volume is published at `path`, and whether publish made the mount
    /// point (a mount point it made once stays made by it).
    pub fn note_target(
        &self,
        id: &str,
        path: &Path,
        created: bool,
        pod: Option<&str>,
    ) -> Result<(), VolumeError> {
        self.amend(id, |r| {
            match r.targets.iter_mut().find(|t| t.path == path) {
                Some(target) => {
                    target.created |= created;
                    if pod.is_some() {
                        target.pod = pod.map(str::to_owned);
                    }
                }
                None => r.targets.push(Target {
                    path: PathBuf::from(path),
                    created,
                    pod: pod.map(str::to_owned),
                }),
            }
        })
    }

    /// Forgets the target `path`.
    pub fn forget_target(&self, id: &str, path: &Path) -> Result<(), VolumeError> {
        self.amend(id, |r| r.targets.retain(|t| t.path != path))
    }
}
