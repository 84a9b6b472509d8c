//! Today's layout of a volume ([`VolumeStorage`]): a directory of its own under the state
//! directory's volume data, world-writable like an emptyDir, held to its size by a project
//! quota where the filesystem enforces them ([`VolumeQuotas`]), accounted otherwise. A block
//! volume is the same directory, private, holding its file of exactly its size, which needs no
//! project; so is an image volume, whose file holds a filesystem of its own (its root, mode
//! and group are that filesystem's, set by the driver where it is mounted).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::project_quotas::{Hold, Released, VolumeQuotas};
use super::storage::VolumeStorage;
use super::volume_error::VolumeError;
use super::volume_record::Record;
use crate::linux::mountinfo::MountTable;
use crate::node_server::state::orphans::Orphans;
use crate::node_server::state::state_dir::{StateDir, volume_id_problem};
use crate::node_server::state::store::sync_dir;
use crate::path_io::PathIoError;

#[derive(Debug)]
pub struct QuotaDirectories {
    state: StateDir,
    quotas: VolumeQuotas,
}

impl QuotaDirectories {
    /// The directory volume directories are made in, created.
    pub fn create_data_dir(state: &StateDir) -> Result<&Path, VolumeError> {
        let data_dir = state.volume_data();
        std::fs::create_dir_all(data_dir).map_err(PathIoError::at("create", data_dir))?;
        Ok(data_dir)
    }

    /// Volume directories in `state`'s volume data, held as `quotas` decided.
    pub fn new(state: &StateDir, quotas: VolumeQuotas) -> Self {
        Self {
            state: state.clone(),
            quotas,
        }
    }

    /// Why sizes are not enforced here (so no volume has a project quota to hold an inode
    /// limit, and no patrol has anything to hold), unless they are.
    pub fn unenforced_reason(&self) -> Option<&str> {
        self.quotas.reason()
    }

    /// How sizes hold here: for the quota patrol, which fences a volume whose pod keeps
    /// escaping ([`VolumeQuotas::freeze_inodes`]) and puts its limits back after.
    pub fn quotas(&self) -> &VolumeQuotas {
        &self.quotas
    }

    fn dir(&self, id: &str) -> PathBuf {
        self.state.volume(id)
    }

    /// A new volume's directory, world-writable (made durable, with its content, before its
    /// record).
    fn make_dir(&self, dir: &Path) -> Result<(), VolumeError> {
        match std::fs::create_dir(dir) {
            Ok(()) => {}
            // Left by a crash between mkdir and the record: the same volume, still empty.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(PathIoError::at("create", dir)(e).into()),
        }
        // World-writable like an emptyDir: pods run as any user; volume_mount_group narrows
        // the group when the CO asks.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
            .map_err(PathIoError::at("set mode of", dir))?;
        Ok(())
    }
}

impl VolumeStorage for QuotaDirectories {
    fn prepare(&self, record: &mut Record) -> Result<(), VolumeError> {
        // A block or image volume's file cannot outgrow its size: it needs no project.
        if !record.has_own_file() {
            (self.quotas.check_new_directory()).map_err(|why| VolumeError::SizeWouldNotHold {
                id: record.id.clone(),
                why,
            })?;
            record.project_id = self.quotas.allocate()?;
        }
        let dir = self.dir(&record.id);
        if let Err(e) = self.make_dir(&dir) {
            self.quotas.abandon(&dir, record);
            return Err(e);
        }
        Ok(())
    }

    fn hold_new(&self, record: &Record) -> Result<(), VolumeError> {
        Ok(self.quotas.assign(&self.dir(&record.id), record)?)
    }

    fn abandon(&self, record: &Record) {
        let dir = self.dir(&record.id);
        self.quotas.abandon(&dir, record);
        if let Err(left) = crate::linux::copy::remove_tree(&dir) {
            log::error!("volume {} failed to fill; removing it: {left}", record.id);
        }
    }

    fn make_durable(&self, _record: &Record) -> Result<(), VolumeError> {
        Ok(sync_dir(self.state.volume_data())?)
    }

    fn user(&self, id: &str, table: &MountTable) -> Result<Option<PathBuf>, VolumeError> {
        let dir = self.dir(id);
        if !dir.exists() {
            return Ok(None);
        }
        Ok(table.first_user(&dir)?)
    }

