//! What node-server does with project quotas ([`quota`](crate::linux::quota)) for its volumes:
//! decided once at start-up from `--quota` and the filesystem of the volume directories, then
//! applied through every volume's life — a project ID and a hard limit of its capacity (and
//! of its `inodeLimit`, if it has one) at creation, the limits changed at expansion and by
//! ControllerModifyVolume, the ID released at deletion, and the volume's own
//! usage for its stats.
//!
//! A volume whose record has no project ID (created with `--quota=off`, on a filesystem
//! without project quotas, or by a version before quotas) stays unenforced, and its stats say
//! so. Its tree is not tagged after the fact: the tagging ioctl reaches neither symlinks nor
//! device nodes, so the limit would still not hold the whole tree, and a volume that already
//! holds more than its size would stop its pod's writes at once.

use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::linux::quota::{
    self, Decision, Limits, Mode, PROJECT_IDS, ProjectIds, ProjectQuotas, QuotaError, QuotaFs,
};
use crate::node_server::state::store::Record;

pub use crate::linux::quota::Usage;

/// The files xfs_quota (and the kubelet) name project IDs in; read when the node has them.
const PROJECT_FILES: [&str; 2] = ["/etc/projects", "/etc/projid"];

/// `--quota=on` on a filesystem that cannot enforce: the one line node-server exits with.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct QuotaRefused(pub String);

/// How sizes hold on this node.
#[derive(Debug)]
pub enum VolumeQuotas {
    /// Every new volume gets a project ID and a hard limit of its capacity.
    Enforcing {
        fs: Box<dyn ProjectQuotas>,
        ids: Mutex<ProjectIds>,
    },
    /// Sizes are accounted, not enforced; `reason` is said at start-up and in every stats
    /// condition.
    AccountOnly { reason: String },
}

/// How one volume's size holds, for its stats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// Its project quota: its own usage and the limit in force.
    Enforced { project_id: u32, usage: Usage },
    /// Accounted, not enforced, and why.
    Accounted(String),
}

impl VolumeQuotas {
    /// Decides for `mode` on the filesystem holding `dir` (the volume directories), and says
    /// once why sizes are not enforced when they are not. `off` never touches quotas.
    pub fn start(dir: &Path, mode: Mode) -> Result<Self, QuotaRefused> {
        let mut opened = None;
        let decision = quota::decide(mode, || {
            let fs = QuotaFs::open(dir)?;
            let support = fs.support();
            opened = Some(fs);
            support
        });
        match (decision, opened) {
            (Decision::Enforce, Some(fs)) => {
                log::info!(
                    "volume sizes are enforced by project quotas on {}",
                    dir.display()
                );
                Ok(Self::enforcing(Box::new(fs)))
            }
            (Decision::Refuse { reason }, _) => Err(QuotaRefused(reason)),
            (decision, _) => {
                let reason = decision.reason().unwrap_or_default().to_owned();
                log::info!("{reason}");
                Ok(Self::AccountOnly { reason })
            }
        }
    }

    /// Sizes enforced by `quotas`, before [`Self::adopt`] has seen the records.
    pub fn enforcing(quotas: Box<dyn ProjectQuotas>) -> Self {
        Self::Enforcing {
            fs: quotas,
            ids: Mutex::new(ProjectIds::new(PROJECT_IDS, [])),
        }
    }

    /// Sizes accounted only, without looking at any filesystem (`--quota=off`).
    pub fn off() -> Self {
        let decision = quota::decide(Mode::Off, || unreachable!("off never probes"));
        Self::AccountOnly {
            reason: decision.reason().unwrap_or_default().to_owned(),
        }
    }

