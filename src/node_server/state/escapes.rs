//! What node-server keeps of escapes from its volumes' project quotas (a pod that took files
//! or directories out of its volume's project, found and set back by
//! [`escape_walk`](crate::linux::quota::escape_walk)): per volume, the episode under way — from the first
//! check that finds something to the first whole pass that finds nothing — said once in the
//! log, shown as the volume's abnormal condition, and counted; and the pace of the background
//! walk.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::linux::quota::escape::Tally;
use crate::linux::quota::escape_walk::Pending;

/// The whole walks that must find escapes in one episode before the volume is fenced: the
/// second means the pod took files out again after the first set them back.
pub const FENCED_AFTER: u32 = 2;

/// A fenced volume's condition, after what its episode found.
pub const FENCE_NOTE: &str = "its pod took files out of its size again after they were set \
    back, so it is fenced until node-server restarts: everything in it was handed to owner \
    4294967294 (its pod can no longer move anything out, and writes only where modes let \
    others), and it may make no new files or directories";

/// Pauses shorter than this are not taken: the walk runs on until the debt is worth a sleep.
pub const SHORTEST_PAUSE: Duration = Duration::from_millis(20);

/// How long a walk that has looked at `done` inodes, `elapsed` after it began, pauses to keep
/// to `rate` inodes a second (zero while it is behind, or the pause would be too short).
pub fn pause(done: u64, rate: u32, elapsed: Duration) -> Duration {
    let due = Duration::from_secs_f64(done as f64 / f64::from(rate.max(1)));
    let pause = due.saturating_sub(elapsed);
    if pause < SHORTEST_PAUSE {
        Duration::ZERO
    } else {
        pause
    }
}

/// What one check of a volume meant for its episode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Note {
    /// Something escaped, and no episode was under way: the one time to say so.
    Began,
    /// More found during an episode under way.
    Continued,
    /// A second whole walk found more in one episode: the pod took files out again after they
    /// were set back. From now on the volume is fenced ([`Escapes::fenced`]).
    Fenced,
    /// More found in a volume fenced already (what it made before the fence).
    FencedContinued,
    /// A whole pass found nothing after an episode: the volume is back to normal.
    Ended,
    /// Nothing found, nothing under way.
    Clean,
}

/// One volume's episode: everything found and set back since it began.
#[derive(Debug, Clone)]
struct Episode {
    project: u32,
    total: Tally,
    /// Whole walks that found something in it.
    walks_found: u32,
}

/// Totals since start-up, for the metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    pub episodes: u64,
    /// Inodes found in another project or directories without PROJINHERIT.
    pub inodes: u64,
    /// Bytes found outside their volume's project, charged back to it.
    pub bytes: u64,
    /// Walks of a volume's whole tree.
    pub walks: u64,
    /// Inodes those walks looked at.
    pub walked: u64,
}

/// Every volume's episode, and the totals.
#[derive(Debug, Default)]
pub struct Escapes {
    episodes: Mutex<HashMap<String, Episode>>,
    /// Volumes fenced since start-up (see [`Escapes::fenced`]).
    fenced: Mutex<std::collections::HashSet<String>>,
    /// Volumes whose files escaped in an episode since start-up: a new episode of one of
    /// them is a repeat, and fences it at once.
    escaped: Mutex<std::collections::HashSet<String>>,
    /// Volumes whose walk is too long for the patrol thread of the others.
    large: Mutex<std::collections::HashSet<String>>,
    /// Per volume, the directories (by inode) whose symlinks, FIFOs and the like a walk has
    /// still to make again in the project, and which such inodes are new to the walks ([`Remakes`](crate::linux::quota::escape_walk::Remakes)).
    remakes: Mutex<Vec<(String, Pending)>>,
    episodes_total: AtomicU64,
    inodes: AtomicU64,
    bytes: AtomicU64,
    walks: AtomicU64,
    walked: AtomicU64,
}

