//! Cutting snapshots: the filesystem is synced once (one journal commit flushes what the
//! volumes' writers left dirty, where a reflink of each dirty file would flush it on its own),
//! then each source tree is copied by the copy engine to its snapshot's directory, with
//! reflinks where the filesystem shares extents. The members of a group are copied back to
//! back, right after that one sync, with no threads of their own. Whether copying them in
//! parallel threads narrows the window in which the group's files are copied was measured
//! twice on the shared 2-core build machine (`scripts/bench-storage.sh grpc`, four volumes of
//! 2,500 files) and the runs disagreed (see docs/figures.md); the window is logged.
//!
//! What a cut promises: each regular file is copied as of one instant where reflinks are used
//! (`FICLONE` takes the file's I/O lock, so no write lands halfway through it); without
//! reflinks a file being written may be copied mid-write. The tree is as of the walk: files
//! created, renamed or removed while it runs may or may not be in it. A mount inside a volume
//! is never copied through (it is reported and skipped).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::Snapshots;
use super::records::{Time, now};
use crate::linux::copy::{self, Options, Report, SkipReason};
use crate::node_server::state::snapshots::SnapshotError;
use crate::path_io::PathIoError;

/// One snapshot's data, copied and durable under its ID, not yet recorded.
#[derive(Debug)]
pub struct Cut {
    pub id: String,
    pub report: Report,
    /// When its copy began and ended.
    pub started: Instant,
    pub finished: Instant,
}

/// Flushes the filesystem holding `dir` (all volumes share the state directory's).
fn sync(dir: &Path) -> Result<(), SnapshotError> {
    let op = "sync the filesystem of";
    let file = File::open(dir).map_err(PathIoError::at(op, dir))?;
    nix::unistd::syncfs(&file).map_err(|e| PathIoError::new(op, dir, e.into()))?;
    Ok(())
}

impl Snapshots {
    /// Copies each source directory to a new snapshot directory, back to back after one sync;
    /// returns the time the copies began (their `creation_time`) and the cuts, in the order of
    /// `sources`. On failure no copy is left behind. Safe to call from several threads.
    pub fn cut(&self, sources: &[PathBuf]) -> Result<(Time, Vec<Cut>), SnapshotError> {
        if let Some(first) = sources.first() {
            sync(first.parent().unwrap_or(first))?;
        }
        let created = now();
        let (mut cuts, mut failure) = (Vec::new(), None);
        for source in sources {
            let id = self.new_id("snap-");
            match self.copy_one(source, &id) {
                Ok((report, (started, finished))) => cuts.push(Cut {
                    id,
                    report,
                    started,
                    finished,
                }),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failure {
            for cut in &cuts {
                if let Err(left) = copy::remove_tree(&self.path_of(&cut.id)) {
                    log::error!("could not remove the copy {}: {left}", cut.id);
                }
            }
            return Err(e);
        }
        if let Some((spread, longest)) = spread(&cuts)
            && cuts.len() > 1
        {
            log::info!(
                "cut {} snapshots together: all copied within {spread:?} (longest {longest:?})",
                cuts.len()
            );
        }
        Ok((created, cuts))
    }

    fn copy_one(
        &self,
        source: &Path,
        id: &str,
    ) -> Result<(Report, (Instant, Instant)), SnapshotError> {
        let started = Instant::now();
        let report = copy::copy_tree(source, &self.path_of(id), Options::default()).map_err(
            |source_error| SnapshotError::Copy {
                from: source.to_owned(),
                source: source_error,
            },
        )?;
        let span = (started, Instant::now());
        for skipped in &report.skipped {
            match &skipped.reason {
                SkipReason::MountPoint => log::warn!(
                    "snapshot {id}: {} is a mount point inside the volume; not copied",
                    skipped.path.display()
                ),
                reason => log::debug!(
                    "snapshot {id}: left out {} ({reason:?})",
                    skipped.path.display()
                ),
            }
        }
        if report.churned() > 0 {
            log::info!(
                "snapshot {id}: left out {} entries that vanished or changed type while they \
                 were copied",
                report.churned()
            );
        }
        log::info!(
            "cut snapshot {id} of {} in {:?}: {} files, {} bytes, {} reflinked",
            source.display(),
            span.1 - span.0,
            report.files,
            report.bytes,
            report.bytes_reflinked
        );
        Ok((report, span))
    }
}

/// From the first copy's start to the last one's end (the window in which the members' files
/// were copied), and the longest single copy.
pub fn spread(cuts: &[Cut]) -> Option<(Duration, Duration)> {
    let first = cuts.iter().map(|c| c.started).min()?;
    let last = cuts.iter().map(|c| c.finished).max()?;
    let longest = cuts.iter().map(|c| c.finished - c.started).max()?;
    Some((last - first, longest))
}
