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
//! until a whole pass finds nothing, and counted ([`Totals`]). A volume with an episode under
//! way is walked again every [`HOT_PAUSE`], not at the next pass; one whose pod takes files out
//! again after they were set back is fenced ([`escapes::FENCED_AFTER`]) for as long as
//! node-server runs: everything in it is handed to [`QUARANTINE_UID`], so the pod owns nothing
//! it could move out, and its inode limit is set to one, below what it holds, so it can make
//! nothing new to move. A fence walk is never cut short, whichever lane finds the repeat, and
//! begins the moment the repeat is found, not at the end of the walk that found it.
//!
//! Symlinks, FIFOs, sockets and device nodes of a directory found escaped are made again in
//! the volume's project ([`escape_walk::Remakes`]); their private directory is
//! `volumes/.orphan-remake-<id>` (an orphan's name: a crash's leftover is removed at the next
//! start), and the inode limit a remake meets is lifted for the rest of that walk and put
//! back after it.

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{Driver, quota_watch};
use crate::linux::quota::escape::{QUARANTINE_UID, Tally};
use crate::linux::quota::escape_walk;
use crate::node_server::state::escapes::{self, Note, Totals};
use crate::node_server::state::state_dir;
use crate::node_server::state::volumes::Record;

/// How often, in inodes, a walk looks at the clock and at the stop flag.
const TICK_EVERY: u64 = 64;

/// The pause between walks of a volume with an episode under way.
pub const HOT_PAUSE: Duration = Duration::from_secs(1);

/// The background check, stopped and joined on drop.
pub struct QuotaPatrol {
    stop: Arc<Stop>,
    threads: Vec<JoinHandle<()>>,
}

/// Which volumes a patrol thread walks. One pod's flood of inodes must not hold back every
/// other volume's check: a volume whose walk takes longer than [`SMALL_LANE_WALK`] is cut off
/// there and walked from then on by a thread of its own with the other large ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Small,
    Large,
    /// No volumes: the thread of the write watch ([`quota_watch`]), started beside the two
    /// lanes (one thread closure for all three keeps the binary smaller).
    Watch,
}

/// The longest walk of one volume in the small lane; a longer one moves the volume to the
/// large lane.
pub const SMALL_LANE_WALK: Duration = Duration::from_secs(10);

/// A stop flag a sleeping thread wakes up for.
#[derive(Default)]
pub(super) struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl Stop {
    /// Sleeps `pause`, or less if stopped meanwhile; whether it is stopped.
    pub(super) fn wait(&self, pause: Duration) -> bool {
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
        let mut threads = Vec::new();
        for (lane, name) in [
            (Lane::Small, "quota-check"),
            (Lane::Large, "quota-check-large"),
            (Lane::Watch, "quota-watch"),
        ] {
            let (driver, stopping) = (Arc::clone(&driver), Arc::clone(&stop));
            let thread = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || run(&driver, &stopping, lane))
                .map_err(|e| log::error!("volumes are not checked for escapes ({name}): {e}"))
                .ok()?;
            threads.push(thread);
        }
        Some(Self { stop, threads })
    }
}

