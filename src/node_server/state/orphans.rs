//! What interrupted operations left in `volumes/` and `snapshots/`: a snapshot's temporary
//! copy, a restore's or clone's directory without a record, snapshot data whose record was
//! never written or whose group was never completed, what a deletion left of a volume's data. Start-up sets each aside, before anything
//! is served, with one rename to a name no volume or snapshot ID can have
//! ([`state_dir::orphan_name`]: IDs never start with a dot), so no call can find or claim it, however
//! large it is; a thread at idle I/O priority removes them once the socket serves (86,000 files
//! took 50 s on ext4, which start-up used to spend before serving).
//!
//! A rename that a crash makes undone brings back the old name, which is a leftover again at the
//! next start: the renames need no sync. A crash during the removal leaves orphan names, which
//! the next start-up finds ([`Orphans::resume`]) and removes the same way. Removal never follows
//! a symlink nor crosses a mount ([`copy::remove_tree`]).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};

use crate::linux::copy;
use crate::node_server::state::state_dir;

/// The leftovers found at start-up, set aside and waiting for [`Orphans::remove_in_background`].
#[derive(Debug, Default)]
pub struct Orphans {
    found: Mutex<Vec<PathBuf>>,
}

impl Orphans {
    pub fn new() -> Self {
        Self::default()
    }

    /// Renames `dir/name` to a fresh orphan name beside it (never over an entry), so nothing
    /// finds it under its old name; removed later.
    pub fn set_aside(&self, dir: &Path, name: &OsStr) -> std::io::Result<()> {
        let from = dir.join(name);
        let to = loop {
            let tag = crate::node_server::state::store::new_id("", |_| false);
            let to = dir.join(state_dir::orphan_name(&tag));
            match renameat2(
                AT_FDCWD,
                &from,
                AT_FDCWD,
                &to,
                RenameFlags::RENAME_NOREPLACE,
            ) {
                Ok(()) => break to,
                Err(Errno::EEXIST) => continue,
                Err(e) => return Err(e.into()),
            }
        };
        log::info!(
            "set aside {} as {} for removal in the background",
            from.display(),
            to.display()
        );
        self.push(to);
        Ok(())
    }

    /// Takes up the orphans already in `dir`: a removal that a crash or a stop interrupted.
    pub fn resume(&self, dir: &Path) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if state_dir::is_orphan(&entry.file_name()) {
                self.push(entry.path());
            }
        }
        Ok(())
    }

    fn push(&self, path: PathBuf) {
        let mut found = crate::mutex::lock(&self.found);
        found.push(path);
    }

    /// How many are waiting.
    pub fn len(&self) -> usize {
        crate::mutex::lock(&self.found).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes every orphan found so far on a thread of its own, at idle I/O priority and nice
    /// 19, then runs `then` there; `None` when there is nothing to remove. Each one is logged
    /// when it is gone; one that cannot be removed (a mount inside it) is logged and left for
    /// the next start-up.
    pub fn remove_in_background(
        &self,
        then: impl FnOnce() + Send + 'static,
    ) -> Option<std::thread::JoinHandle<()>> {
        let found = std::mem::take(&mut *crate::mutex::lock(&self.found));
        if found.is_empty() {
            return None;
        }
        log::info!("removing {} orphan(s) in the background", found.len());
        let spawned = std::thread::Builder::new()
            .name("orphans".into())
            .spawn(move || {
                remove_all(found);
                then();
            });
        match spawned {
            Ok(handle) => Some(handle),
            Err(e) => {
                log::error!(
                    "orphans are left for the next start-up: no thread to remove them: {e}"
                );
                None
            }
        }
    }
}

fn remove_all(found: Vec<PathBuf>) {
    if let Err(e) = crate::linux::ioprio::idle_for_this_thread() {
        log::warn!("removing orphans at normal priority: {e}");
    }
    for path in found {
        let started = std::time::Instant::now();
        match copy::remove_tree(&path) {
            Ok(()) => log::info!(
                "removed orphan {} in {} ms",
                path.display(),
                started.elapsed().as_millis()
            ),
            Err(e) => log::error!("could not remove orphan {}: {e}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leftover_set_aside_loses_its_name_at_once_and_is_removed_in_the_background() {
        let dir = tempfile::tempdir().unwrap();
        let leftover = dir.path().join("vol-1");
        std::fs::create_dir_all(leftover.join("a/b")).unwrap();
        std::fs::write(leftover.join("a/b/file"), b"data").unwrap();
        let orphans = Orphans::new();
        orphans.set_aside(dir.path(), OsStr::new("vol-1")).unwrap();
        assert!(!leftover.exists(), "its name is free at once");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1);
        assert!(state_dir::is_orphan(&names[0]), "{names:?}");
        assert_eq!(orphans.len(), 1);
        orphans.remove_in_background(|| ()).unwrap().join().unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        assert!(
            orphans.remove_in_background(|| ()).is_none(),
            "nothing left"
        );
    }

    #[test]
    fn orphans_a_previous_run_left_are_taken_up_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(state_dir::orphan_name("old"))).unwrap();
        std::fs::create_dir(dir.path().join("vol-kept")).unwrap();
        let orphans = Orphans::new();
        orphans.resume(dir.path()).unwrap();
        assert_eq!(orphans.len(), 1);
        orphans.remove_in_background(|| ()).unwrap().join().unwrap();
        assert!(dir.path().join("vol-kept").exists());
        assert!(!dir.path().join(state_dir::orphan_name("old")).exists());
    }
}
