//! Mount syscalls behind a small trait: the real Linux implementation (bind mounts through
//! `O_PATH` descriptors, read-only and other per-mount flags by remount), and a recording fake
//! that lets the publish logic be unit-tested without root.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::mount::{MntFlags, MsFlags};
use nix::sys::statvfs::FsFlags;

use std::path::PathBuf;

use crate::linux::mountinfo::MountTable;
use crate::linux::mountpoint::{self, Shown, Top};
use crate::linux::statmount::{self, Containing};

/// A failed mount operation, naming what was attempted and on which path.
#[derive(Debug, thiserror::Error)]
#[error("{op} {}: {source}", path.display())]
pub struct MountError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// `map_err(err("unmount", path))`: an I/O error with its operation and path.
pub fn err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> MountError + 'a {
    move |source| MountError {
        op,
        path: path.to_owned(),
        source,
    }
}

/// Mount flags from a request that a bind mount cannot honour.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    #[error(
        "mount flag {0:?} is not supported: volumes are bind mounts, which take only ro, rw, \
         nosuid, nodev, noexec, noatime and nodiratime"
    )]
    Unsupported(String),
    #[error("mount flags ask for both ro and rw")]
    Conflicting,
}

/// Per-mount flags a CSI request may ask for. Only flags that a bind mount can carry are
/// accepted: filesystem options (`discard`, `size=`) would be silently meaningless on a bind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MountOptions {
    pub readonly: bool,
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
    pub noatime: bool,
    pub nodiratime: bool,
}

impl MountOptions {
    /// Parses a capability's `mount_flags`; `readonly` comes from the request.
    pub fn parse(flags: &[String], readonly: bool) -> Result<Self, OptionsError> {
        let mut options = Self {
            readonly,
            ..Self::default()
        };
        let mut rw = false;
        for flag in flags {
            match flag.as_str() {
                "ro" => options.readonly = true,
                "rw" => rw = true,
                "nosuid" => options.nosuid = true,
                "nodev" => options.nodev = true,
                "noexec" => options.noexec = true,
                "noatime" => options.noatime = true,
                "nodiratime" => options.nodiratime = true,
                // The defaults of a fresh bind mount; asking for them changes nothing.
                "defaults" | "bind" | "suid" | "dev" | "exec" | "atime" | "diratime"
                | "relatime" => {}
                other => return Err(OptionsError::Unsupported(other.to_owned())),
            }
        }
        if rw && options.readonly {
            return Err(OptionsError::Conflicting);
        }
        Ok(options)
    }

    /// A plain bind mount already has every default; anything else needs a remount.
    pub fn needs_remount(&self) -> bool {
        *self != Self::default()
    }

    /// Whether an existing mount carries exactly the read-only state and at least the flags
    /// asked for: the CSI notion of a "compatible" repeated publish.
    pub fn satisfied_by(&self, entry: &Top) -> bool {
        entry.is_readonly() == self.readonly
            && [
                (self.nosuid, "nosuid"),
                (self.nodev, "nodev"),
                (self.noexec, "noexec"),
                (self.noatime, "noatime"),
                (self.nodiratime, "nodiratime"),
            ]
            .iter()
            .all(|&(wanted, name)| !wanted || entry.has_option(name))
    }

    fn ms_flags(&self) -> MsFlags {
        let mut flags = MsFlags::empty();
        for (on, flag) in [
            (self.readonly, MsFlags::MS_RDONLY),
            (self.nosuid, MsFlags::MS_NOSUID),
            (self.nodev, MsFlags::MS_NODEV),
            (self.noexec, MsFlags::MS_NOEXEC),
            (self.noatime, MsFlags::MS_NOATIME),
            (self.nodiratime, MsFlags::MS_NODIRATIME),
        ] {
            if on {
                flags |= flag;
            }
        }
        flags
    }
}

