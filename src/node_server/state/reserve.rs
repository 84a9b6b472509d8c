//! Room kept on the state directory's filesystem for node-server's own records: a file of
//! [`RESERVE_BYTES`] allocated at start (`<state-dir>/reserve`), given up (removed: its blocks
//! and its inode) when a record write meets ENOSPC. A full filesystem must not stop DeleteVolume, the one call that frees it, and
//! DeleteVolume first writes its `deleting` mark (a record). XFS keeps no blocks for root, so
//! without this a pod that filled the filesystem (a volume without a limit, a file moved out of
//! its project) made every volume on it undeletable. The reserve is taken again by the next
//! record written once there is room.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The reserve's name in the state directory.
pub const RESERVE: &str = "reserve";

/// What the reserve holds: room for a few hundred records.
pub const RESERVE_BYTES: u64 = 1 << 20;

/// Whether the reserve was given up and not taken again yet.
static GIVEN_UP: AtomicBool = AtomicBool::new(false);

/// The reserve of the state directory whose record directory holds `record`: record
/// directories lie directly in the state directory.
fn beside(record: &Path) -> Option<PathBuf> {
    Some(record.parent()?.parent()?.join(RESERVE))
}

/// Allocates the reserve at `path` (blocks, not a sparse file); a failure is logged, not
/// fatal: node-server works without it as before.
pub fn take(path: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    let taken = (std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false))
    .mode(0o600)
    .open(path)
    .and_then(|file| {
        let len = RESERVE_BYTES as i64;
        nix::fcntl::fallocate(&file, nix::fcntl::FallocateFlags::empty(), 0, len)?;
        Ok(())
    });
    match taken {
        Ok(()) => GIVEN_UP.store(false, Ordering::Relaxed),
        Err(e) => log::warn!(
            "no room kept for records at {} ({e}): a full filesystem would stop DeleteVolume",
            path.display()
        ),
    }
}

/// Frees the reserve beside `record` for the write that met ENOSPC, blocks and inode; whether
/// it held anything.
pub fn give_up(record: &Path) -> bool {
    let Some(path) = beside(record) else {
        return false;
    };
    // Removed, not truncated: a filesystem can run out of inodes as well as blocks (a pod's
    // flood of empty files), and the record's temporary file needs one of each.
    let held = std::fs::symlink_metadata(&path).is_ok_and(|meta| meta.is_file());
    if held && std::fs::remove_file(&path).is_ok() {
        GIVEN_UP.store(true, Ordering::Relaxed);
        log::warn!(
            "the state directory's filesystem is full: gave up the {RESERVE_BYTES}-byte \
             reserve at {} to write {}",
            path.display(),
            record.display()
        );
        return true;
    }
    false
}

/// Takes the reserve again after a record was written, if it was given up.
pub fn retake(record: &Path) {
    if GIVEN_UP.load(Ordering::Relaxed)
        && let Some(path) = beside(record)
    {
        take(&path);
    }
}
