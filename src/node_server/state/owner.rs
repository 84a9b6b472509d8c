//! One node-server per state directory: an exclusive `flock` on the state directory itself,
//! then one on `<state-dir>/node-server.lock`, taken before anything in the directory is read
//! or cleaned and held until the driver is dropped (for a process, its whole life: the kernel
//! releases them at exit, even SIGKILL).
//!
//! Two instances on one directory (a DaemonSet rolled with surge, two DaemonSets on one
//! hostPath, an operator's second copy) would otherwise clean up each other's copies in
//! progress and give one volume name two IDs. `flock` rather than `fcntl` locks: it belongs to
//! the open file, not the process, so a second `open` in the same process is refused too (the
//! in-process tests rely on it), and a waiter blocked in `flock` wakes as soon as it is free.
//!
//! Why two locks. A lock file can be unlinked or replaced while it is held (`rm`, `mv`, a
//! clean-up script): the next instance then locks a new file and serves beside the holder.
//! The directory cannot be: replacing it means moving every file of the holder's along with it,
//! so whoever holds the directory's lock holds what is in it. The file lock stays for versions
//! before this one, which lock only the file: during a rollout the two generations still
//! exclude each other. It is checked by inode after each `flock` (a file no longer at the path
//! is no lock) and taken again from the file that is.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::lock_file;
use crate::path_io::PathIoError;

use super::state_dir::StateDir;

/// The locks on a state directory; released when dropped.
#[derive(Debug)]
pub struct Owner {
    state_dir: StateDir,
    _directory: Flock<File>,
    _file: Flock<File>,
}

/// Why the state directory could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    #[error("state directory {} is in use by another node-server ({holder})", dir.display())]
    Busy { dir: PathBuf, holder: String },
    #[error(transparent)]
    Io(#[from] PathIoError),
}

impl Owner {
    /// Takes the locks if they are free.
    pub fn try_take(state_dir: &StateDir) -> Result<Self, OwnerError> {
        Self::take(state_dir, FlockArg::LockExclusiveNonblock)
    }

    /// Waits for the locks (blocking the thread) and takes them.
    pub fn wait(state_dir: &StateDir) -> Result<Self, OwnerError> {
        Self::take(state_dir, FlockArg::LockExclusive)
    }

    fn take(state_dir: &StateDir, how: FlockArg) -> Result<Self, OwnerError> {
        let root = state_dir.root();
        let directory = open_directory(root).map_err(PathIoError::at("open", root))?;
        let busy = |holder| OwnerError::Busy {
            dir: root.to_owned(),
            holder,
        };
        let directory = match Flock::lock(directory, how) {
            Ok(lock) => lock,
            Err((_, Errno::EWOULDBLOCK)) => return Err(busy(signature(state_dir))),
            Err((_, errno)) => return Err(PathIoError::at("lock", root)(errno.into()).into()),
        };
        let file = match lock_file_at(&state_dir.owner_lock(), how)? {
            lock_file::Lock::Taken(lock) => lock,
            lock_file::Lock::Held(holder) => return Err(busy(holder)),
        };
        Ok(Self {
            state_dir: state_dir.clone(),
            _directory: directory,
            _file: file,
        })
    }

    /// The directory this lock is on.
    pub fn state_dir(&self) -> &StateDir {
        &self.state_dir
    }
}

fn open_directory(path: &Path) -> std::io::Result<File> {
    use nix::libc::{O_CLOEXEC, O_DIRECTORY, O_NOFOLLOW};
    (std::fs::OpenOptions::new().read(true))
        .custom_flags(O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        .open(path)
}

/// Symbolic links removed from the lock file's path before giving up: each is a neighbour
/// putting one back at once.
const LINK_TRIES: usize = 100;

/// The lock on the file at `path` ([`lock_file::take`]), or who holds it. Taken under the
/// directory's lock, so the path is ours to mend: a symbolic link put there is removed (never
/// followed) and a file made.
fn lock_file_at(path: &Path, how: FlockArg) -> Result<lock_file::Lock, OwnerError> {
    for _ in 0..LINK_TRIES {
        match lock_file::take(path, how) {
            Err(e) if e.source.raw_os_error() == Some(nix::libc::ELOOP) => {
                log::warn!("{} was a symbolic link; removed", path.display());
                crate::linux::resolve::remove(path, false)
                    .map_err(PathIoError::at("remove symbolic link", path))?;
            }
            taken => return Ok(taken?),
        }
    }
    let replaced = std::io::Error::other("a symbolic link put back at every try");
    Err(PathIoError::new("lock", path, replaced).into())
}

/// Who holds the directory, as the holder signed its lock file.
fn signature(state_dir: &StateDir) -> String {
    match lock_file::open(&state_dir.owner_lock()) {
        Ok(mut file) => lock_file::holder(&mut file),
        Err(_) => "holder unknown".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_owner_is_refused_and_told_who_holds_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        let first = Owner::try_take(&state).unwrap();
        let err = Owner::try_take(&state).unwrap_err();
        let OwnerError::Busy { holder, .. } = &err else {
            panic!("{err}")
        };
        assert!(
            holder.starts_with(&format!("pid {} on ", std::process::id())),
            "{holder}"
        );
        drop(first);
        Owner::try_take(&state).expect("free again once the first is dropped");
    }

    #[test]
    fn the_lock_file_is_private_whatever_it_says() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        let _owner = Owner::try_take(&state).unwrap();
        let mode = std::fs::metadata(state.owner_lock()).unwrap().permissions();
        assert_eq!(mode.mode() & 0o777, 0o600);
    }
}
