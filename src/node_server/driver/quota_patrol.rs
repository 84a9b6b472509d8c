//! Volumes held to their project quotas against their own pods: the owner of a file may move
//! it to another project (`chattr -p`, no capability needed in the host's user namespace),
//! clear a directory's PROJINHERIT, or, as the owner of the volume's root, re-tag the root.
//! The kernel cannot be told to refuse that, so it is found and set back after the fact:
//!
//! - every NodeGetVolumeStats looks at the volume's root (one open and one ioctl) and sets it
//!   back at once;
//! - a background thread, in the idle I/O class, walks every quota'd volume's tree every
//!   `--quota-check-interval`, looking at no more than `--quota-check-rate` inodes a second,
//!   and sets back every inode in another project and every directory without PROJINHERIT,
//!   which charges their blocks to the volume again.
//!
//! Each episode is logged once (when it begins), shown as the volume's abnormal condition
//! until a whole pass finds nothing, and counted ([`Totals`]).

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::Driver;
use crate::linux::quota::escape::Tally;
use crate::linux::quota::escape_walk;
use crate::node_server::state::escapes::{self, Note, Totals};
use crate::node_server::state::volumes::Record;

/// How often, in inodes, a walk looks at the clock and at the stop flag.
const TICK_EVERY: u64 = 64;

/// The background check, stopped and joined on drop.
pub struct QuotaPatrol {
    stop: Arc<Stop>,
    thread: Option<JoinHandle<()>>,
}

/// A stop flag a sleeping thread wakes up for.
#[derive(Default)]
struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl Stop {
    /// Sleeps `pause`, or less if stopped meanwhile; whether it is stopped.
    fn wait(&self, pause: Duration) -> bool {
        let stopped = crate::mutex::lock(&self.stopped);
        let (stopped, _) = self
            .wake
            .wait_timeout_while(stopped, pause, |stopped| !*stopped)
            .unwrap_or_else(PoisonError::into_inner);
        *stopped
    }

    fn set(&self) {
        *crate::mutex::lock(&self.stopped) = true;
        self.wake.notify_all();
    }
}

impl QuotaPatrol {
    /// Starts the background check, unless sizes are not enforced (`--quota=off`, or a
    /// filesystem without project quotas): then there is nothing to hold.
    pub fn start(driver: Arc<Driver>) -> Option<Self> {
        if driver.volumes.directories().unenforced_reason().is_some() {
            return None;
        }
        let stop = Arc::new(Stop::default());
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("quota-check".into())
            .spawn(move || run(&driver, &stopping))
            .map_err(|e| log::error!("volumes are not checked for escapes from their quota: {e}"))
            .ok()?;
        Some(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for QuotaPatrol {
    fn drop(&mut self) {
        self.stop.set();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(driver: &Driver, stop: &Stop) {
    if let Err(e) = crate::linux::ioprio::idle_for_this_thread() {
        log::warn!("the quota check runs at normal I/O priority: {e}");
    }
    let checks = driver.config.quota_checks;
    loop {
        let started = Instant::now();
        let Some(walked) = pass(driver, stop, checks.rate) else {
            return;
        };
        log::debug!(
            "quota check pass: {walked} inodes in {:.3} s",
            started.elapsed().as_secs_f64()
        );
        if stop.wait(checks.interval) {
            return;
        }
    }
}

/// One pass over every quota'd volume; the inodes looked at, or `None` if stopped.
fn pass(driver: &Driver, stop: &Stop, rate: u32) -> Option<u64> {
    let (records, _) = driver.volumes.records().page(None, 0);
    let mut walked = 0;
    for record in &records {
        let Some(project) = record.project_id.filter(|_| !record.block) else {
            continue;
        };
        let dir = driver.volumes.path_of(&record.id);
        let started = Instant::now();
        let mut tick = |done: u64| {
            if !done.is_multiple_of(TICK_EVERY) {
                return ControlFlow::Continue(());
            }
            let pause = escapes::pause(done, rate, started.elapsed());
            match stop.wait(pause) {
                true => ControlFlow::Break(()),
                false => ControlFlow::Continue(()),
            }
        };
        let walk = match escape_walk::walk(&dir, project, &mut tick) {
            Ok(walk) => walk,
            // Deleted since the list was taken, or not made yet.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                log::debug!("quota check of volume {}: {e}", record.id);
                continue;
            }
        };
        if walk.stopped {
            return None;
        }
        walked += walk.tally.inodes;
        log::trace!(
            "quota check of volume {}: {} inodes, {:.3} s wall, {:.3} s CPU",
            record.id,
            walk.tally.inodes,
            walk.wall.as_secs_f64(),
            walk.cpu.as_secs_f64()
        );
        driver.note_escapes(record, project, &walk.tally, true);
    }
    let live: std::collections::HashSet<&str> = records.iter().map(|r| r.id.as_str()).collect();
    driver.escapes.retain(|id| live.contains(id));
    Some(walked)
}

impl Driver {
    /// The cheap check of a volume's root, on every stats call: set back at once if a pod
    /// re-tagged it. A root that cannot be read is left to the stats' own errors.
    pub(super) fn check_root(&self, record: &Record, project: u32, dir: &Path) {
        match escape_walk::check_root(dir, project) {
            Ok(tally) => self.note_escapes(record, project, &tally, false),
            Err(e) => log::debug!("quota check of volume {}'s root: {e}", record.id),
        }
    }

    /// What a check found, into the volume's episode; the one log line when it begins.
    fn note_escapes(&self, record: &Record, project: u32, found: &Tally, whole: bool) {
        match self.escapes.record(&record.id, project, found, whole) {
            Note::Began => log::warn!(
                "volume {}: {}",
                record.id,
                escapes::describe(project, found)
            ),
            Note::Ended => log::debug!("volume {}: back in its project quota", record.id),
            Note::Continued | Note::Clean => {}
        }
    }

    /// Escapes found and set back since start-up.
    pub fn escape_totals(&self) -> Totals {
        self.escapes.totals()
    }
}
