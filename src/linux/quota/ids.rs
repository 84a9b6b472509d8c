//! Project IDs for volumes: never one that is in use on the filesystem, never one handed out
//! twice, freed when the volume goes.
//!
//! In use means any of: recorded by one of our volumes (the caller passes those in at
//! start-up, from the volume records), a quota record on the filesystem (usage or limits:
//! `Q_XGETNEXTQUOTA` / `Q_GETNEXTQUOTA`, which sees every directory tagged with the ID, ours
//! or not), or listed in `/etc/projects` / `/etc/projid` when the caller can read them
//! (xfs_quota's files, which the kubelet also writes; an ID reserved there may have no quota
//! record yet).
//!
//! The range: the kubelet's emptyDir quotas count up from 1048577 (2^20 + 1), systemd's
//! exec-directory quotas use 2^31 .. 2^32 - 2, administrators and container runtimes use
//! small IDs. Ours is the 2^24 IDs from 2^30, far from all three; the scan keeps even a
//! collision inside it harmless.
//!
//! Where in the range: a new ID is the first free one from a random point (wrapping round),
//! not the lowest, so the ID of the next volume cannot be guessed. A pod can read its own
//! volume's ID (`lsattr -pd`) and, as its files' owner, move them into another project; with
//! sequential IDs it could aim at a neighbour's (its own ID plus one), and charge its writes to
//! it. Among 2^24 IDs, a pod that guesses almost surely lands in a project nobody uses: that
//! escapes its own limit (which no ID choice prevents) but charges no neighbour.

use std::collections::BTreeSet;
use std::ops::RangeInclusive;
use std::path::Path;

use super::fs::QuotaFs;
use super::quota_error::QuotaError;
use crate::path_io::PathIoError;

/// The IDs csi-nodekit gives volumes (see the module documentation for why these).
pub const PROJECT_IDS: RangeInclusive<u32> = (1 << 30)..=((1 << 30) + (1 << 24) - 1);

/// Where allocation learns which IDs the filesystem already uses.
pub trait InUse {
    /// The lowest ID at or above `from` with a quota record, if any.
    fn next_in_use(&self, from: u32) -> Result<Option<u32>, QuotaError>;
    /// The filesystem, for error messages.
    fn path(&self) -> &Path;
}

impl InUse for QuotaFs {
    fn next_in_use(&self, from: u32) -> Result<Option<u32>, QuotaError> {
        QuotaFs::next_in_use(self, from)
    }
    fn path(&self) -> &Path {
        QuotaFs::path(self)
    }
}

/// The allocator: the range, the IDs our volumes hold, and the IDs the project files list.
/// Callers serialise access (it is `&mut self`) and record an allocated ID in the volume's
/// record before tagging the directory, so a crash cannot leave an unrecorded tagged ID.
#[derive(Debug, Clone)]
pub struct ProjectIds {
    range: RangeInclusive<u32>,
    taken: BTreeSet<u32>,
    listed: BTreeSet<u32>,
    order: Order,
}

/// Where an allocation starts looking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// From a random ID of the range: what volumes get.
    Random,
    /// From the range's start: the lowest free ID, for tests that name the IDs they expect.
    LowestFirst,
}

impl ProjectIds {
    /// An allocator over `range` that knows the IDs our volumes already hold.
    pub fn new(range: RangeInclusive<u32>, recorded: impl IntoIterator<Item = u32>) -> Self {
        Self {
            range,
            taken: recorded.into_iter().collect(),
            listed: BTreeSet::new(),
            order: Order::Random,
        }
    }

    /// Allocates in `order` from now on.
    pub fn in_order(mut self, order: Order) -> Self {
        self.order = order;
        self
    }

    pub fn order(&self) -> Order {
        self.order
    }

    /// Also avoids these IDs (from [`read_listed`]).
    pub fn avoiding(mut self, listed: BTreeSet<u32>) -> Self {
        self.listed = listed;
        self
    }

