//! Waiting for a socket path to change hands: inotify on its directory wakes the waiter the
//! moment an entry is removed, renamed or created, and a slow poll stays as the safety net for
//! what inotify cannot see (a holder killed without removing its socket changes no entry; some
//! network and FUSE file systems send no events).

use std::path::Path;
use std::time::Duration;

use nix::sys::inotify::AddWatchFlags;

use crate::linux::inotify::AsyncInotify;

/// With inotify, the poll only catches a holder that died without removing its socket.
const POLL_WITH_INOTIFY: Duration = Duration::from_secs(1);
/// Without it, the poll is all there is; a connect attempt every 250 ms costs the holder little.
const POLL_WITHOUT: Duration = Duration::from_millis(250);

/// The least time between two connections [`until_unserved`] holds to a live holder.
const RECONNECT_AFTER: Duration = Duration::from_millis(100);

/// Changes to the entries of one directory.
pub struct DirWatch {
    inotify: Option<AsyncInotify>,
    poll: Duration,
}

impl DirWatch {
    /// Starts watching `dir`. Without inotify (no instances left, an unwatchable directory)
    /// the watch falls back to polling alone, and says so at debug level.
    pub fn new(dir: &Path) -> Self {
        let mask = AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_CREATE;
        let inotify = AsyncInotify::new()
            .map_err(std::io::Error::from)
            .and_then(|inotify| {
                inotify.add_watch(dir, mask)?;
                Ok(inotify)
            });
        match inotify {
            Ok(inotify) => Self {
                inotify: Some(inotify),
                poll: POLL_WITH_INOTIFY,
            },
            Err(e) => {
                log::debug!("cannot watch {}: {e}; polling instead", dir.display());
                Self {
                    inotify: None,
                    poll: POLL_WITHOUT,
                }
            }
        }
    }

    /// Returns after the next change in the directory, or after the poll interval, whichever
    /// comes first. The caller looks again either way.
    pub async fn changed(&mut self) {
        let Some(inotify) = &self.inotify else {
            tokio::time::sleep(self.poll).await;
            return;
        };
        let event = async {
            if inotify.read_events().await.is_err() {
                // Events that cannot be read (the runtime shutting down) wake no one early.
                std::future::pending::<()>().await;
            }
        };
        let _ = tokio::time::timeout(self.poll, event).await;
    }
}

/// Returns once nothing listens on the socket at `path` any more (at once, if nothing does
/// now). A connection to the holder is held open and read: the kernel ends it the moment the
/// holder's listener closes, however the holder exits (SIGKILL included, which changes no
/// directory entry for [`DirWatch`] to see). A holder that closes our idle connection first
/// is simply connected to again.
pub async fn until_unserved(path: &Path) {
    use tokio::io::AsyncReadExt;
    let connect = || tokio::net::UnixStream::connect(path);
    let mut buffer = [0u8; 4096];
    let Ok(mut stream) = connect().await else {
        return;
    };
    loop {
        let connected = std::time::Instant::now();
        // Whatever the holder sends (an HTTP/2 server's settings) is read and dropped.
        while matches!(stream.read(&mut buffer).await, Ok(n) if n > 0) {}
        // Ended by the holder's exit, or by its idle timeout: a new connection tells which,
        // and is the one held next (not in a tight loop with a holder that hangs up at once).
        let Ok(next) = connect().await else {
            return;
        };
        if connected.elapsed() < RECONNECT_AFTER {
            tokio::time::sleep(RECONNECT_AFTER).await;
        }
        stream = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn removing_an_entry_wakes_the_watch_without_waiting_for_its_poll() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("x-reg.sock");
        std::fs::write(&file, b"").unwrap();
        let mut watch = DirWatch::new(dir.path());
        assert!(watch.inotify.is_some(), "inotify is available here");
        watch.poll = Duration::from_secs(3600); // only the event can end the wait
        std::fs::remove_file(&file).unwrap();
        let woken = tokio::time::timeout(Duration::from_secs(60), watch.changed()).await;
        assert!(woken.is_ok(), "the removal woke the watch");
    }
}
