//! [`ProjectQuotas`]: what node-server asks of one filesystem's project quotas, behind a trait
//! as [`Mounter`](crate::linux::mount::Mounter) is for mounts. [`QuotaFs`] is the real thing
//! (quotactl and the FS_IOC_FSSETXATTR ioctl); `fake::RecordingQuotas` (in unit tests) records the calls so
//! that the volume logic above it (adopting recorded projects at start-up, allocating around
//! IDs in use, releasing, reporting a volume's hold) is unit-tested on any machine. The build
//! machines' own kernel has no XFS or ext4 quota support: the real calls are tested in a VM.

use std::path::Path;

use super::fs::QuotaFs;
use super::ids::InUse;
use super::limits::{Limits, Usage};
use super::quota_error::QuotaError;

/// One filesystem's project quotas.
pub trait ProjectQuotas: InUse + Send + Sync + std::fmt::Debug {
    /// Gives directory `dir` project `id` (with PROJINHERIT) under `limits`.
    fn assign(&self, dir: &Path, id: u32, limits: Limits) -> Result<(), QuotaError>;
    /// Sets project `id`'s hard limits.
    fn set_limits(&self, id: u32, limits: Limits) -> Result<(), QuotaError>;
    /// Clears project `id`'s limits and, if `dir` still exists, its tag.
    fn release(&self, dir: Option<&Path>, id: u32) -> Result<(), QuotaError>;
    /// Project `id`'s usage and limits.
    fn usage(&self, id: u32) -> Result<Usage, QuotaError>;
    /// Brings usage up to date after files were removed (XFS charges removed inodes to
    /// their project until its background inactivation has run).
    fn settle(&self) -> Result<(), QuotaError>;
}

impl ProjectQuotas for QuotaFs {
    fn assign(&self, dir: &Path, id: u32, limits: Limits) -> Result<(), QuotaError> {
        QuotaFs::assign(self, dir, id, limits)
    }
    fn set_limits(&self, id: u32, limits: Limits) -> Result<(), QuotaError> {
        QuotaFs::set_limits(self, id, limits)
    }
    fn release(&self, dir: Option<&Path>, id: u32) -> Result<(), QuotaError> {
        QuotaFs::release(self, dir, id)
    }
    fn usage(&self, id: u32) -> Result<Usage, QuotaError> {
        QuotaFs::usage(self, id)
    }
    fn settle(&self) -> Result<(), QuotaError> {
        QuotaFs::settle(self)
    }
}

#[cfg(test)]
pub mod fake {
    //! A filesystem's project quotas in memory: limits and usage per ID, the calls made, and
    //! failures to inject.

    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::linux::quota::QuotaOp;

    /// One call, as made.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Call {
        Assign(PathBuf, u32, Limits),
        SetLimits(u32, Limits),
        Release(Option<PathBuf>, u32),
    }

    /// Clones share their state: a test keeps one and gives another to the code under test.
    #[derive(Debug, Default, Clone)]
    pub struct RecordingQuotas {
        /// IDs with a quota record (what `next_in_use` finds) and their usage.
        pub projects: Arc<Mutex<BTreeMap<u32, Usage>>>,
        pub calls: Arc<Mutex<Vec<Call>>>,
        /// `assign` of this directory fails.
        pub failing_dir: Option<PathBuf>,
        /// Projects whose usage drops to nothing only after this many `settle`s, as XFS
        /// drops removed inodes' usage once its background inactivation has run.
        pub draining: Arc<Mutex<BTreeMap<u32, u32>>>,
    }

    impl RecordingQuotas {
        pub fn calls(&self) -> Vec<Call> {
            self.calls.lock().unwrap().clone()
        }

        fn record(&self, call: Call) {
            self.calls.lock().unwrap().push(call);
        }
    }

    impl InUse for RecordingQuotas {
        fn next_in_use(&self, from: u32) -> Result<Option<u32>, QuotaError> {
            let projects = self.projects.lock().unwrap();
            Ok(projects.range(from..).next().map(|(id, _)| *id))
        }
        fn path(&self) -> &Path {
            Path::new("/fake")
        }
    }

    impl ProjectQuotas for RecordingQuotas {
        fn assign(&self, dir: &Path, id: u32, limits: Limits) -> Result<(), QuotaError> {
            self.record(Call::Assign(dir.to_owned(), id, limits));
            if self.failing_dir.as_deref() == Some(dir) {
                return Err(QuotaError::Quotactl {
                    op: QuotaOp::SetLimits,
                    id,
                    path: dir.to_owned(),
                    source: std::io::Error::from_raw_os_error(libc::EIO),
                });
            }
            let mut projects = self.projects.lock().unwrap();
            projects.entry(id).or_default().limits = limits;
            Ok(())
        }
        fn set_limits(&self, id: u32, limits: Limits) -> Result<(), QuotaError> {
            self.record(Call::SetLimits(id, limits));
            let mut projects = self.projects.lock().unwrap();
            projects.entry(id).or_default().limits = limits;
            Ok(())
        }
        fn release(&self, dir: Option<&Path>, id: u32) -> Result<(), QuotaError> {
            self.record(Call::Release(dir.map(Path::to_owned), id));
            let mut projects = self.projects.lock().unwrap();
            if projects
                .get(&id)
                .is_some_and(|usage| usage.bytes == 0 && usage.inodes == 0)
            {
                projects.remove(&id);
            }
            Ok(())
        }
        fn usage(&self, id: u32) -> Result<Usage, QuotaError> {
            let projects = self.projects.lock().unwrap();
            Ok(projects.get(&id).copied().unwrap_or_default())
        }
        fn settle(&self) -> Result<(), QuotaError> {
            let mut draining = self.draining.lock().unwrap();
            let mut projects = self.projects.lock().unwrap();
            for (id, left) in draining.iter_mut() {
                *left = left.saturating_sub(1);
                if let (0, Some(usage)) = (*left, projects.get_mut(id)) {
                    (usage.bytes, usage.inodes) = (0, 0);
                }
            }
            draining.retain(|_, left| *left > 0);
            Ok(())
        }
    }
}