    /// An ID of the range that nobody uses, the first one from where [`Order`] starts,
    /// wrapping round to the range's start; it is ours until [`Self::free`].
    pub fn allocate(&mut self, fs: &(impl InUse + ?Sized)) -> Result<u32, QuotaError> {
        let (start, end) = (*self.range.start(), *self.range.end());
        let first = match self.order {
            Order::LowestFirst => start,
            Order::Random => random_in(start, end)?,
        };
        let mut candidate = first;
        loop {
            let ours_free = !self.taken.contains(&candidate) && !self.listed.contains(&candidate);
            if ours_free && fs.next_in_use(candidate)? != Some(candidate) {
                self.taken.insert(candidate);
                return Ok(candidate);
            }
            candidate = if candidate == end {
                start
            } else {
                candidate + 1
            };
            if candidate == first {
                return Err(QuotaError::Exhausted {
                    start,
                    end,
                    path: fs.path().to_owned(),
                });
            }
        }
    }

    /// Gives an ID back (its volume is gone); true if it was taken.
    pub fn free(&mut self, id: u32) -> bool {
        self.taken.remove(&id)
    }

    pub fn is_taken(&self, id: u32) -> bool {
        self.taken.contains(&id)
    }
}

/// A uniformly random ID in `start..=end`, from getrandom(2).
fn random_in(start: u32, end: u32) -> Result<u32, QuotaError> {
    let span = u64::from(end - start) + 1;
    let draw = getrandom::u64().map_err(|e| QuotaError::Random(e.to_string()))?;
    // 2^64 is a multiple of every power of two and close enough for any other span.
    Ok(start + (draw % span) as u32)
}

