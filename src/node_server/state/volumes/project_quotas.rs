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
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::volume_record::Record;
use crate::linux::quota::{
    self, Decision, Limits, Mode, PROJECT_IDS, ProjectIds, ProjectQuotas, QuotaError, QuotaFs,
};

/// A new size or limit for a volume whose project quota this node does not manage now: the
/// filesystem would keep holding it to the old one.
#[derive(Debug, thiserror::Error)]
#[error(
    "volume {id} is held by project quota {project_id}, which stays at its old limit: {reason}; \
     start node-server with sizes enforced to change it"
)]
pub struct LimitKept {
    pub id: String,
    pub project_id: u32,
    pub reason: String,
}

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
    /// condition. `refuse_new`: `--quota=auto` found a filesystem that cannot enforce sizes,
    /// so no new directory volume is made (its size would silently not hold); `--quota=off`
    /// says unenforced sizes are meant.
    AccountOnly { reason: String, refuse_new: bool },
}

/// What became of a deleted volume's project.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// Its limits are cleared and its ID is free (or it had none).
    Freed,
    /// Files elsewhere are still charged to it (a hard link out of the volume, a file moved
    /// out, one held open past an `umount -l`): it keeps [`LEFTOVER_BYTES`] and as many
    /// inodes as it holds, so nothing more can be written under it, and its ID stays taken.
    Kept(Usage),
}

/// How long a deletion waits for the filesystem to stop charging the removed files to their
/// project before it decides that what is still charged lives elsewhere. XFS inactivates
/// removed inodes in the background (Linux 5.15+): their blocks and the inodes themselves
/// stay charged until that has run, typically milliseconds, longer under load.
pub const SETTLE: Duration = Duration::from_secs(5);

/// The byte limit a deleted volume's project keeps while files elsewhere are still charged
/// to it: one block (0 would mean no limit).
pub const LEFTOVER_BYTES: u64 = 4096;