    fn remove_data(&self, id: &str) -> Result<bool, VolumeError> {
        let dir = self.dir(id);
        if !dir.exists() {
            return Ok(false);
        }
        // Never follows a symlink nor crosses a mount; names the entry it cannot remove.
        crate::linux::copy::remove_tree(&dir).map_err(|source| VolumeError::Undeletable {
            id: id.to_owned(),
            source,
        })?;
        // Durably gone before the record goes, so a crash cannot leave unlisted data.
        sync_dir(self.state.volume_data())?;
        Ok(true)
    }

    fn release(&self, record: &Record, wait: Duration) -> Result<Released, VolumeError> {
        Ok(self.quotas.release(record, wait)?)
    }

    fn set_aside(&self, id: &str, table: &MountTable, orphans: &Orphans) -> bool {
        let dir = self.dir(id);
        let unused = dir.exists() && matches!(table.first_user(&dir), Ok(None));
        if !unused {
            return false;
        }
        match orphans.set_aside(self.state.volume_data(), std::ffi::OsStr::new(id)) {
            Ok(()) => true,
            Err(e) => {
                log::error!("could not set aside what is left of volume {id}: {e}");
                false
            }
        }
    }

    fn set_aside_unrecorded(
        &self,
        orphans: &Orphans,
        recorded: &dyn Fn(&str) -> bool,
    ) -> Result<(), VolumeError> {
        let data_dir = self.state.volume_data();
        orphans
            .resume(data_dir)
            .map_err(PathIoError::at("list", data_dir))?;
        let names = std::fs::read_dir(data_dir).map_err(PathIoError::at("list", data_dir))?;
        for entry in names {
            let entry = entry.map_err(PathIoError::at("list", data_dir))?;
            let name = entry.file_name();
            let Some(id) = name.to_str() else { continue };
            if volume_id_problem(id).is_some() || recorded(id) {
                continue;
            }
            log::info!("volume directory {id} has no record: its create was interrupted");
            if let Err(e) = orphans.set_aside(data_dir, &name) {
                log::error!("could not set aside volume directory {id}: {e}");
            }
        }
        Ok(())
    }

    fn hold(&self, record: &Record) -> Result<Hold, VolumeError> {
        Ok(self.quotas.hold(record)?)
    }

    fn check_changeable(&self, record: &Record) -> Result<(), VolumeError> {
        Ok(self.quotas.check_changeable(record)?)
    }

    fn apply_limits(&self, record: &Record) -> Result<(), VolumeError> {
        Ok(self.quotas.apply(record)?)
    }

    fn allow_copy(&self, record: &Record, headroom: u64) -> Result<(), VolumeError> {
        Ok(self.quotas.allow_copy(record, headroom)?)
    }

    fn apply_root_mode(&self, record: &Record) -> Result<(), VolumeError> {
        let Some(mode) = record.attributes.root_mode else {
            return Ok(());
        };
        // An image volume's root is its filesystem's, reached only where it is mounted.
        if record.is_image() {
            return Ok(());
        }
        let dir = self.dir(&record.id);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
            .map_err(PathIoError::at("set the mode of", &dir))?;
        Ok(())
    }

    fn set_group(&self, record: &Record, gid: u32) -> Result<(), VolumeError> {
        // Never the private directory holding an image: its root is its filesystem's.
        if record.is_image() {
            return Ok(());
        }
        let dir = self.dir(&record.id);
        std::os::unix::fs::lchown(&dir, None, Some(gid))
            .map_err(PathIoError::at("set the group of", &dir))?;
        let mode = std::fs::symlink_metadata(&dir)
            .map_err(PathIoError::at("inspect", &dir))?
            .permissions()
            .mode();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode | 0o2070))
            .map_err(PathIoError::at("make group-writable and setgid", &dir))?;
        Ok(())
    }

    fn adopt(&self, records: &[Record]) {
        let dirs: Vec<PathBuf> = records.iter().map(|r| self.dir(&r.id)).collect();
        (self.quotas).adopt(dirs.iter().map(PathBuf::as_path).zip(records));
    }
}