/// The mount operations the node service needs. Implementations must be callable from many
/// threads at once; every call blocks.
pub trait Mounter: Send + Sync {
    /// The current mount table of this process: every mount, read in time linear in their
    /// number. Only for questions about every mount (see [`mountpoint`] for why).
    fn mount_table(&self) -> Result<MountTable, MountError>;
    /// The topmost mount at `path` if `path` is a mount point, asked of that path alone.
    fn mount_at(&self, path: &Path) -> Result<Option<Top>, MountError>;
    /// What a mount of `path` shows: its device and inode (a symlink is not followed).
    fn identity(&self, path: &Path) -> Result<Shown, MountError>;
    /// The mount the existing path `path` lies in, asked of that mount alone where the kernel
    /// can (`None`: no mount in the table holds it).
    fn containing(&self, path: &Path) -> Result<Option<Containing>, MountError>;
    /// Bind-mounts directory `source` on directory `target` with `options`; on failure
    /// nothing stays mounted.
    fn bind(&self, source: &Path, target: &Path, options: MountOptions) -> Result<(), MountError>;
    /// Bind-mounts the device node (or other non-directory) `source` on the regular file
    /// `target`, read-only if asked; on failure nothing stays mounted.
    fn bind_file(&self, source: &Path, target: &Path, readonly: bool) -> Result<(), MountError>;
    /// Unmounts the topmost mount at `target`.
    fn unmount(&self, target: &Path) -> Result<(), MountError>;
}

/// The real thing: `mount(2)` and `umount2(2)`.
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxMounter;

/// Opens a directory without following a symlink in its last component; mounting through
/// the descriptor means a path swapped for a symlink after our checks cannot redirect the
/// mount elsewhere.
fn open_dir(path: &Path) -> std::io::Result<File> {
    use nix::libc::{O_CLOEXEC, O_DIRECTORY, O_NOFOLLOW, O_PATH};
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(O_PATH | O_NOFOLLOW | O_DIRECTORY | O_CLOEXEC)
        .open(path)
}

/// Opens a file that is not a directory, as [`open_dir`] opens directories.
fn open_file(path: &Path) -> std::io::Result<File> {
    use nix::libc::{O_CLOEXEC, O_NOFOLLOW, O_PATH};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(O_PATH | O_NOFOLLOW | O_CLOEXEC)
        .open(path)?;
    if file.metadata()?.is_dir() {
        return Err(std::io::Error::from_raw_os_error(nix::libc::EISDIR));
    }
    Ok(file)
}

fn fd_path(file: &File) -> String {
    format!("/proc/self/fd/{}", file.as_raw_fd())
}

/// Per-mount flags of the mount `dir` is the root of, so a remount keeps them: clearing a
/// flag the parent mount was given (say `nodev`) is not ours to do.
fn kept_flags(dir: &File) -> nix::Result<MsFlags> {
    let flags = nix::sys::statvfs::fstatvfs(dir)?.flags();
    let mut kept = MsFlags::empty();
    for (fs, ms) in [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if flags.contains(fs) {
            kept |= ms;
        }
    }
    Ok(kept)
}

/// Bind-mounts what `from` is open on onto what `onto` is open on, through their
/// `/proc/self/fd` paths, so neither path can be swapped for a symlink in between.
fn bind_opened(from: &File, onto: &File, target: &Path) -> Result<(), MountError> {
    nix::mount::mount(
        Some(fd_path(from).as_str()),
        fd_path(onto).as_str(),
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| err("bind-mount onto", target)(e.into()))
}

impl LinuxMounter {
    /// A remount that failed leaves the plain bind mount at `target`: it is undone, and the
    /// remount's error is the one reported.
    fn undo_if_failed(
        &self,
        target: &Path,
        remounted: Result<(), MountError>,
    ) -> Result<(), MountError> {
        remounted.inspect_err(|_| {
            if let Err(e) = self.unmount(target) {
                log::error!("could not undo the bind mount after a failed remount: {e}");
            }
        })
    }
}