    /// Why sizes are not enforced, unless they are.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Enforcing { .. } => None,
            Self::AccountOnly { reason } => Some(reason),
        }
    }

    fn ids(ids: &Mutex<ProjectIds>) -> MutexGuard<'_, ProjectIds> {
        // Allocation leaves the set consistent at every step; a panic elsewhere cannot tear it.
        ids.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// At start-up: takes the project IDs the records hold (and those the project files
    /// list), and puts each recorded volume back under its limit, which also finishes a
    /// creation or an expansion a crash interrupted. A volume that cannot be put back is
    /// reported and left as it is: its stats then say it is not enforced.
    pub fn adopt<'a>(&self, volumes: impl IntoIterator<Item = (&'a Path, &'a Record)>) {
        let Self::Enforcing { fs, ids } = self else {
            return;
        };
        let paths: Vec<&Path> = PROJECT_FILES.iter().map(Path::new).collect();
        let listed = quota::read_listed(&paths).unwrap_or_else(|e| {
            log::warn!("project IDs listed on this node are not avoided: {e}");
            Default::default()
        });
        let mut recorded = Vec::new();
        for (dir, record) in volumes {
            let Some(id) = record.project_id else {
                continue;
            };
            recorded.push(id);
            if dir.is_dir()
                && let Err(e) = fs.assign(dir, id, limits(record))
            {
                log::error!("volume {} is not held to its size: {e}", record.id);
            }
        }
        *Self::ids(ids) = ProjectIds::new(PROJECT_IDS, recorded).avoiding(listed);
    }

    /// A project ID for a new volume, when sizes are enforced.
    pub fn allocate(&self) -> Result<Option<u32>, QuotaError> {
        match self {
            Self::Enforcing { fs, ids } => Self::ids(ids).allocate(&**fs).map(Some),
            Self::AccountOnly { .. } => Ok(None),
        }
    }

    /// Puts a new volume's directory in its project, under a limit of its capacity.
    pub fn assign(&self, dir: &Path, record: &Record) -> Result<(), QuotaError> {
        match (self, record.project_id) {
            (Self::Enforcing { fs, .. }, Some(id)) => fs.assign(dir, id, limits(record)),
            _ => Ok(()),
        }
    }

    /// Sets a volume's limit to its (new) capacity, at once.
    pub fn apply(&self, record: &Record) -> Result<(), QuotaError> {
        match (self, record.project_id) {
            (Self::Enforcing { fs, .. }, Some(id)) => fs.set_limits(id, limits(record)),
            _ => Ok(()),
        }
    }

    /// Gives a deleted volume's project ID back: its limits cleared (its directory is gone,
    /// so nothing is charged to it any more), then free for the next volume.
    pub fn release(&self, record: &Record) -> Result<(), QuotaError> {
        if let (Self::Enforcing { fs, ids }, Some(id)) = (self, record.project_id) {
            fs.release(None, id)?;
            Self::ids(ids).free(id);
        }
        Ok(())
    }

    /// Undoes [`Self::allocate`] and [`Self::assign`] for a creation that failed; best
    /// effort, as the creation's own error is the one to report.
    pub fn abandon(&self, dir: &Path, record: &Record) {
        if let (Self::Enforcing { fs, ids }, Some(id)) = (self, record.project_id) {
            if let Err(e) = fs.release(Some(dir), id) {
                log::warn!("releasing project {id} of failed volume {}: {e}", record.id);
            }
            Self::ids(ids).free(id);
        }
    }

    /// How a volume's size holds: its project's usage and limit, or why it is not enforced.
    pub fn hold(&self, record: &Record) -> Result<Hold, QuotaError> {
        let (fs, id) = match (self, record.project_id) {
            (Self::AccountOnly { reason }, None) => return Ok(Hold::Accounted(reason.clone())),
            // Its limit stays in the filesystem (as with --quota=off on a prepared one), but
            // is neither read nor kept up to date now.
            (Self::AccountOnly { reason }, Some(id)) => {
                return Ok(Hold::Accounted(format!(
                    "{reason}; its project quota {id}, set while sizes were enforced, may \
                     still limit it"
                )));
            }
            (Self::Enforcing { .. }, None) => {
                return Ok(Hold::Accounted(
                    "the volume was created while sizes were not enforced (with --quota=off, \
                     without project quotas, or before them): its size is accounted, not \
                     enforced"
                        .into(),
                ));
            }
            (Self::Enforcing { fs, .. }, Some(id)) => (fs, id),
        };
        let usage = fs.usage(id)?;
        if usage.limits.bytes == 0 {
            return Ok(Hold::Accounted(format!(
                "project quota {id} of the volume has no block limit: its size is accounted, \
                 not enforced"
            )));
        }
        Ok(Hold::Enforced {
            project_id: id,
            usage,
        })
    }
}

