//! Project quotas for volume directories, by syscalls alone (no xfs_quota, no setquota: the
//! image is `FROM scratch`). Each volume directory gets its own project ID with
//! PROJINHERIT and a hard block (and optionally inode) limit; its usage comes back from the
//! same quota record.
//!
//! - [`sys`] — the raw kernel interfaces: quotactl / quotactl_fd, FS_IOC_FS{GET,SET}XATTR.
//! - [`fs`] — [`QuotaFs`]: one filesystem (XFS or ext4), how quotactl reaches it, and
//!   whether it accounts and enforces project quotas ([`Support`]).
//! - [`limits`] — a project's limits and usage; assigning a directory and releasing it.
//! - [`project`] — a directory's project ID and PROJINHERIT flag.
//! - [`escape`] — one inode out of its volume's project, put back; the tally of a check.
//! - [`escape_walk`] — the walk that holds a volume's tree to its project.
//! - [`remake`] — a symlink, FIFO, socket or device node of an escaped directory made again
//!   in the project; `remakes` — what the walk keeps of that from one walk to the next;
//!   [`xfs_bulkstat`] — such an inode's project ID on XFS, read by its number (on ext4 it
//!   is asked by a hard link, `Aside::probe`).
//! - [`write_watch`] — every file written on a filesystem, as it is written (fanotify), so an
//!   escaped file is found when it is written, not at the next walk.
//! - [`ids`] — [`ProjectIds`], the allocator that never collides with IDs in use.
//! - [`mode`] — `--quota=auto|on|off` → [`Decision`].
//! - [`quota_seam`] — [`ProjectQuotas`], the trait the volume logic calls (a recording fake
//!   for unit tests).
//! - `quota_error` — [`QuotaError`].
//!
//! Kernels: Linux 5.14+ is served through quotactl_fd on the state directory; older kernels
//! (from 4.6, the first with ext4 project quotas and their iteration) through the block
//! device node the mount table names, which must then exist in the container's `/dev`.

pub mod escape;
pub mod escape_walk;
pub mod fs;
pub mod ids;
pub mod limits;
pub mod mode;
pub mod project;
mod quota_error;
pub mod quota_seam;
pub mod remake;
mod remakes;
pub mod sys;
pub mod write_watch;
pub mod xfs_bulkstat;

pub use fs::{Access, FsKind, QuotaFs, Support};
pub use ids::{InUse, Order, PROJECT_IDS, ProjectIds, read_listed};
pub use limits::{Limits, Usage};
pub use mode::{Decision, Mode, decide};
pub use project::{ProjectAttr, clear_project, project_of, set_project};
pub use quota_error::{QuotaError, QuotaOp};
pub use quota_seam::ProjectQuotas;
