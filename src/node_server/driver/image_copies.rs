//! Copies of image volumes — snapshots, and the sources of clones — at one instant. Where an
//! image volume's filesystem is mounted, it is synced (so little is left to write), then
//! frozen (`FIFREEZE`: writes wait, the journal is clean) while its file is copied, and thawed
//! right after; the copy is a reflink where the state directory's filesystem shares extents,
//! so writers wait for a syncfs and a reflink, not for the data. A group's members are all
//! frozen before the first is copied and thawed after the last, so the group is write-order
//! consistent: a pod that wrote to one member and then to another never finds the second
//! write without the first. Where the state directory has no reflinks the copy is a full one
//! of what the file holds, and writers wait for it; the time they were held is logged.
//!
//! A frozen filesystem holds its writers until it is thawed: [`Frozen`] thaws when it drops,
//! on every path, and a start-up thaws what a crash left frozen ([`Driver::thaw_images`]):
//! only what node-server marked, never a filesystem an administrator froze (`fsfreeze`).

use std::fs::File;
use std::path::PathBuf;
use std::time::Instant;

use nix::errno::Errno;

use super::Driver;
use super::image::open_root;
use crate::linux::ext4_image;
use crate::node_server::state::volumes::{Record, VolumeError};

/// An image volume's filesystem, frozen until this drops; its mark says so until the thaw.
#[derive(Debug)]
pub struct Frozen {
    id: String,
    root: File,
    mark: PathBuf,
    since: Instant,
}

impl Frozen {
    /// When its freeze began: its writers have waited since.
    pub fn since(&self) -> Instant {
        self.since
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        match ext4_image::thaw(&self.root) {
            Ok(()) => log::debug!(
                "thawed the filesystem of volume {}: writers held {:?}",
                self.id,
                self.since.elapsed()
            ),
            Err(e) => {
                // The mark stays: the next start tries again.
                return log::error!(
                    "could not thaw the filesystem of volume {}: its writers wait: {e}",
                    self.id
                );
            }
        }
        if let Err(e) = std::fs::remove_file(&self.mark) {
            log::warn!("the freeze mark {} stays: {e}", self.mark.display());
        }
    }
}

impl Driver {
    /// Syncs, then freezes, the filesystem of each image volume of `records` that is mounted
    /// (the others need nothing: nothing writes to their files); they thaw as the guards drop.
    /// Every one is synced before the first freezes, and all freeze at once, so the freezes
    /// come close together. Each
    /// freeze is marked first (`<id>.frozen` beside its record; no sync, as a power cut thaws
    /// everything anyway), so that a start after a crash thaws what this froze, and nothing an
    /// administrator froze.
    pub(super) fn freeze_images(&self, records: &[Record]) -> Result<Vec<Frozen>, VolumeError> {
        let mut roots = Vec::new();
        for record in records.iter().filter(|r| r.is_image()) {
            if let Some(root) = self.mounted_root(record)? {
                nix::unistd::syncfs(&root).map_err(freeze_error(record, "sync"))?;
                roots.push((record.id.clone(), root));
            }
        }
        // Frozen side by side: each freeze writes back what its filesystem got since its
        // sync, and the writers of the first one frozen wait for the last.
        let freezes: Vec<Result<Frozen, VolumeError>> = std::thread::scope(|scope| {
            let threads: Vec<_> = (roots.into_iter())
                .map(|(id, root)| scope.spawn(|| self.freeze_one(id, root)))
                .collect();
            (threads.into_iter())
                .map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        // On an error the ones frozen thaw as they drop here.
        freezes.into_iter().collect()
    }

    /// Marks, then freezes, one image volume's filesystem.
    fn freeze_one(&self, id: String, root: File) -> Result<Frozen, VolumeError> {
        // Writers wait from the moment the freeze begins (it writes back first).
        let since = Instant::now();
        let mark = self.state_dir.volume_records().frozen_mark(&id);
        let marked = File::create(&mark).map_err(|source| VolumeError::Freeze {
            id: id.clone(),
            op: "mark the freeze of",
            source,
        });
        if let Err(e) = marked.and_then(|_| {
            ext4_image::freeze(&root).map_err(|source| VolumeError::Freeze {
                id: id.clone(),
                op: "freeze",
                source: source.into(),
            })
        }) {
            let _ = std::fs::remove_file(&mark);
            return Err(e);
        }
        Ok(Frozen {
            id,
            root,
            mark,
            since,
        })
    }

    /// The root of the image volume's filesystem where a mount of it shows it whole, opened
    /// and checked to be that filesystem's; `None` when it is not mounted.
    fn mounted_root(&self, record: &Record) -> Result<Option<File>, VolumeError> {
        let found = self
            .image_devices(record)
            .map_err(freeze_error_from(record))?;
        if found.ours.is_empty() {
            return Ok(None);
        }
        let devices: Vec<u64> = found.ours.iter().map(|s| s.device.rdev()).collect();
        let table = (self.mounter.mount_table()).map_err(freeze_error_from(record))?;
        let mut last = None;
        for entry in table.entries() {
            let dev = nix::libc::makedev(entry.dev.0, entry.dev.1);
            if !devices.contains(&dev) || entry.root.as_deref() != Some("/".as_ref()) {
                continue;
            }
            match open_root(&entry.mount_point, &found) {
                Ok(root) => return Ok(Some(root)),
                Err(e) => last = Some(e),
            }
        }
        match last {
            // Mounted, yet no mount of it could be opened as its root: a copy now would not
            // be of one instant.
            Some(e) => Err(freeze_error_from(record)(e)),
            None => Ok(None),
        }
    }

    /// Thaws the filesystem of each image volume whose freeze mark a crash left (a
    /// node-server killed between its freeze and its thaw leaves the filesystem frozen and
    /// its pod's writers waiting), and removes the mark; a filesystem no longer frozen (the
    /// node rebooted) answers EINVAL, which is fine. Run at start-up: one `stat` per image
    /// volume, and a look at the mounts only for a marked one.
    pub(super) fn thaw_images(&self) {
        let images = (self.volumes.records()).with_all(|all| {
            all.values()
                .filter(|r| r.is_image())
                .cloned()
                .collect::<Vec<_>>()
        });
        for record in images {
            let mark = self.state_dir.volume_records().frozen_mark(&record.id);
            if !mark.exists() {
                continue;
            }
            let thawed = match self.mounted_root(&record) {
                Ok(Some(root)) => match ext4_image::thaw(&root) {
                    Ok(()) => {
                        log::warn!(
                            "thawed the filesystem of volume {}, left frozen by a crash",
                            record.id
                        );
                        true
                    }
                    Err(Errno::EINVAL) => true,
                    Err(e) => {
                        log::error!("could not thaw volume {}: {e}", record.id);
                        false
                    }
                },
                Ok(None) => true,
                Err(e) => {
                    log::error!(
                        "could not find volume {}'s filesystem to thaw: {e}",
                        record.id
                    );
                    false
                }
            };
            if thawed && let Err(e) = std::fs::remove_file(&mark) {
                log::warn!("the freeze mark {} stays: {e}", mark.display());
            }
        }
    }
}

fn freeze_error<'a>(
    record: &'a Record,
    op: &'static str,
) -> impl FnOnce(Errno) -> VolumeError + 'a {
    move |source| VolumeError::Freeze {
        id: record.id.clone(),
        op,
        source: source.into(),
    }
}