impl Mounter for LinuxMounter {
    fn mount_table(&self) -> Result<MountTable, MountError> {
        MountTable::read().map_err(err("read mount table", Path::new("/proc/self/mountinfo")))
    }

    fn mount_at(&self, path: &Path) -> Result<Option<Top>, MountError> {
        // The table is read only where statx cannot say (kernels before 5.8).
        let in_table = || Ok(MountTable::read()?.mounted_at(path).is_some());
        mountpoint::top_at(path, in_table).map_err(err("inspect mount point", path))
    }

    fn identity(&self, path: &Path) -> Result<Shown, MountError> {
        mountpoint::shown(path).map_err(err("inspect", path))
    }

    fn containing(&self, path: &Path) -> Result<Option<Containing>, MountError> {
        match statmount::containing(path).map_err(err("inspect the mount of", path))? {
            Some(found) => Ok(Some(found)),
            // Kernels before 6.8.
            None => Ok(self.mount_table()?.containing(path).and_then(table_line)),
        }
    }

    fn bind(&self, source: &Path, target: &Path, options: MountOptions) -> Result<(), MountError> {
        let from = open_dir(source).map_err(err("open bind source", source))?;
        let onto = open_dir(target).map_err(err("open mount target", target))?;
        bind_opened(&from, &onto, target)?;
        if !options.needs_remount() {
            return Ok(());
        }
        // A bind mount ignores flags given with it; they take effect only by remounting.
        let remount = || -> Result<(), MountError> {
            let mounted = open_dir(target).map_err(err("open new mount", target))?;
            let kept =
                kept_flags(&mounted).map_err(|e| err("inspect new mount", target)(e.into()))?;
            nix::mount::mount(
                None::<&str>,
                fd_path(&mounted).as_str(),
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | kept | options.ms_flags(),
                None::<&str>,
            )
            .map_err(|e| err("remount with flags", target)(e.into()))
        };
        self.undo_if_failed(target, remount())
    }

    fn bind_file(&self, source: &Path, target: &Path, readonly: bool) -> Result<(), MountError> {
        let from = open_file(source).map_err(err("open bind source", source))?;
        let onto = open_file(target).map_err(err("open mount target", target))?;
        bind_opened(&from, &onto, target)?;
        if !readonly {
            return Ok(());
        }
        let remount = || -> Result<(), MountError> {
            let mounted = open_file(target).map_err(err("open new mount", target))?;
            nix::mount::mount(
                None::<&str>,
                fd_path(&mounted).as_str(),
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
                None::<&str>,
            )
            .map_err(|e| err("remount read-only", target)(e.into()))
        };
        self.undo_if_failed(target, remount())
    }

    fn unmount(&self, target: &Path) -> Result<(), MountError> {
        nix::mount::umount2(target, MntFlags::UMOUNT_NOFOLLOW)
            .map_err(|e| err("unmount", target)(e.into()))
    }
}

/// A mount table line as [`Containing`] (`None` for a root that is not a path).
fn table_line(entry: &crate::linux::mountinfo::MountEntry) -> Option<Containing> {
    Some(Containing {
        dev: entry.dev,
        root: entry.root.clone()?,
        mount_point: entry.mount_point.clone(),
    })
}