/// The IDs named in xfs_quota's project files: `/etc/projects` lines are `id:directory`,
/// `/etc/projid` lines `name:id`; `#` starts a comment. A missing file lists nothing.
pub fn read_listed(paths: &[&Path]) -> Result<BTreeSet<u32>, QuotaError> {
    let mut ids = BTreeSet::new();
    for path in paths {
        match std::fs::read_to_string(path) {
            Ok(text) => ids.extend(parse_listed(&text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(PathIoError::new("read", path, source).into());
            }
        }
    }
    Ok(ids)
}

/// The IDs in one project file, of either format.
pub fn parse_listed(text: &str) -> impl Iterator<Item = u32> + '_ {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (left, right) = line.split_once(':')?;
            let number = |s: &str| {
                let s = s.trim();
                (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| s.parse::<u32>().ok())
                    .flatten()
            };
            number(right).or_else(|| number(left))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A filesystem whose quota records are a set of IDs; counts the scans.
    struct FakeFs {
        in_use: BTreeSet<u32>,
        scans: std::cell::Cell<usize>,
    }

    impl FakeFs {
        fn with(ids: impl IntoIterator<Item = u32>) -> Self {
            Self {
                in_use: ids.into_iter().collect(),
                scans: 0.into(),
            }
        }
    }

    impl InUse for FakeFs {
        fn next_in_use(&self, from: u32) -> Result<Option<u32>, QuotaError> {
            self.scans.set(self.scans.get() + 1);
            Ok(self.in_use.range(from..).next().copied())
        }
        fn path(&self) -> &Path {
            Path::new("/fake")
        }
    }

    const START: u32 = *PROJECT_IDS.start();

    #[test]
    fn the_range_avoids_the_kubelet_systemd_and_small_administrator_ids() {
        assert!(*PROJECT_IDS.start() > 1_048_577 + 1_000_000);
        assert!(*PROJECT_IDS.end() < 1 << 31);
        assert_eq!(PROJECT_IDS.clone().count(), 1 << 24);
    }

    #[test]
    fn the_first_allocation_is_the_start_of_an_empty_range() {
        let mut ids = ProjectIds::new(PROJECT_IDS, []).in_order(Order::LowestFirst);
        assert_eq!(ids.allocate(&FakeFs::with([])).unwrap(), START);
        assert!(ids.is_taken(START));
    }

    #[test]
    fn an_id_with_a_quota_record_on_the_filesystem_is_never_returned() {
        let fs = FakeFs::with([START, START + 1, START + 3]);
        let mut ids = ProjectIds::new(PROJECT_IDS, []).in_order(Order::LowestFirst);
        assert_eq!(ids.allocate(&fs).unwrap(), START + 2);
        assert_eq!(ids.allocate(&fs).unwrap(), START + 4);
    }

    #[test]
    fn ids_recorded_by_our_volumes_are_skipped_without_asking_the_filesystem() {
        let fs = FakeFs::with([]);
        let mut ids = ProjectIds::new(PROJECT_IDS, [START, START + 1]).in_order(Order::LowestFirst);
        assert_eq!(ids.allocate(&fs).unwrap(), START + 2);
        assert_eq!(fs.scans.get(), 1);
    }

    #[test]
    fn an_id_is_not_handed_out_twice_before_it_is_freed() {
        let fs = FakeFs::with([]);
        let mut ids = ProjectIds::new(PROJECT_IDS, []).in_order(Order::LowestFirst);
        let a = ids.allocate(&fs).unwrap();
        let b = ids.allocate(&fs).unwrap();
        assert_ne!(a, b);
        assert!(ids.free(a));
        assert!(
            !ids.free(a),
            "freeing twice reports the second as not taken"
        );
        assert_eq!(ids.allocate(&fs).unwrap(), a, "a freed ID is reused");
    }

    #[test]
    fn ids_listed_in_project_files_are_avoided() {
        let listed = parse_listed("# admin\nbackup:1073741824\n1073741825:/srv/data\n").collect();
        let mut ids = ProjectIds::new(PROJECT_IDS, [])
            .in_order(Order::LowestFirst)
            .avoiding(listed);
        assert_eq!(ids.allocate(&FakeFs::with([])).unwrap(), START + 2);
    }

    #[test]
    fn a_full_range_is_an_error_naming_the_range_and_the_filesystem() {
        let mut ids = ProjectIds::new(10..=12, [10]);
        let fs = FakeFs::with([11, 12]);
        let err = ids.allocate(&fs).expect_err("range is full");
        assert_eq!(
            err.to_string(),
            "no free project ID left in 10..=12 on /fake"
        );
    }

    #[test]
    fn the_last_id_of_the_range_can_be_allocated() {
        let mut ids =
            ProjectIds::new(u32::MAX - 1..=u32::MAX, [u32::MAX - 1]).in_order(Order::LowestFirst);
        assert_eq!(ids.allocate(&FakeFs::with([])).unwrap(), u32::MAX);
        assert!(ids.allocate(&FakeFs::with([])).is_err());
    }

    #[test]
    fn random_allocations_hand_out_every_free_id_once_and_none_in_use() {
        let fs = FakeFs::with([105, 130]);
        let mut ids = ProjectIds::new(100..=163, [101]);
        let drawn: BTreeSet<u32> = (0..61).map(|_| ids.allocate(&fs).unwrap()).collect();
        let free: BTreeSet<u32> = (100..=163)
            .filter(|id| ![101, 105, 130].contains(id))
            .collect();
        assert_eq!(drawn, free, "each free ID once, none in use");
        assert!(ids.allocate(&fs).is_err(), "then the range is full");
    }

    #[test]
    fn random_allocations_spread_over_the_whole_range() {
        let fs = FakeFs::with([]);
        let mut ids = ProjectIds::new(PROJECT_IDS, []);
        let drawn: BTreeSet<u32> = (0..64).map(|_| ids.allocate(&fs).unwrap()).collect();
        let spread = drawn.last().unwrap() - drawn.first().unwrap();
        // 64 uniform draws over 2^24 IDs span less than half the range with odds of ~1e-17.
        assert!(spread > 1 << 23, "IDs bunched together: {drawn:?}");
    }

    #[test]
    fn a_random_start_wraps_round_to_find_the_last_free_id() {
        let mut ids = ProjectIds::new(10..=19, (10..=19).filter(|&id| id != 10));
        assert_eq!(ids.allocate(&FakeFs::with([])).unwrap(), 10);
        let err = ids.allocate(&FakeFs::with([])).expect_err("full");
        assert!(err.to_string().contains("10..=19"), "{err}");
    }

    #[test]
    fn project_files_of_both_formats_and_junk_lines_parse() {
        let ids: Vec<u32> = parse_listed(
            "42:/srv\nvolume7:7\n#9:/x\n  logs : 11 \nbad\n:\nname:\nx:y\n99999999999:/too-big\n",
        )
        .collect();
        assert_eq!(ids, vec![42, 7, 11]);
    }

    #[test]
    fn missing_project_files_list_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let projid = dir.path().join("projid");
        std::fs::write(&projid, "a:5\n").unwrap();
        let listed = read_listed(&[&dir.path().join("projects"), &projid]).unwrap();
        assert_eq!(listed, BTreeSet::from([5]));
    }
}