/// What to do where sizes cannot be enforced, for the start-up warning and every refusal.
fn unenforced_advice() -> &'static str {
    "a directory volume (layout: directory) could outgrow its size and fill this filesystem, so \
     none is made; image volumes (layout: image) hold their size anyway. To hold directory \
     volumes to their size give the state directory XFS mounted with prjquota or ext4 with the \
     project feature and prjquota; to accept sizes that do not hold, pass --quota=off"
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
                let refuse_new = mode != Mode::Off;
                match refuse_new {
                    false => log::info!("{reason}"),
                    // Never silent: a directory volume here could fill the node's disk.
                    true => log::warn!("{reason}: {}", unenforced_advice()),
                }
                Ok(Self::AccountOnly { reason, refuse_new })
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

    /// New IDs in `order` (random unless a test names the IDs it expects).
    pub fn in_order(self, order: quota::Order) -> Self {
        if let Self::Enforcing { ids, .. } = &self {
            let mut ids = Self::ids(ids);
            *ids = ids.clone().in_order(order);
        }
        self
    }

    /// Sizes accounted only, without looking at any filesystem (`--quota=off`).
    pub fn off() -> Self {
        let decision = quota::decide(Mode::Off, || unreachable!("off never probes"));
        Self::AccountOnly {
            reason: decision.reason().unwrap_or_default().to_owned(),
            refuse_new: false,
        }
    }

    /// Why sizes are not enforced, unless they are.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Enforcing { .. } => None,
            Self::AccountOnly { reason, .. } => Some(reason),
        }
    }

    fn ids(ids: &Mutex<ProjectIds>) -> MutexGuard<'_, ProjectIds> {
        // Allocation leaves the set consistent at every step; a panic elsewhere cannot tear it.
        crate::mutex::lock(ids)
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
        let mut ids = Self::ids(ids);
        *ids = ProjectIds::new(PROJECT_IDS, recorded)
            .avoiding(listed)
            .in_order(ids.order());
    }

    /// Whether a new directory volume may be made: not where `--quota=auto` found that its
    /// size could not hold (the one line says why and what to do).
    pub fn check_new_directory(&self) -> Result<(), String> {
        match self {
            Self::AccountOnly {
                reason,
                refuse_new: true,
            } => Err(format!("{reason}: {}", unenforced_advice())),
            _ => Ok(()),
        }
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

    /// Refuses a change of a volume's limits that could not be made: one it has a project
    /// quota for, on a node that does not enforce sizes now (`--quota=off`, or quotas gone from
    /// the filesystem), keeps its old limit in the filesystem, so a new size would be a lie.
    pub fn check_changeable(&self, record: &Record) -> Result<(), LimitKept> {
        match (self, record.project_id) {
            (Self::AccountOnly { reason, .. }, Some(project_id)) => Err(LimitKept {
                id: record.id.clone(),
                project_id,
                reason: reason.clone(),
            }),
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

    /// While the quota check makes a volume's escaped symlinks, FIFOs and the like again in
    /// its project: no inode limit (XFS holds root to it too, and they must come back however
    /// many the pod made). The check puts the limit back ([`Self::apply`], or
    /// [`Self::freeze_inodes`]) when its walk ends.
    pub fn lift_inodes(&self, record: &Record) -> Result<(), QuotaError> {
        match (self, record.project_id) {
            (Self::Enforcing { fs, .. }, Some(id)) => {
                let lifted = Limits {
                    inodes: 0,
                    ..limits(record)
                };
                fs.set_limits(id, lifted)
            }
            _ => Ok(()),
        }
    }

    /// A fenced volume ([`escapes`](crate::node_server::state::escapes)) may make no new
    /// inodes: its inode limit is set to one (0 would mean none), below what it holds, so the
    /// filesystem refuses every new one (a limit at what it holds would let each inode the pod
    /// moves out make room for a new one). Deleting still works. [`Self::apply`] puts the
    /// limit back. The inodes it holds now, if it is enforced.
    pub fn freeze_inodes(&self, record: &Record) -> Result<Option<u64>, QuotaError> {
        let (Self::Enforcing { fs, .. }, Some(id)) = (self, record.project_id) else {
            return Ok(None);
        };
        let held = fs.usage(id)?.inodes;
        let frozen = Limits {
            inodes: 1,
            ..limits(record)
        };
        fs.set_limits(id, frozen)?;
        Ok(Some(held))
    }

    /// While a restore or clone fills a new volume: its byte limit raised by `headroom`, as
    /// a filesystem's transactions reserve a few blocks beyond what they keep (XFS: a
    /// reflink's block-map updates), so a source that fits the size exactly can still be
    /// copied. [`Self::apply`] puts the limit back once the copy is done; what the copy then
    /// holds is checked against the size itself.
    pub fn allow_copy(&self, record: &Record, headroom: u64) -> Result<(), QuotaError> {
        match (self, record.project_id) {
            (Self::Enforcing { fs, .. }, Some(id)) => {
                let mut limits = limits(record);
                limits.bytes = limits.bytes.saturating_add(headroom);
                fs.set_limits(id, limits)
            }
            _ => Ok(()),
        }
    }

    /// Gives a deleted volume's project ID back once nothing is charged to it: its limits
    /// cleared, then free for the next volume. Its data was removed just before, so the
    /// filesystem is given up to `wait` to settle; what is still charged after that lives
    /// elsewhere, would write unlimited if the limits were cleared, and would be charged to
    /// the next volume given the ID: the project keeps a least limit and its ID, and a warning
    /// says so. The caller keeps the record, so the next start or DeleteVolume asks again.
    pub fn release(&self, record: &Record, wait: Duration) -> Result<Released, QuotaError> {
        let (Self::Enforcing { fs, ids }, Some(id)) = (self, record.project_id) else {
            return Ok(Released::Freed);
        };
        let left = settled_usage(&**fs, id, wait)?;
        if !left.is_empty() {
            let kept = Limits {
                bytes: LEFTOVER_BYTES,
                inodes: left.inodes.max(1),
            };
            fs.set_limits(id, kept)?;
            log::warn!(
                "volume {} is deleted, but {} bytes in {} inodes elsewhere are still charged \
                 to its project quota {id}: the project keeps a limit of {} bytes and {} \
                 inodes, and its ID is not reused until they are gone",
                record.id,
                left.bytes,
                left.inodes,
                kept.bytes,
                kept.inodes
            );
            return Ok(Released::Kept(left));
        }
        fs.release(None, id)?;
        Self::ids(ids).free(id);
        Ok(Released::Freed)
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
            (Self::AccountOnly { reason, .. }, None) => return Ok(Hold::Accounted(reason.clone())),
            // Its limit stays in the filesystem (as with --quota=off on a prepared one), but
            // is neither read nor kept up to date now.
            (Self::AccountOnly { reason, .. }, Some(id)) => {
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

/// Project `id`'s usage once the filesystem has settled, or as it is after `wait`.
fn settled_usage(fs: &dyn ProjectQuotas, id: u32, wait: Duration) -> Result<Usage, QuotaError> {
    let deadline = Instant::now() + wait;
    let mut pause =
        crate::backoff::Doubling::new(Duration::from_millis(5), Duration::from_millis(200));
    loop {
        // Best effort: the usage read after it is what decides.
        if let Err(e) = fs.settle() {
            log::warn!("{e}");
        }
        let usage = fs.usage(id)?;
        let now = Instant::now();
        if usage.is_empty() || now >= deadline {
            return Ok(usage);
        }
        std::thread::sleep(pause.next_delay().min(deadline - now));
    }
}

/// A volume's limits: its capacity in bytes (at least one byte, as 0 would mean no limit),
/// and its `inodeLimit`, else the default inode limit for its size.
fn limits(record: &Record) -> Limits {
    Limits {
        bytes: record.capacity.max(1),
        inodes: crate::node_server::state::capacity::inode_limit(
            record.attributes.inode_limit,
            record.capacity,
        ),
    }
}

#[cfg(test)]
mod tests;