impl Escapes {
    fn episodes(&self) -> MutexGuard<'_, HashMap<String, Episode>> {
        // Each change is one insert or remove: a panic elsewhere cannot tear the map.
        crate::mutex::lock(&self.episodes)
    }

    /// What a check of volume `id` (project `project`) found: `whole` for a walk of its whole
    /// tree, else a look at its root alone or a walk cut short (which can begin an episode,
    /// never end one).
    pub fn record(&self, id: &str, project: u32, found: &Tally, whole: bool) -> Note {
        self.record_check(id, project, found, whole, whole, None)
    }

    /// [`Self::record`] of a walk cut short (a large volume's, handed to the other lane): it
    /// counts towards a fence as a whole walk does, but cannot end an episode.
    pub fn record_cut_walk(&self, id: &str, project: u32, found: &Tally) -> Note {
        self.record_check(id, project, found, false, true, None)
    }

    /// [`Self::record`] of a walk whose first escape was recorded part-way (`early`, which
    /// began the episode): judged on all it found, counted only for what came after.
    pub fn record_after_early(
        &self,
        id: &str,
        project: u32,
        found: &Tally,
        whole: bool,
        early: &Tally,
    ) -> Note {
        self.record_check(id, project, found, whole, true, Some(early))
    }

    fn record_check(
        &self,
        id: &str,
        project: u32,
        found: &Tally,
        whole: bool,
        walk: bool,
        early: Option<&Tally>,
    ) -> Note {
        if whole {
            self.walks.fetch_add(1, Ordering::Relaxed);
            self.walked.fetch_add(found.inodes, Ordering::Relaxed);
        }
        let mut episodes = self.episodes();
        if !found.abnormal() {
            return match whole && episodes.remove(id).is_some() {
                true => Note::Ended,
                false => Note::Clean,
            };
        }
        let fresh = early.map(|early| found.since(early));
        let found_now = fresh.as_ref().unwrap_or(found);
        let inodes = found_now.other_project + found_now.no_inherit;
        self.inodes.fetch_add(inodes, Ordering::Relaxed);
        self.bytes.fetch_add(found_now.bytes, Ordering::Relaxed);
        let walks_found = u32::from(walk);
        match episodes.get_mut(id) {
            Some(episode) => {
                episode.total.add(found_now);
                episode.walks_found += walks_found;
                if !(walk && episode.walks_found >= FENCED_AFTER) {
                    return Note::Continued;
                }
                match crate::mutex::lock(&self.fenced).insert(id.to_owned()) {
                    true => Note::Fenced,
                    false => Note::FencedContinued,
                }
            }
            None => {
                self.episodes_total.fetch_add(1, Ordering::Relaxed);
                let total = found.clone();
                let episode = Episode {
                    project,
                    total,
                    walks_found,
                };
                episodes.insert(id.to_owned(), episode);
                // Its pod took files out again after an earlier episode had set them back
                // (an escaper that waits for each episode to end must not start afresh).
                let again =
                    found.found() && !crate::mutex::lock(&self.escaped).insert(id.to_owned());
                match again {
                    true => self.fence(id),
                    false => Note::Began,
                }
            }
        }
    }

    /// The abnormal condition of volume `id` while an episode is under way.
    pub fn condition(&self, id: &str) -> Option<String> {
        let episode = self
            .episodes()
            .get(id)
            .map(|e| describe(e.project, &e.total));
        let fence = self.fenced(id).then_some(FENCE_NOTE);
        match (episode, fence) {
            (Some(episode), Some(fence)) => Some(format!("{episode}; {fence}")),
            (episode, fence) => episode.or(fence.map(str::to_owned)),
        }
    }

    /// Fences volume `id` at once: a walk found its pod taking out again what that very walk
    /// had set back.
    pub fn fence(&self, id: &str) -> Note {
        match crate::mutex::lock(&self.fenced).insert(id.to_owned()) {
            true => Note::Fenced,
            false => Note::FencedContinued,
        }
    }

    /// Whether the next walk of volume `id` that finds something fences it.
    pub fn fences_next(&self, id: &str) -> bool {
        let next = |e: &Episode| e.walks_found + 1 >= FENCED_AFTER;
        self.episodes().get(id).is_some_and(next) && !self.fenced(id)
    }

    /// Whether volume `id`'s pod took files out of its size again after they were set back:
    /// then everything in the volume is handed to the quarantine owner and it may make no new
    /// inodes, for as long as node-server runs. An escaper let go at the end of its episode
    /// would start again, and each new start is an interval's worth of writes.
    pub fn fenced(&self, id: &str) -> bool {
        crate::mutex::lock(&self.fenced).contains(id)
    }

    /// Whether volume `id` is walked by the patrol thread of large volumes.
    pub fn is_large(&self, id: &str) -> bool {
        crate::mutex::lock(&self.large).contains(id)
    }

    pub fn set_large(&self, id: &str, large: bool) {
        let mut set = crate::mutex::lock(&self.large);
        match large {
            true => set.insert(id.to_owned()),
            false => set.remove(id),
        };
    }

    /// Whether volume `id` has an episode under way (without describing it).
    pub fn is_under_way(&self, id: &str) -> bool {
        self.episodes().contains_key(id)
    }

    /// The volumes with an episode under way, walked again soon rather than at the next pass.
    pub fn under_way(&self) -> Vec<String> {
        self.episodes().keys().cloned().collect()
    }

    /// The directories of volume `id` whose entries are still to be made again (taken for a
    /// walk, which gives back what it leaves, [`Self::keep_remakes`]).
    pub fn take_remakes(&self, id: &str) -> Pending {
        let mut all = crate::mutex::lock(&self.remakes);
        match all.iter().position(|(of, _)| of == id) {
            Some(at) => all.swap_remove(at).1,
            None => Pending::default(),
        }
    }

    pub fn keep_remakes(&self, id: &str, pending: Pending) {
        if !pending.is_empty() {
            crate::mutex::lock(&self.remakes).push((id.to_owned(), pending));
        }
    }

    /// Forgets the episodes of volumes that are gone.
    pub fn retain(&self, mut live: impl FnMut(&str) -> bool) {
        self.episodes().retain(|id, _| live(id));
        crate::mutex::lock(&self.remakes).retain(|(id, _)| live(id));
        crate::mutex::lock(&self.fenced).retain(|id| live(id));
        crate::mutex::lock(&self.escaped).retain(|id| live(id));
        crate::mutex::lock(&self.large).retain(|id| live(id));
    }

    pub fn totals(&self) -> Totals {
        Totals {
            episodes: self.episodes_total.load(Ordering::Relaxed),
            inodes: self.inodes.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            walks: self.walks.load(Ordering::Relaxed),
            walked: self.walked.load(Ordering::Relaxed),
        }
    }
}