fn freeze_error_from<E: std::fmt::Display>(record: &Record) -> impl Fn(E) -> VolumeError + '_ {
    move |e| VolumeError::Freeze {
        id: record.id.clone(),
        op: "find the mount to freeze of",
        source: std::io::Error::other(e.to_string()),
    }
}

/// How much of a file one unshare step copies: 16 MiB, a few milliseconds of I/O.
const UNSHARE_RANGE: i64 = 16 << 20;

/// Gives the file at `path` blocks of its own where a reflink shares them (a snapshot's copy
/// of an image, or a restored or cloned image), on a thread at idle I/O priority, so that
/// the live volume's writes never need a new block of the host filesystem: shared blocks are
/// copied on write, and a host filesystem full by then would fail the write (the pod's fsync
/// answered ENOSPC). It costs a copy of what the file holds, which `--capacity` counts
/// already. Until it is done, a host filesystem filled by something else can still fail
/// those writes.
pub(super) fn unshare_in_background(path: std::path::PathBuf, what: String) {
    let said = what.clone();
    let spawned = std::thread::Builder::new()
        .name("unshare".into())
        .spawn(move || {
            if let Err(e) = crate::linux::ioprio::idle_for_this_thread() {
                log::debug!("unsharing at normal priority: {e}");
            }
            let started = Instant::now();
            let unshared = File::options().write(true).open(&path).and_then(|file| {
                let len = i64::try_from(file.metadata()?.len()).unwrap_or(i64::MAX);
                let flags = nix::fcntl::FallocateFlags::FALLOC_FL_UNSHARE_RANGE;
                // A range at a time: the file's I/O lock is held for one range only, so
                // a restore or clone of it (a reflink, which takes that lock) waits for
                // one range, not for the whole copy.
                let mut at = 0;
                while at < len {
                    let range = UNSHARE_RANGE.min(len - at);
                    nix::fcntl::fallocate(&file, flags, at, range)?;
                    at += range;
                }
                file.sync_all()
            });
            match unshared {
                Ok(()) => log::info!(
                    "unshared {what} in {:?}: its blocks are its own",
                    started.elapsed()
                ),
                // Nothing shared, or a filesystem without reflinks: nothing to do.
                Err(e) if e.raw_os_error() == Some(nix::libc::EOPNOTSUPP) => {}
                Err(e) => log::warn!(
                    "could not unshare {what}: {e}; until its blocks are its own, a full host \
                     filesystem fails the volume's writes to blocks it shares"
                ),
            }
        });
    if let Err(e) = spawned {
        log::warn!("{said} stays shared: no thread to unshare it: {e}");
    }
}
