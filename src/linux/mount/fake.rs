//! A mounter that keeps its own mount table and records every call, for unit tests: binds
//! carry the flags they were given, as the kernel's mount would.

use std::path::PathBuf;
use std::sync::Mutex;

use crate::linux::mount_options::option_names;
use crate::linux::mountinfo::MountEntry;

use super::*;

#[derive(Debug, Default)]
pub struct RecordingMounter {
    pub table: Mutex<Vec<MountEntry>>,
    pub calls: Mutex<Vec<String>>,
}

impl RecordingMounter {
    /// A table holding one root filesystem, as every real process has.
    pub fn with_root() -> Self {
        let root = MountEntry {
            dev: (8, 1),
            root: Some(PathBuf::from("/")),
            mount_point: PathBuf::from("/"),
            options: vec!["rw".into()],
        };
        Self {
            table: Mutex::new(vec![root]),
            calls: Mutex::default(),
        }
    }

    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

/// A stand-in for a device and inode: the source's device and a hash of its path.
fn fake_shown(dev: (u32, u32), root: Option<&Path>) -> Shown {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    let ino = BuildHasherDefault::<DefaultHasher>::default().hash_one(root);
    Shown {
        dev: nix::libc::makedev(dev.0, dev.1),
        ino,
    }
}

impl Mounter for RecordingMounter {
    fn mount_table(&self) -> Result<MountTable, MountError> {
        Ok(MountTable::new(self.table.lock().unwrap().clone()))
    }

    fn mount_at(&self, path: &Path) -> Result<Option<Top>, MountError> {
        let table = self.mount_table()?;
        let position = table.entries().iter().rposition(|e| e.mount_point == path);
        Ok(position.map(|i| {
            let entry = &table.entries()[i];
            Top {
                mnt_id: i as u64,
                shows: fake_shown(entry.dev, entry.root.as_deref()),
                block_rdev: None,
                options: option_names().filter(|n| entry.has_option(n)).collect(),
            }
        }))
    }

    fn identity(&self, path: &Path) -> Result<Shown, MountError> {
        let source = self.mount_table()?.source_of(path).unwrap();
        Ok(fake_shown(source.dev, Some(&source.path)))
    }

    fn containing(&self, path: &Path) -> Result<Option<Containing>, MountError> {
        Ok(self.mount_table()?.containing(path).and_then(table_line))
    }

    fn bind(&self, source: &Path, target: &Path, options: MountOptions) -> Result<(), MountError> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("bind {} {}", source.display(), target.display()));
        let from = self.mount_table()?.source_of(source).unwrap();
        self.table.lock().unwrap().push(MountEntry {
            dev: from.dev,
            root: Some(from.path),
            mount_point: target.to_owned(),
            options: options.names().into_iter().map(String::from).collect(),
        });
        Ok(())
    }

    fn bind_file(&self, source: &Path, target: &Path, readonly: bool) -> Result<(), MountError> {
        self.calls.lock().unwrap().push(format!(
            "bind-file {} {}",
            source.display(),
            target.display()
        ));
        self.table.lock().unwrap().push(MountEntry {
            dev: (0, 6),
            root: Some(PathBuf::from("/").join(source.file_name().unwrap())),
            mount_point: target.to_owned(),
            options: (MountOptions {
                readonly,
                ..MountOptions::default()
            }
            .names()
            .into_iter())
            .map(String::from)
            .collect(),
        });
        Ok(())
    }

    /// Records the mount; `prepare` is not run (the fake has no filesystem to give it).
    fn mount_device(
        &self,
        device: &Path,
        _fstype: &CStr,
        target: &Path,
        options: MountOptions,
        context: Option<&SelinuxContext>,
        _prepare: &mut dyn FnMut(&File) -> std::io::Result<()>,
    ) -> Result<(), MountError> {
        let context = context.map_or(String::new(), |c| format!(" context={}", c.label()));
        self.calls.lock().unwrap().push(format!(
            "mount-device {} {}{context}",
            device.display(),
            target.display()
        ));
        self.table.lock().unwrap().push(MountEntry {
            dev: (7, 0),
            root: Some(PathBuf::from("/")),
            mount_point: target.to_owned(),
            options: options.names().into_iter().map(String::from).collect(),
        });
        Ok(())
    }

    fn unmount(&self, target: &Path, checked: &Top) -> Result<(), MountError> {
        if self.mount_at(target)?.as_ref() != Some(checked) {
            return Err(PathIoError::at("unmount", target)(std::io::Error::other(
                "the mount there changed since it was checked",
            )));
        }
        self.calls
            .lock()
            .unwrap()
            .push(format!("unmount {}", target.display()));
        let mut table = self.table.lock().unwrap();
        match table.iter().rposition(|e| e.mount_point == target) {
            Some(i) => {
                table.remove(i);
                Ok(())
            }
            None => Err(PathIoError::at("unmount", target)(
                std::io::Error::from_raw_os_error(nix::libc::EINVAL),
            )),
        }
    }
}
