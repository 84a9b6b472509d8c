//! The kubelet's plugin watcher: inotify on the registry directory and every directory below
//! it, a walk at start that treats each socket found as created, and create/remove events
//! turned into the desired state.
//!
//! Like fsnotify under the kubelet, `IN_CREATE` and `IN_MOVED_TO` count as create (a socket
//! bound under a hidden name and renamed into place appears by `IN_MOVED_TO`), `IN_DELETE` and
//! `IN_DELETE_SELF` as remove. fsnotify reports `IN_MOVED_FROM` as a rename, which the kubelet
//! ignores: a socket moved away stays registered. Names starting with `.` and files that are
//! not sockets are ignored.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::sys::inotify::{AddWatchFlags, InotifyEvent, WatchDescriptor};

use super::state::Shared;
use crate::linux::inotify::{AsyncInotify, StartError};

fn watch_mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_DELETE_SELF
}

/// `MkdirAll(path, 0755)`, as the kubelet prepares the directory it watches.
pub fn ensure_dir(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("error (re-)creating root {}: {e}", dir.display()),
            )
        })
}

/// Sockets at `path` count when `stat` (which follows links) says so.
fn is_socket(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

fn hidden(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n.as_encoded_bytes().starts_with(b"."))
}

/// Every directory below `dir` (not following links) and every socket, in lexical order, as
/// `filepath.Walk` visits them. Unreadable subdirectories are skipped, as upstream logs and
/// skips them; an unreadable root is an error.
pub fn walk(dir: &Path, visit: &mut dyn FnMut(&Path, bool)) -> io::Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("error accessing path: {} error: {e}", dir.display()),
            )
        })?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for path in entries {
        let is_dir = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
        if is_dir {
            visit(&path, true);
            if let Err(e) = walk(&path, visit) {
                log::warn!("{e}");
            }
        } else if is_socket(&path) {
            visit(&path, false);
        } else {
            log::trace!("ignoring file {}", path.display());
        }
    }
    Ok(())
}

/// The sockets `--once` registers: the walk's, minus hidden names.
pub fn sockets(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    walk(dir, &mut |path, is_dir| {
        if !is_dir && !hidden(path) {
            found.push(path.to_owned());
        }
    })?;
    Ok(found)
}

pub struct Watcher {
    inotify: AsyncInotify,
    dirs: HashMap<WatchDescriptor, PathBuf>,
    shared: Arc<Shared>,
}

impl Watcher {
    /// Creates the directory, watches it and walks it; every socket found becomes desired.
    pub fn start(dir: &Path, shared: Arc<Shared>) -> io::Result<Watcher> {
        ensure_dir(dir)?;
        let inotify = AsyncInotify::new().map_err(|e| match e {
            StartError::Init(e) => {
                io::Error::other(format!("failed to start plugin fsWatcher, err: {e}"))
            }
            StartError::Register(e) => e,
        })?;
        let mut watcher = Watcher {
            inotify,
            dirs: HashMap::new(),
            shared,
        };
        watcher.traverse(dir)?;
        Ok(watcher)
    }

    /// Watches `dir` and everything below it, and takes in the sockets there.
    fn traverse(&mut self, dir: &Path) -> io::Result<()> {
        self.add_watch(dir)?;
        let mut found = Vec::new();
        walk(dir, &mut |path, is_dir| {
            found.push((path.to_owned(), is_dir))
        })?;
        for (path, is_dir) in found {
            if is_dir {
                if let Err(e) = self.add_watch(&path) {
                    log::warn!("{e}");
                }
            } else {
                self.created(&path);
            }
        }
        Ok(())
    }

    fn add_watch(&mut self, dir: &Path) -> io::Result<()> {
        let wd = self.inotify.add_watch(dir, watch_mask()).map_err(|e| {
            io::Error::other(format!("failed to watch {}, err: {e}", dir.display()))
        })?;
        log::trace!("watching {}", dir.display());
        self.dirs.insert(wd, dir.to_owned());
        Ok(())
    }

    /// Upstream's `handleCreateEvent`. The name is checked before `stat` (upstream checks
    /// after): same outcome, but a hidden name that is already renamed away (our socket
    /// layer's staging name) is not logged as a failure.
    fn created(&mut self, path: &Path) {
        if hidden(path) {
            log::trace!("ignoring {} (starts with '.')", path.display());
            return;
        }
        let meta = match std::fs::metadata(path) {
            Ok(meta) => meta,
            Err(e) => {
                log::warn!("stat file {} failed: {e}", path.display());
                return;
            }
        };
        if meta.is_dir() {
            if let Err(e) = self.traverse(path) {
                log::warn!("{e}");
            }
        } else if meta.file_type().is_socket() {
            log::debug!("socket {} created", path.display());
            self.shared.socket_found(path);
        } else {
            log::trace!("ignoring non-socket file {}", path.display());
        }
    }

    fn handle(&mut self, event: InotifyEvent) {
        if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
            log::warn!("inotify queue overflowed: some create or remove events were lost");
            return;
        }
        if event.mask.contains(AddWatchFlags::IN_IGNORED) {
            self.dirs.remove(&event.wd);
            return;
        }
        let Some(dir) = self.dirs.get(&event.wd) else {
            return;
        };
        let path = match &event.name {
            Some(name) => dir.join(name),
            None => dir.clone(),
        };
        let mask = event.mask;
        if mask.intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO) {
            self.created(&path);
        } else if mask.intersects(AddWatchFlags::IN_DELETE | AddWatchFlags::IN_DELETE_SELF) {
            log::debug!("{} removed", path.display());
            self.shared.lock().remove_desired(&path);
        } else if mask.contains(AddWatchFlags::IN_MOVED_FROM) && !hidden(&path) {
            log::info!(
                "{} was moved away; the kubelet ignores renames, so it stays registered",
                path.display()
            );
        }
    }

    /// Handles events until reading them fails.
    pub async fn run(mut self) -> io::Result<()> {
        loop {
            for event in self.inotify.read_events().await? {
                self.handle(event);
            }
        }
    }
}
