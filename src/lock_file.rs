//! Lock files that say who holds them: opened without following a link, root-only, and signed
//! by the holder with its pid and host name, so a second process waiting on the `flock` can
//! log whom it waits for. In a pod the host name is the pod's name, and every container's pid
//! is 1. [`take`] is the one way to lock one (the socket claim's and node-server's owner
//! lock): checked by inode once locked, since a file unlinked or replaced meanwhile is no lock.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::path_io::PathIoError;

/// What trying to lock a lock file gave.
#[derive(Debug)]
pub enum Lock {
    /// Locked, and signed by this process.
    Taken(Flock<File>),
    /// Another process holds it; what it signed.
    Held(String),
}

/// Locks the lock file at `path` (waiting for it or not, as `how` says) and signs it. A file
/// that is no longer at the path once locked (its holder removed it before letting go, or a
/// neighbour unlinked or replaced it meanwhile) is no lock: the file now at the path is
/// locked instead.
pub fn take(path: &Path, how: FlockArg) -> Result<Lock, PathIoError> {
    loop {
        let file = open(path).map_err(PathIoError::at("open lock file", path))?;
        let mut lock = match Flock::lock(file, how) {
            Ok(lock) => lock,
            Err((mut file, Errno::EWOULDBLOCK)) => return Ok(Lock::Held(holder(&mut file))),
            Err((_, errno)) => return Err(PathIoError::errno_at("lock", path)(errno)),
        };
        if !still_at(path, &lock) {
            continue;
        }
        sign(&mut lock).map_err(PathIoError::at("write lock file", path))?;
        return Ok(Lock::Taken(lock));
    }
}

/// Opens (creating, 0600) the lock file at `path`, never through a symlink.
pub fn open(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Whether `path` still names the open file `file` (by device and inode): a lock file that was
/// unlinked or replaced while it was locked is no lock any more.
pub fn still_at(path: &Path, file: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::symlink_metadata(path), file.metadata()) {
        (Ok(at_path), Ok(open)) => at_path.dev() == open.dev() && at_path.ino() == open.ino(),
        _ => false,
    }
}

/// Writes this process's signature into the lock file it now holds.
pub fn sign(file: &mut File) -> io::Result<()> {
    let me = format!("pid {} on {}", std::process::id(), host_name());
    file.set_len(0)?;
    file.rewind()?;
    file.write_all(me.as_bytes())
}

/// What the holder wrote into the lock file (bounded, control characters replaced: another
/// process wrote it).
pub fn holder(file: &mut File) -> String {
    let mut text = String::new();
    let _ = file.take(200).read_to_string(&mut text);
    match text.trim() {
        "" => "holder unknown".to_owned(),
        text => text.replace(|c: char| c.is_control(), "?"),
    }
}

fn host_name() -> String {
    crate::node_name::host_name().unwrap_or_else(|_| "an unknown host".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_lock_file_names_this_process_and_an_empty_one_an_unknown_holder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let mut file = open(&path).unwrap();
        assert_eq!(holder(&mut open(&path).unwrap()), "holder unknown");
        sign(&mut file).unwrap();
        let named = holder(&mut open(&path).unwrap());
        assert!(
            named.starts_with(&format!("pid {} on ", std::process::id())),
            "{named}"
        );
    }
}