/// What was found and done, in words: the condition's message and the episode's log line.
pub fn describe(project: u32, found: &Tally) -> String {
    let mut parts = Vec::new();
    if found.other_project > 0 {
        let projects: Vec<String> = found.projects.iter().map(u32::to_string).collect();
        parts.push(format!(
            "{} inodes holding {} bytes were in another project than the volume's {project} \
             (project {})",
            found.other_project,
            found.bytes,
            projects.join(", ")
        ));
    }
    if found.no_inherit > 0 {
        parts.push(format!(
            "{} directories had PROJINHERIT cleared",
            found.no_inherit
        ));
    }
    let mut text = match parts.is_empty() {
        true => String::new(),
        false => format!(
            "its files escaped its size: {}; {} set back, so the bytes count to the volume again",
            parts.join(", and "),
            found.repaired
        ),
    };
    if found.again > 0 {
        let sep = if text.is_empty() { "" } else { "; " };
        text.push_str(&format!(
            "{sep}{} directories moved out of the project again while checked, and set back",
            found.again
        ));
    }
    if found.remade > 0 {
        text.push_str(&format!(
            "; {} symlinks, FIFOs, sockets or device nodes made again in the volume's project",
            found.remade
        ));
    }
    if found.quarantined > 0 {
        text.push_str(&format!(
            "; {} handed to the quarantine owner",
            found.quarantined
        ));
    }
    if found.unrepaired > 0 {
        text.push_str(&format!(
            "; {} could not be set back ({})",
            found.unrepaired,
            found.first_error.as_deref().unwrap_or("unknown error")
        ));
    }
    if found.unreached > 0 {
        let sep = if text.is_empty() { "" } else { "; " };
        text.push_str(&format!(
            "{sep}{} entries could not be checked, so its size is not known to hold ({})",
            found.unreached,
            found.first_error.as_deref().unwrap_or("unknown error")
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(other_project: u64, no_inherit: u64, bytes: u64) -> Tally {
        Tally {
            inodes: 10,
            other_project,
            no_inherit,
            bytes,
            repaired: other_project + no_inherit,
            projects: (other_project > 0).then_some(0).into_iter().collect(),
            ..Tally::default()
        }
    }

    #[test]
    fn an_episode_begins_once_continues_and_ends_on_the_first_clean_whole_pass() {
        let escapes = Escapes::default();
        assert_eq!(escapes.record("v", 7, &found(0, 0, 0), true), Note::Clean);
        assert_eq!(
            escapes.record("v", 7, &found(2, 0, 8192), true),
            Note::Began
        );
        assert!(!escapes.fenced("v"));
        assert_eq!(
            escapes.record("v", 7, &found(1, 1, 4096), true),
            Note::Fenced,
            "found again after being set back"
        );
        assert!(escapes.fenced("v"));
        assert!(escapes.condition("v").unwrap().contains("fenced"));
        assert_eq!(escapes.under_way(), ["v"]);
        assert_eq!(escapes.record("v", 7, &found(0, 0, 0), true), Note::Ended);
        assert!(
            escapes.fenced("v"),
            "fenced for as long as node-server runs"
        );
        assert!(escapes.condition("v").unwrap().contains("fenced"));
        assert_eq!(escapes.record("v", 7, &found(0, 0, 0), true), Note::Clean);
        assert_eq!(
            escapes.record("v", 7, &found(1, 0, 1), true),
            Note::FencedContinued
        );
        assert_eq!(escapes.record("w", 7, &found(1, 0, 1), true), Note::Began);
        assert_eq!(
            escapes.record("w", 7, &found(1, 0, 1), false),
            Note::Continued,
            "a root check is not a walk: it does not fence"
        );
        let totals = escapes.totals();
        assert_eq!(
            (totals.episodes, totals.inodes, totals.bytes),
            (3, 7, 12291)
        );
        assert_eq!((totals.walks, totals.walked), (7, 70));
    }

    #[test]
    fn a_pod_that_escapes_again_after_its_episode_ended_is_fenced_at_once() {
        let escapes = Escapes::default();
        assert_eq!(escapes.record("v", 7, &found(1, 0, 1), false), Note::Began);
        assert_eq!(escapes.record("v", 7, &found(0, 0, 0), true), Note::Ended);
        // However long it waited, and whichever check finds it (here a stats call's).
        assert_eq!(escapes.record("v", 7, &found(1, 0, 1), false), Note::Fenced);
        assert!(escapes.fenced("v"));
        // What could not be checked is no escape: a second such episode fences nothing.
        let unreached = Tally {
            unreached: 1,
            ..Tally::default()
        };
        for _ in 0..2 {
            assert_eq!(escapes.record("u", 7, &unreached, true), Note::Began);
            assert_eq!(escapes.record("u", 7, &found(0, 0, 0), true), Note::Ended);
        }
        assert!(!escapes.fenced("u"));
    }

    #[test]
    fn a_walk_noted_early_is_counted_once_and_still_counts_as_a_walk_that_found() {
        let escapes = Escapes::default();
        let early = found(1, 0, 4096);
        assert_eq!(escapes.record("v", 7, &early, false), Note::Began);
        let all = found(3, 0, 12288);
        assert_eq!(
            escapes.record_after_early("v", 7, &all, true, &early),
            Note::Continued,
            "the walk found something: the episode goes on"
        );
        assert_eq!(escapes.totals().bytes, 12288, "counted once");
        assert_eq!(
            escapes.record_after_early("v", 7, &early, true, &early),
            Note::Fenced,
            "a second walk that found something fences, however little was new"
        );
    }

    #[test]
    fn a_walk_cut_short_counts_towards_a_fence_but_never_ends_an_episode() {
        let escapes = Escapes::default();
        assert_eq!(
            escapes.record_cut_walk("v", 7, &found(1, 0, 1)),
            Note::Began
        );
        assert_eq!(
            escapes.record_cut_walk("v", 7, &found(0, 0, 0)),
            Note::Clean,
            "a cut walk that found nothing ends nothing"
        );
        assert!(escapes.condition("v").is_some());
        assert_eq!(
            escapes.record_cut_walk("v", 7, &found(1, 0, 1)),
            Note::Fenced
        );
        assert!(escapes.fenced("v"));
    }

    #[test]
    fn an_entry_the_check_could_not_reach_makes_the_condition_abnormal_and_says_why() {
        let escapes = Escapes::default();
        let unreached = Tally {
            inodes: 10,
            skipped: 1,
            unreached: 1,
            first_error: Some("lost+found is a mount point".into()),
            ..Tally::default()
        };
        assert_eq!(escapes.record("v", 7, &unreached, true), Note::Began);
        let condition = escapes.condition("v").expect("abnormal");
        assert!(
            condition.starts_with("1 entries could not be checked")
                && condition.contains("mount point"),
            "{condition}"
        );
        assert_eq!(escapes.record("v", 7, &found(0, 0, 0), true), Note::Ended);
    }

    #[test]
    fn a_clean_root_check_does_not_end_an_episode_a_dirty_one_begins_it() {
        let escapes = Escapes::default();
        assert_eq!(escapes.record("v", 7, &found(1, 1, 0), false), Note::Began);
        assert_eq!(escapes.record("v", 7, &found(0, 0, 0), false), Note::Clean);
        assert!(escapes.condition("v").is_some(), "still under way");
        assert_eq!(escapes.record("v", 7, &found(0, 0, 0), true), Note::Ended);
        assert_eq!(escapes.totals().walks, 1, "a root check is not a walk");
    }

    #[test]
    fn episodes_are_per_volume() {
        let escapes = Escapes::default();
        assert_eq!(escapes.record("a", 7, &found(1, 0, 1), true), Note::Began);
        assert_eq!(escapes.record("b", 8, &found(1, 0, 1), true), Note::Began);
        assert_eq!(escapes.record("a", 7, &found(0, 0, 0), true), Note::Ended);
        assert!(escapes.condition("a").is_none());
        assert!(escapes.condition("b").is_some());
        escapes.retain(|id| id != "b");
        assert!(
            escapes.condition("b").is_none(),
            "a deleted volume's episode is dropped"
        );
    }

    #[test]
    fn the_condition_says_what_was_found_the_bytes_and_what_was_set_back() {
        let escapes = Escapes::default();
        escapes.record("v", 7, &found(3, 0, 1 << 20), true);
        escapes.record("v", 7, &found(0, 2, 0), true);
        let text = escapes.condition("v").expect("under way");
        assert!(
            text.contains("3 inodes holding 1048576 bytes")
                && text.contains("volume's 7 (project 0)")
                && text.contains("2 directories had PROJINHERIT cleared")
                && text.contains("5 set back"),
            "{text}"
        );
    }

    #[test]
    fn the_walk_after_one_that_found_something_is_the_one_a_finding_fences() {
        let escapes = Escapes::default();
        assert!(!escapes.fences_next("v"), "no episode");
        escapes.record("v", 7, &found(1, 0, 0), false);
        assert!(!escapes.fences_next("v"), "a root check is no walk");
        escapes.record("v", 7, &found(1, 0, 0), true);
        assert!(escapes.fences_next("v"));
        assert_eq!(
            escapes.record_cut_walk("v", 7, &found(1, 0, 0)),
            Note::Fenced
        );
        assert!(!escapes.fences_next("v"), "fenced already");
    }

    #[test]
    fn a_volume_is_fenced_at_once_when_asked_and_only_once() {
        let escapes = Escapes::default();
        escapes.record("v", 7, &found(1, 0, 0), false);
        assert_eq!(escapes.fence("v"), Note::Fenced);
        assert_eq!(escapes.fence("v"), Note::FencedContinued);
        assert!(escapes.fenced("v") && !escapes.fenced("w"));
    }

    #[test]
    fn the_condition_counts_what_was_made_again_in_the_project() {
        let escapes = Escapes::default();
        let tally = Tally {
            remade: 4,
            again: 1,
            ..found(0, 1, 0)
        };
        escapes.record("v", 7, &tally, true);
        let text = escapes.condition("v").expect("under way");
        assert!(
            text.contains("4 symlinks, FIFOs, sockets or device nodes made again")
                && text.contains("1 directories moved out of the project again while checked"),
            "{text}"
        );
    }

    #[test]
    fn what_could_not_be_set_back_is_said_with_its_error() {
        let tally = Tally {
            other_project: 1,
            unrepaired: 1,
            first_error: Some("FS_IOC_FSSETXATTR: EPERM".into()),
            ..Tally::default()
        };
        let text = describe(7, &tally);
        assert!(
            text.contains("1 could not be set back (FS_IOC_FSSETXATTR: EPERM)"),
            "{text}"
        );
    }

    #[test]
    fn the_pace_pauses_only_when_ahead_and_by_enough() {
        let rate = 1000;
        // 500 inodes are due after 0.5 s.
        assert_eq!(
            pause(500, rate, Duration::from_millis(100)),
            Duration::from_millis(400)
        );
        assert_eq!(pause(500, rate, Duration::from_millis(600)), Duration::ZERO);
        assert_eq!(pause(500, rate, Duration::from_millis(490)), Duration::ZERO);
        assert_eq!(pause(0, rate, Duration::ZERO), Duration::ZERO);
        // A rate of 0 is treated as 1 a second, never a division by zero.
        assert_eq!(pause(1, 0, Duration::ZERO), Duration::from_secs(1));
    }
}
