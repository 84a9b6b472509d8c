//! One server per socket path among processes that may all serve it (two registrar generations
//! in a surge rollout, an operator's extra copy): an exclusive `flock` on `<socket>.lock` beside
//! the socket, taken before the stale check and the unlink and held while the socket is served.
//!
//! Without it, two waiters that both see a stale socket both unlink and bind: one ends up
//! serving an unlinked socket nobody can dial, or removes the other's live one. With it, only
//! the holder looks at the path; a waiter blocked in `flock` wakes the moment the holder's file
//! is closed, which the kernel does at exit, SIGKILL included.
//!
//! The holder removes the lock file while it still holds the lock (so no file is left behind),
//! and a waiter that wakes on a file no longer at the path opens the path again: whoever holds
//! the file that is at the path holds the claim.

use std::fs::File;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::lock_file;

use super::SocketError;
use crate::path_io::PathIoError;

/// What the lock file of a socket adds to the socket's file name.
pub const LOCK_SUFFIX: &str = ".lock";

/// The lock file of the socket at `socket`: `<socket>.lock`, in the same directory.
pub fn lock_path(socket: &Path) -> PathBuf {
    let mut name = socket.as_os_str().to_owned();
    name.push(LOCK_SUFFIX);
    PathBuf::from(name)
}

/// The exclusive right to serve one socket path; released when dropped.
#[derive(Debug)]
pub struct Claim {
    path: PathBuf,
    lock: Flock<File>,
}

/// Another process holds the claim; what it wrote into the lock file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub holder: String,
}

impl Claim {
    /// Takes the claim on `socket` if it is free.
    pub fn try_take(socket: &Path) -> Result<Result<Self, Held>, SocketError> {
        Self::take(socket, FlockArg::LockExclusiveNonblock)
    }

    /// Waits for the claim on `socket` (blocking the thread) and takes it.
    pub fn wait(socket: &Path) -> Result<Self, SocketError> {
        match Self::take(socket, FlockArg::LockExclusive)? {
            Ok(claim) => Ok(claim),
            // A blocking flock does not answer EWOULDBLOCK.
            Err(held) => Err(PathIoError::new(
                "lock",
                &lock_path(socket),
                std::io::Error::other(held.holder),
            )
            .into()),
        }
    }

    /// [`Claim::wait`] on a thread of its own, so a tokio runtime is not held up: the kernel
    /// wakes it the moment the holder's file is closed. Not the blocking pool, whose threads
    /// the runtime waits for at exit; if the receiver is gone by the time the claim is taken,
    /// the claim is dropped, and so released, at once.
    pub fn wait_on_thread(
        socket: &Path,
    ) -> std::io::Result<tokio::sync::oneshot::Receiver<Result<Self, SocketError>>> {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let socket = socket.to_owned();
        std::thread::Builder::new()
            .name("socket-claim".into())
            .spawn(move || {
                let _ = sender.send(Self::wait(&socket));
            })?;
        Ok(receiver)
    }

    fn take(socket: &Path, how: FlockArg) -> Result<Result<Self, Held>, SocketError> {
        let path = lock_path(socket);
        super::create_parent(&path)?;
        Ok(match lock_file::take(&path, how)? {
            lock_file::Lock::Taken(lock) => Ok(Self { path, lock }),
            lock_file::Lock::Held(holder) => Err(Held { holder }),
        })
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Whether the claim failed because the filesystem takes no locks (some FUSE and network
/// filesystems): the caller then goes on without one.
pub fn unsupported(error: &SocketError) -> bool {
    let SocketError::Io(error) = error else {
        return false;
    };
    let unsupported = [Errno::ENOLCK, Errno::EOPNOTSUPP, Errno::ENOSYS].map(|e| e as i32);
    error
        .raw_os_error()
        .is_some_and(|code| unsupported.contains(&code))
}

impl Drop for Claim {
    fn drop(&mut self) {
        // Removed while still locked, and only if it is still our file: a waiter then finds
        // its file gone and opens the path again (see `take`).
        if lock_file::still_at(&self.path, &self.lock) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_claim_is_refused_and_told_who_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("x-reg.sock");
        let first = Claim::try_take(&socket).unwrap().unwrap();
        assert_eq!(first.path(), dir.path().join("x-reg.sock.lock"));
        let held = Claim::try_take(&socket).unwrap().unwrap_err();
        assert!(
            held.holder
                .starts_with(&format!("pid {} on ", std::process::id())),
            "{held:?}"
        );
        drop(first);
        assert!(
            !lock_path(&socket).exists(),
            "the holder removes its lock file"
        );
        Claim::try_take(&socket)
            .unwrap()
            .expect("free again once the first is dropped");
    }

    #[test]
    fn a_waiter_woken_on_a_removed_lock_file_takes_the_one_at_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("x-reg.sock");
        let first = Claim::try_take(&socket).unwrap().unwrap();
        let (sender, taken) = std::sync::mpsc::channel();
        let waiting_on = socket.clone();
        let waiter = std::thread::spawn(move || {
            let claim = Claim::wait(&waiting_on).unwrap();
            sender.send(()).unwrap();
            claim
        });
        drop(first);
        taken.recv().unwrap();
        let second = waiter.join().unwrap();
        assert!(
            lock_file::still_at(second.path(), &second.lock),
            "holds the file at the path"
        );
        assert!(
            Claim::try_take(&socket).unwrap().is_err(),
            "and excludes others"
        );
    }

    #[test]
    fn the_lock_file_is_private_and_never_followed_through_a_link() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("x-reg.sock");
        let claim = Claim::try_take(&socket).unwrap().unwrap();
        let mode = std::fs::metadata(claim.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        drop(claim);
        let elsewhere = dir.path().join("elsewhere");
        std::os::unix::fs::symlink(&elsewhere, lock_path(&socket)).unwrap();
        assert!(Claim::try_take(&socket).is_err());
        assert!(!elsewhere.exists(), "nothing created through the link");
    }
}