impl Drop for QuotaPatrol {
    fn drop(&mut self) {
        self.stop.set();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn run(driver: &Driver, stop: &Stop, lane: Lane) {
    if lane == Lane::Watch {
        return quota_watch::run(driver, stop);
    }
    if let Err(e) = crate::linux::ioprio::idle_for_this_thread() {
        log::warn!("the quota check runs at normal I/O priority: {e}");
    }
    let checks = driver.config.quota_checks;
    loop {
        let started = Instant::now();
        let Some(walked) = pass(driver, stop, checks.rate, lane, None) else {
            return;
        };
        log::debug!(
            "quota check pass ({lane:?} volumes): {walked} inodes in {:.3} s",
            started.elapsed().as_secs_f64()
        );
        // Until the next whole pass, the volumes with an episode under way, again and again.
        let next_pass = Instant::now() + checks.interval;
        loop {
            let hot = driver.escapes.under_way();
            let left = next_pass.saturating_duration_since(Instant::now());
            let pause = match hot.is_empty() {
                true => left,
                false => left.min(HOT_PAUSE),
            };
            if stop.wait(pause) {
                return;
            }
            if hot.is_empty() || Instant::now() >= next_pass {
                break;
            }
            // A pod escaping now is not background work: these walks must not starve behind
            // the busy node (or the pod's own load) as the idle class and nice 19 would.
            let raised = crate::linux::ioprio::normal_for_this_thread();
            let walked = pass(driver, stop, checks.rate, lane, Some(&hot));
            if raised.is_ok()
                && let Err(e) = crate::linux::ioprio::idle_for_this_thread()
            {
                log::warn!("the quota check stays at normal priority: {e}");
            }
            if walked.is_none() {
                return;
            }
        }
    }
}

/// One pass over every quota'd volume of `lane` (or those of them in `only`); the inodes
/// looked at, or `None` if stopped.
fn pass(
    driver: &Driver,
    stop: &Stop,
    rate: u32,
    lane: Lane,
    only: Option<&[String]>,
) -> Option<u64> {
    let (records, _) = driver.volumes.records().page(None, 0);
    let mut walked = 0;
    for record in &records {
        let large = driver.escapes.is_large(&record.id);
        if only.is_some_and(|only| !only.contains(&record.id)) || large != (lane == Lane::Large) {
            continue;
        }
        let Some(project) = record.project_id.filter(|_| !record.block) else {
            continue;
        };
        let dir = driver.volumes.path_of(&record.id);
        let aside = dir.with_file_name(state_dir::orphan_name(&format!("remake-{}", record.id)));
        let lifted = std::cell::Cell::new(false);
        let lift = || {
            let quotas = driver.volumes.directories().quotas();
            match quotas.lift_inodes(record) {
                Ok(()) => lifted.set(true),
                Err(e) => log::warn!("volume {}: its inode limit stays: {e}", record.id),
            }
            lifted.get()
        };
        let mut remakes = escape_walk::Remakes {
            aside: &aside,
            lift: &lift,
            pending: driver.escapes.take_remakes(&record.id),
        };
        let started = std::cell::Cell::new(Instant::now());
        let cut = std::cell::Cell::new(false);
        // A fence walk is never cut: the pod must own nothing the moment it is fenced.
        let may_cut = std::cell::Cell::new(lane == Lane::Small);
        let under_way = driver.escapes.is_under_way(&record.id);
        let early = std::cell::RefCell::new(None::<Tally>);
        let fencing = std::cell::Cell::new(driver.escapes.fenced(&record.id));
        let (asked, fence_now) = (std::cell::Cell::new(false), std::cell::Cell::new(false));
        let mut tick = |so_far: &Tally| {
            // The first escape of an episode shows at once, not at the end of a long walk (it
            // begins the episode: hot walks follow, and a repeat fences).
            if !under_way && early.borrow().is_none() && so_far.found() {
                let note = driver.note_escapes(record, project, so_far, false);
                *early.borrow_mut() = Some(so_far.clone());
                // A repeat of an earlier episode: fenced, and the fence walk begins now.
                if note == Note::Fenced && !fencing.get() {
                    fence_now.set(true);
                    return ControlFlow::Break(());
                }
            }
            // So does the repeat that fences (a flood's entries made again make a walk long):
            // this walk stops, and the fence walk begins. A directory moved out again while
            // this walk made its entries again is such a repeat already.
            let again = so_far.again > 0;
            let next = || {
                under_way
                    && so_far.found()
                    && !asked.replace(true)
                    && driver.escapes.fences_next(&record.id)
            };
            if !fencing.get() && (again || next()) {
                fence_now.set(true);
                return ControlFlow::Break(());
            }
            let done = so_far.inodes;
            if !done.is_multiple_of(TICK_EVERY) {
                return ControlFlow::Continue(());
            }
            if may_cut.get() && started.get().elapsed() > SMALL_LANE_WALK {
                cut.set(true);
                return ControlFlow::Break(());
            }
            let pause = escapes::pause(done, rate, started.get().elapsed());
            match stop.wait(pause) {
                true => ControlFlow::Break(()),
                false => ControlFlow::Continue(()),
            }
        };
        let mut fence = driver.escapes.fenced(&record.id).then_some(QUARANTINE_UID);
        let walk = loop {
            let walk = match escape_walk::walk(&dir, project, fence, Some(&mut remakes), &mut tick)
            {
                Ok(walk) => walk,
                // Deleted since the list was taken, or not made yet.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break None,
                Err(e) => {
                    log::debug!("quota check of volume {}: {e}", record.id);
                    break None;
                }
            };
            walked += walk.tally.inodes;
            if walk.stopped && fence_now.take() {
                let found = match early.borrow_mut().take() {
                    Some(early) => walk.tally.since(&early),
                    None => walk.tally.clone(),
                };
                let mut note = (driver.escapes).record_cut_walk(&record.id, project, &found);
                if note != Note::Fenced && found.again > 0 {
                    note = driver.escapes.fence(&record.id);
                }
                driver.say(&record.id, project, &walk.tally, note);
                if !driver.escapes.fenced(&record.id) {
                    break None;
                }
                fence = Some(QUARANTINE_UID);
                fencing.set(true);
                started.set(Instant::now());
                may_cut.set(false);
                continue;
            }
            let early = early.borrow_mut().take();
            if walk.stopped && cut.get() {
                // What it found so far counts; the rest is the large lane's.
                driver.escapes.set_large(&record.id, true);
                log::info!(
                    "volume {}: {} inodes walked in {:.1} s and more to go; checked from now on \
                     with the other large volumes",
                    record.id,
                    walk.tally.inodes,
                    walk.wall.as_secs_f64()
                );
                let note = driver
                    .escapes
                    .record_cut_walk(&record.id, project, &walk.tally);
                driver.say(&record.id, project, &walk.tally, note);
                if note == Note::Fenced {
                    // Fenced by a cut walk: everything handed over now, in this lane, once.
                    fence = Some(QUARANTINE_UID);
                    fencing.set(true);
                    started.set(Instant::now());
                    may_cut.set(false);
                    cut.set(false);
                    continue;
                }
                break None;
            }
            if walk.stopped {
                if lifted.get() {
                    driver.put_limits_back(record, fence.is_some());
                }
                driver.escapes.keep_remakes(&record.id, remakes.pending);
                return None;
            }
            if lane == Lane::Large && walk.wall < SMALL_LANE_WALK / 2 {
                driver.escapes.set_large(&record.id, false);
            }
            let note = match &early {
                Some(early) => {
                    let id = &record.id;
                    let note =
                        (driver.escapes).record_after_early(id, project, &walk.tally, true, early);
                    driver.say(&record.id, project, &walk.tally, note);
                    note
                }
                None => driver.note_escapes(record, project, &walk.tally, true),
            };
            // Fenced by this walk: everything in the volume handed over at once, before the
            // pod moves out what this walk set back.
            match (note, fence) {
                (Note::Fenced, None) => {
                    fence = Some(QUARANTINE_UID);
                    fencing.set(true);
                }
                _ => break Some(walk),
            }
        };
        driver.escapes.keep_remakes(&record.id, remakes.pending);
        let Some(walk) = walk else {
            if lifted.get() {
                driver.put_limits_back(record, fence.is_some());
            }
            continue;
        };
        if fence.is_some() || lifted.get() {
            driver.put_limits_back(record, fence.is_some());
        }
        log::trace!(
            "quota check of volume {}: {} inodes, {:.3} s wall, {:.3} s CPU",
            record.id,
            walk.tally.inodes,
            walk.wall.as_secs_f64(),
            walk.cpu.as_secs_f64()
        );
    }
    if only.is_some() {
        return Some(walked);
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
            Ok(tally) => {
                self.note_escapes(record, project, &tally, false);
            }
            Err(e) => log::debug!("quota check of volume {}'s root: {e}", record.id),
        }
    }

    /// What a check found, into the volume's episode; the one log line when it begins (and
    /// when it fences the volume).
    fn note_escapes(&self, record: &Record, project: u32, found: &Tally, whole: bool) -> Note {
        let note = self.escapes.record(&record.id, project, found, whole);
        self.say(&record.id, project, found, note);
        note
    }

    /// The log line a check's note calls for, if any.
    pub(super) fn say(&self, id: &str, project: u32, found: &Tally, note: Note) {
        match note {
            Note::Began => log::warn!("volume {}: {}", id, escapes::describe(project, found)),
            Note::Fenced => {
                log::warn!("volume {} (project {project}): {}", id, escapes::FENCE_NOTE)
            }
            Note::Ended => log::debug!("volume {}: back in its project quota", id),
            Note::Continued | Note::FencedContinued | Note::Clean => {}
        }
    }

    /// A fenced volume may make no new inodes: its inode limit is set to one after each walk
    /// (an expansion's new limits included).
    fn freeze(&self, record: &Record) {
        match self.volumes.directories().quotas().freeze_inodes(record) {
            Ok(held) => log::debug!("volume {}: fenced at {held:?} inodes", record.id),
            Err(e) => log::warn!("volume {}: its inode limit stays: {e}", record.id),
        }
    }

    /// A volume's limits after a walk: a fenced one's frozen, another's its own again (a walk
    /// may have lifted its inode limit).
    fn put_limits_back(&self, record: &Record, fenced: bool) {
        if fenced {
            return self.freeze(record);
        }
        if let Err(e) = self.volumes.directories().quotas().apply(record) {
            log::warn!("volume {}: its inode limit stays lifted: {e}", record.id);
        }
    }

    /// Escapes found and set back since start-up.
    pub fn escape_totals(&self) -> Totals {
        self.escapes.totals()
    }
}