/// A mounter that keeps its own mount table and records every call, for unit tests.
#[cfg(test)]
pub mod fake {
    use std::sync::Mutex;

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
                let names = [
                    "ro",
                    "rw",
                    "nosuid",
                    "nodev",
                    "noexec",
                    "noatime",
                    "nodiratime",
                ];
                Top {
                    mnt_id: i as u64,
                    shows: fake_shown(entry.dev, entry.root.as_deref()),
                    block_rdev: None,
                    options: names.into_iter().filter(|n| entry.has_option(n)).collect(),
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

        fn bind(
            &self,
            source: &Path,
            target: &Path,
            options: MountOptions,
        ) -> Result<(), MountError> {
            self.calls.lock().unwrap().push(format!(
                "bind {} {}",
                source.display(),
                target.display()
            ));
            let from = self.mount_table()?.source_of(source).unwrap();
            let mut flags = vec![if options.readonly { "ro" } else { "rw" }.to_owned()];
            if options.nosuid {
                flags.push("nosuid".into());
            }
            self.table.lock().unwrap().push(MountEntry {
                dev: from.dev,
                root: Some(from.path),
                mount_point: target.to_owned(),
                options: flags,
            });
            Ok(())
        }

        fn bind_file(
            &self,
            source: &Path,
            target: &Path,
            readonly: bool,
        ) -> Result<(), MountError> {
            self.calls.lock().unwrap().push(format!(
                "bind-file {} {}",
                source.display(),
                target.display()
            ));
            self.table.lock().unwrap().push(MountEntry {
                dev: (0, 6),
                root: Some(PathBuf::from("/").join(source.file_name().unwrap())),
                mount_point: target.to_owned(),
                options: vec![if readonly { "ro" } else { "rw" }.to_owned()],
            });
            Ok(())
        }

        fn unmount(&self, target: &Path) -> Result<(), MountError> {
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
                None => Err(err("unmount", target)(std::io::Error::from_raw_os_error(
                    nix::libc::EINVAL,
                ))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn bind_compatible_flags_are_accepted_and_others_refused_by_name() {
        let options =
            MountOptions::parse(&flags(&["nosuid", "noexec", "relatime"]), false).unwrap();
        assert!(options.nosuid && options.noexec && !options.readonly);
        assert!(
            MountOptions::parse(&flags(&["ro"]), false)
                .unwrap()
                .readonly
        );
        let err = MountOptions::parse(&flags(&["discard"]), false).unwrap_err();
        assert!(err.to_string().contains("\"discard\""), "{err}");
        assert!(MountOptions::parse(&flags(&["ro", "rw"]), false).is_err());
        assert!(MountOptions::parse(&flags(&["rw"]), true).is_err());
    }

    /// What the kubelet would send if the CSIDriver said `seLinuxMount: true`: a bind mount
    /// shares its filesystem's label, so it cannot take one of its own.
    #[test]
    fn an_selinux_context_mount_flag_is_refused_since_a_bind_mount_has_its_filesystems_label() {
        let context = "context=\"system_u:object_r:container_file_t:s0:c12,c34\"";
        let err = MountOptions::parse(&flags(&[context]), false).unwrap_err();
        assert!(
            matches!(&err, OptionsError::Unsupported(f) if f == context),
            "{err}"
        );
    }

    #[test]
    fn only_non_default_options_need_a_remount() {
        assert!(
            !MountOptions::parse(&flags(&["defaults", "rw"]), false)
                .unwrap()
                .needs_remount()
        );
        assert!(MountOptions::parse(&[], true).unwrap().needs_remount());
    }

    #[test]
    fn an_existing_mount_satisfies_a_request_only_with_the_same_read_only_state() {
        let entry = |options: &[&'static str]| Top {
            mnt_id: 1,
            shows: Shown { dev: 1, ino: 2 },
            block_rdev: None,
            options: options.to_vec(),
        };
        let ro = MountOptions::parse(&[], true).unwrap();
        let rw = MountOptions::default();
        assert!(ro.satisfied_by(&entry(&["ro", "relatime"])));
        assert!(!ro.satisfied_by(&entry(&["rw"])));
        assert!(!rw.satisfied_by(&entry(&["ro"])));
        let nosuid = MountOptions::parse(&flags(&["nosuid"]), false).unwrap();
        assert!(nosuid.satisfied_by(&entry(&["rw", "nosuid", "nodev"])));
        assert!(!nosuid.satisfied_by(&entry(&["rw"])));
    }
}
