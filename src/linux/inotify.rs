//! inotify for tokio: one instance, non-blocking and close-on-exec, registered with the
//! runtime's reactor so that its events are awaited rather than polled for. The socket layer's
//! wait for a path to change hands and the kubelet emulator's plugin watcher both watch
//! through it.

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::Path;

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// tokio needs `AsRawFd`; nix's `Inotify` offers `AsFd`.
struct Fd(Inotify);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// Why an instance could not be had.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// `inotify_init1` failed: no instances left (`fs.inotify.max_user_instances`).
    #[error("{0}")]
    Init(Errno),
    /// tokio's reactor would not take the descriptor.
    #[error(transparent)]
    Register(io::Error),
}

impl From<StartError> for io::Error {
    fn from(error: StartError) -> Self {
        match error {
            StartError::Init(errno) => errno.into(),
            StartError::Register(error) => error,
        }
    }
}

/// One inotify instance and its watches.
pub struct AsyncInotify {
    fd: AsyncFd<Fd>,
}

impl AsyncInotify {
    /// A new instance with no watches, registered with the current tokio runtime (which must
    /// have its I/O driver).
    pub fn new() -> Result<Self, StartError> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(StartError::Init)?;
        // SAFETY: `Fd` owns the inotify descriptor, which stays open and the same for as long
        // as the `AsyncFd` holds it; `as_raw_fd` always returns that descriptor.
        let fd = unsafe { AsyncFd::register_with_interest(Fd(inotify), Interest::READABLE) }
            .map_err(|e| StartError::Register(e.into()))?;
        Ok(Self { fd })
    }

    /// Watches `path` for the events in `mask`.
    pub fn add_watch(&self, path: &Path, mask: AddWatchFlags) -> nix::Result<WatchDescriptor> {
        self.fd.get_ref().0.add_watch(path, mask)
    }

    /// The next events, waiting for them without blocking the runtime.
    pub async fn read_events(&self) -> io::Result<Vec<InotifyEvent>> {
        loop {
            let mut ready = self.fd.readable().await?;
            match ready.try_io(|fd| fd.get_ref().0.read_events().map_err(io::Error::from)) {
                Ok(read) => return read,
                Err(_would_block) => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;

    #[tokio::test]
    async fn a_file_created_in_a_watched_directory_comes_back_as_an_event_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let inotify = AsyncInotify::new().unwrap();
        let wd = inotify
            .add_watch(dir.path(), AddWatchFlags::IN_CREATE)
            .unwrap();
        std::fs::write(dir.path().join("x.sock"), b"").unwrap();
        let events =
            tokio::time::timeout(std::time::Duration::from_secs(60), inotify.read_events())
                .await
                .expect("the creation was reported")
                .unwrap();
        let event = &events[0];
        assert_eq!(event.wd, wd);
        assert!(event.mask.contains(AddWatchFlags::IN_CREATE));
        assert_eq!(event.name.as_deref(), Some(OsStr::new("x.sock")));
    }

    #[test]
    fn a_failed_start_reads_as_the_kernels_error() {
        let error = io::Error::from(StartError::Init(Errno::EMFILE));
        assert_eq!(error.raw_os_error(), Some(nix::libc::EMFILE));
    }
}