/// A volume's limits: its capacity in bytes (at least one byte, as 0 would mean no limit),
/// and its `inodeLimit` (none unless one was set).
fn limits(record: &Record) -> Limits {
    Limits {
        bytes: record.capacity.max(1),
        inodes: record.attributes.inodes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(project_id: Option<u32>) -> Record {
        Record {
            id: "v".into(),
            capacity: 0,
            project_id,
            ..Default::default()
        }
    }

    #[test]
    fn off_accounts_without_touching_any_filesystem_and_says_why() {
        let q = VolumeQuotas::start(Path::new("/nonexistent/volumes"), Mode::Off).unwrap();
        let reason = q.reason().expect("a reason").to_owned();
        assert!(reason.contains("--quota=off"), "{reason}");
        assert_eq!(q.allocate().unwrap(), None);
        assert_eq!(
            q.hold(&record(None)).unwrap(),
            Hold::Accounted(reason.clone())
        );
        let Hold::Accounted(why) = q.hold(&record(Some(7))).unwrap() else {
            panic!("not enforced")
        };
        assert!(
            why.starts_with(&reason) && why.contains("project quota 7"),
            "{why}"
        );
        q.apply(&record(Some(7))).unwrap();
        q.release(&record(Some(7))).unwrap();
    }

    #[test]
    fn auto_on_a_filesystem_without_project_quotas_accounts_and_on_refuses() {
        // /proc is neither XFS nor ext4 on any machine.
        let q = VolumeQuotas::start(Path::new("/proc"), Mode::Auto).unwrap();
        let reason = q.reason().expect("not enforcing");
        assert!(reason.contains("not on XFS or ext4"), "{reason}");
        let refused = VolumeQuotas::start(Path::new("/proc"), Mode::On).unwrap_err();
        assert!(refused.0.starts_with("--quota=on: /proc"), "{refused}");
    }

    #[test]
    fn a_directory_that_cannot_be_opened_is_a_reason_not_a_crash() {
        let q = VolumeQuotas::start(Path::new("/nonexistent/volumes"), Mode::Auto).unwrap();
        assert!(q.reason().unwrap().contains("/nonexistent/volumes"));
    }

    #[test]
    fn a_zero_size_is_held_to_one_byte_not_left_unlimited() {
        assert_eq!(limits(&record(None)).bytes, 1);
    }

    #[test]
    fn the_inode_limit_is_the_volumes_inode_limit_attribute_and_none_by_default() {
        assert_eq!(limits(&record(None)).inodes, 0);
        let mut limited = record(Some(7));
        limited.attributes.inode_limit = Some(500);
        assert_eq!(limits(&limited).inodes, 500);
    }

    use crate::linux::quota::seam::fake::{Call, RecordingQuotas};
    use crate::linux::quota::{Limits, Usage};

    /// Quotas enforced by a fake the test keeps a handle on.
    fn enforcing(quotas: RecordingQuotas) -> (VolumeQuotas, RecordingQuotas) {
        (VolumeQuotas::enforcing(Box::new(quotas.clone())), quotas)
    }

    fn sized(id: &str, capacity: u64, project_id: Option<u32>) -> Record {
        Record {
            id: id.into(),
            capacity,
            project_id,
            ..Default::default()
        }
    }

    #[test]
    fn start_up_puts_every_recorded_volume_back_under_its_limit_and_never_reuses_its_id() {
        let dirs = tempfile::tempdir().unwrap();
        let (a, b) = (dirs.path().join("a"), dirs.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        let first = *PROJECT_IDS.start();
        let (q, fake) = enforcing(RecordingQuotas::default());
        let (ra, rb) = (sized("a", 10, Some(first)), sized("b", 20, Some(first + 1)));
        q.adopt([(a.as_path(), &ra), (b.as_path(), &rb)]);
        assert_eq!(
            fake.calls(),
            [
                Call::Assign(
                    a,
                    first,
                    Limits {
                        bytes: 10,
                        inodes: 0
                    }
                ),
                Call::Assign(
                    b,
                    first + 1,
                    Limits {
                        bytes: 20,
                        inodes: 0
                    }
                ),
            ]
        );
        assert_eq!(q.allocate().unwrap(), Some(first + 2));
    }

    #[test]
    fn a_volume_that_cannot_be_put_back_does_not_stop_the_others_or_free_its_id() {
        let dirs = tempfile::tempdir().unwrap();
        let (a, b) = (dirs.path().join("a"), dirs.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        let first = *PROJECT_IDS.start();
        let quotas = RecordingQuotas {
            failing_dir: Some(a.clone()),
            ..Default::default()
        };
        let (q, fake) = enforcing(quotas);
        let (ra, rb) = (sized("a", 10, Some(first)), sized("b", 20, Some(first + 1)));
        q.adopt([(a.as_path(), &ra), (b.as_path(), &rb)]);
        assert_eq!(fake.calls().len(), 2, "b was adopted after a failed");
        assert_eq!(q.allocate().unwrap(), Some(first + 2), "a's ID stays taken");
    }

    #[test]
    fn a_recorded_volume_whose_directory_is_gone_keeps_its_id_without_a_call() {
        let first = *PROJECT_IDS.start();
        let (q, fake) = enforcing(RecordingQuotas::default());
        let gone = sized("gone", 10, Some(first));
        q.adopt([(Path::new("/nonexistent/volume"), &gone)]);
        assert_eq!(fake.calls(), []);
        assert_eq!(q.allocate().unwrap(), Some(first + 1));
    }

    #[test]
    fn allocation_skips_ids_the_filesystem_already_uses_whoever_made_them() {
        let first = *PROJECT_IDS.start();
        let quotas = RecordingQuotas::default();
        for id in [first, first + 1, first + 3] {
            quotas.projects.lock().unwrap().insert(id, Usage::default());
        }
        let (q, _quotas) = enforcing(quotas);
        q.adopt([]);
        assert_eq!(q.allocate().unwrap(), Some(first + 2));
        assert_eq!(q.allocate().unwrap(), Some(first + 4));
    }

    #[test]
    fn a_deleted_volumes_limits_are_cleared_and_its_id_is_free_for_the_next() {
        let (q, fake) = enforcing(RecordingQuotas::default());
        q.adopt([]);
        let id = q.allocate().unwrap().unwrap();
        let record = sized("v", 4096, Some(id));
        q.apply(&record).unwrap();
        q.release(&record).unwrap();
        assert_eq!(
            fake.calls(),
            [
                Call::SetLimits(
                    id,
                    Limits {
                        bytes: 4096,
                        inodes: 0
                    }
                ),
                Call::Release(None, id),
            ]
        );
        assert_eq!(q.allocate().unwrap(), Some(id));
    }

    #[test]
    fn a_failed_creation_untags_its_directory_and_gives_the_id_back() {
        let (q, fake) = enforcing(RecordingQuotas::default());
        q.adopt([]);
        let id = q.allocate().unwrap().unwrap();
        let dir = Path::new("/state/volumes/v");
        q.abandon(dir, &sized("v", 1, Some(id)));
        assert_eq!(fake.calls(), [Call::Release(Some(dir.to_owned()), id)]);
        assert_eq!(q.allocate().unwrap(), Some(id));
    }

    #[test]
    fn a_volumes_hold_is_its_projects_usage_or_says_why_it_is_not_enforced() {
        let first = *PROJECT_IDS.start();
        let quotas = RecordingQuotas::default();
        let usage = Usage {
            bytes: 512,
            inodes: 3,
            limits: Limits {
                bytes: 4096,
                inodes: 0,
            },
        };
        quotas.projects.lock().unwrap().insert(first, usage);
        quotas
            .projects
            .lock()
            .unwrap()
            .insert(first + 1, Usage::default());
        let (q, _quotas) = enforcing(quotas);
        assert_eq!(
            q.hold(&sized("v", 4096, Some(first))).unwrap(),
            Hold::Enforced {
                project_id: first,
                usage
            }
        );
        let Hold::Accounted(why) = q.hold(&sized("w", 4096, Some(first + 1))).unwrap() else {
            panic!("a project without a block limit is not enforced")
        };
        assert!(why.contains("no block limit"), "{why}");
        let Hold::Accounted(why) = q.hold(&sized("old", 4096, None)).unwrap() else {
            panic!("a volume without a project is not enforced")
        };
        assert!(
            why.contains("created while sizes were not enforced"),
            "{why}"
        );
    }
}
