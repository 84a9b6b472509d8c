//! One node-server per state directory: an exclusive `flock` on `<state-dir>/node-server.lock`,
//! taken before anything in the directory is read or cleaned and held until the driver is
//! dropped (for a process, its whole life: the kernel releases it at exit, even SIGKILL).
//!
//! Two instances on one directory (a DaemonSet rolled with surge, two DaemonSets on one
//! hostPath, an operator's second copy) would otherwise clean up each other's copies in
//! progress and give one volume name two IDs. `flock` rather than `fcntl` locks: it belongs to
//! the open file, not the process, so a second `open` in the same process is refused too (the
//! in-process tests rely on it), and a waiter blocked in `flock` wakes as soon as it is free.

use std::fs::File;
use std::path::PathBuf;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::lock_file;
use crate::path_io::PathIoError;

use super::state_dir::StateDir;

/// The lock on a state directory; released when dropped.
#[derive(Debug)]
pub struct Owner {
    state_dir: StateDir,
    _lock: Flock<File>,
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
    /// Takes the lock if it is free.
    pub fn try_take(state_dir: &StateDir) -> Result<Self, OwnerError> {
        Self::take(state_dir, FlockArg::LockExclusiveNonblock)
    }

    /// Waits for the lock (blocking the thread) and takes it.
    pub fn wait(state_dir: &StateDir) -> Result<Self, OwnerError> {
        Self::take(state_dir, FlockArg::LockExclusive)
    }

    fn take(state_dir: &StateDir, how: FlockArg) -> Result<Self, OwnerError> {
        let path = state_dir.owner_lock();
        let file = lock_file::open(&path).map_err(PathIoError::at("open lock file", &path))?;
        let mut lock = match Flock::lock(file, how) {
            Ok(lock) => lock,
            Err((mut file, Errno::EWOULDBLOCK)) => {
                return Err(OwnerError::Busy {
                    dir: state_dir.root().to_owned(),
                    holder: lock_file::holder(&mut file),
                });
            }
            Err((_, errno)) => return Err(PathIoError::at("lock", &path)(errno.into()).into()),
        };
        lock_file::sign(&mut lock).map_err(PathIoError::at("write lock file", &path))?;
        Ok(Self {
            state_dir: state_dir.clone(),
            _lock: lock,
        })
    }

    /// The directory this lock is on.
    pub fn state_dir(&self) -> &StateDir {
        &self.state_dir
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
