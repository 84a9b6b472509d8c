//! Escapes found as they are written: the quota patrol's walks find a file moved out of its
//! volume's project only at their next pass, and until then the pod writes outside its size
//! at its own speed. A watch of the state directory's filesystem ([`WriteWatch`]) reports each
//! file as it is written; one inside a volume and out of its project is set back at once, and
//! begins the volume's episode (so a pod that does it again is fenced). The walks stay:
//! they find what the watch cannot see (directories, symlinks and FIFOs, which are not
//! written, and whatever happened while the watch's queue overflowed).

use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;
use std::time::Duration;

use super::Driver;
use super::quota_patrol::Stop;
use crate::linux::quota::escape::QUARANTINE_UID;
use crate::linux::quota::escape_walk;
use crate::linux::quota::write_watch::WriteWatch;

/// How long the watch lets writes gather between looks: a pod's escaped file writes this long
/// at most before it is set back, and a busy file's writes in this time are one event.
pub const WATCH_PAUSE: Duration = Duration::from_millis(50);

/// Watches while any volume is a directory held by a project quota, until `stop`: every
/// writer on the filesystem pays for the watch (a few hundred nanoseconds a write), so it is
/// there only while it guards something.
pub(super) fn run(driver: &Driver, stop: &Stop) {
    // The state directory is resolved once, at start: written paths come back resolved too.
    let Some(volumes) = driver.volumes.path_of("x").parent().map(Path::to_path_buf) else {
        return;
    };
    let (mut watch, mut said, mut looks) = (None, false, 0u32);
    while !stop.wait(WATCH_PAUSE) {
        // Once a second: is there anything to guard?
        if looks.is_multiple_of(20) {
            let guarding = driver
                .volumes
                .records()
                .with_all(|all| all.values().any(|r| r.project_id.is_some() && !r.block));
            if !guarding {
                watch = None;
            } else if watch.is_none() {
                match WriteWatch::new(&volumes) {
                    Ok(new) => watch = Some(new),
                    Err(e) if !said => {
                        said = true;
                        log::warn!("writes are not watched, escapes are found by passes: {e}");
                    }
                    Err(_) => {}
                }
            }
        }
        looks = looks.wrapping_add(1);
        if let Some(watch) = watch.as_mut() {
            look(driver, watch, &volumes);
        }
    }
}

/// One look: every file written since the last, in a volume and out of its project, set back.
fn look(driver: &Driver, watch: &mut WriteWatch, volumes: &Path) {
    // A full queue (`Ok(true)`) dropped writes: the passes find what they were.
    if let Err(e) = watch.written(&mut |inode| check(driver, inode, volumes)) {
        log::debug!("write watch: {e}");
    }
}

/// One written inode: set back if it is a volume's and out of the volume's project.
fn check(driver: &Driver, inode: BorrowedFd<'_>, volumes: &Path) {
    let link = format!("/proc/self/fd/{}", inode.as_raw_fd());
    let Ok(path) = std::fs::read_link(&link) else {
        return;
    };
    let Some(id) = volume_of(&path, volumes) else {
        return;
    };
    // Its project alone: no copy of the record for each file written.
    let project = driver.volumes.records().with_all(|all| {
        let record = all.get(id)?;
        record.project_id.filter(|_| !record.block)
    });
    let Some(project) = project else {
        return;
    };
    let fence = driver.escapes.fenced(id).then_some(QUARANTINE_UID);
    let Ok(tally) = escape_walk::check_file(inode, project, fence) else {
        return;
    };
    if tally.found() {
        // Not a walk: what else the same escape moved out (the directory the file was made
        // in) the next walk finds, and that is no repeat. A repeat is a new episode after
        // this one ends, or a second walk that finds more in it.
        let note = driver.escapes.record(id, project, &tally, false);
        driver.say(id, project, &tally, note);
    }
}

/// The volume ID of a path under the volumes' directory (none for anything else, and for the
/// walk's own private directories).
fn volume_of<'a>(path: &'a Path, volumes: &Path) -> Option<&'a str> {
    let first = path.strip_prefix(volumes).ok()?.components().next()?;
    let id = first.as_os_str().to_str()?;
    (!id.starts_with('.')).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_path_belongs_to_the_volume_it_is_under_and_to_nothing_elsewhere() {
        let volumes = Path::new("/var/lib/csi/volumes");
        let of = |p: &'static str| volume_of(Path::new(p), volumes);
        assert_eq!(of("/var/lib/csi/volumes/vol-1/a/b/file"), Some("vol-1"));
        assert_eq!(of("/var/lib/csi/volumes/vol-1"), Some("vol-1"));
        assert_eq!(of("/var/lib/csi/volumes/.orphan-remake-vol-1/x"), None);
        assert_eq!(of("/var/lib/csi/volumes-other/vol-1/x"), None);
        assert_eq!(of("/var/log/syslog"), None);
        assert_eq!(of("/var/lib/csi/volumes/vol-1/f (deleted)"), Some("vol-1"));
    }
}
