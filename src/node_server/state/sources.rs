//! Copy sources in use. A volume or snapshot being copied from (a snapshot being cut, a
//! restore, a clone) may feed any number of copies at once, but must not be deleted while one
//! runs, and a deletion in progress keeps new copies out. Both sides are claimed like a
//! volume's claim (`volumes::claims`): the loser gets ABORTED at once and the CO retries.
//!
//! These are separate from the volumes' claims on purpose: a snapshot of a published volume
//! copies its directory for as long as that takes, and NodePublish, NodeUnpublish and
//! ControllerExpand of the same volume must not wait for it (a pod would not start while a
//! 100 GiB volume is copied without reflinks).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// The key of a volume as a copy source (volume and snapshot IDs are chosen apart, but an
/// ephemeral volume's ID is the CO's, so the kinds are kept apart here too).
pub fn volume_key(id: &str) -> String {
    format!("volume {id}")
}

/// The key of a snapshot as a copy source.
pub fn snapshot_key(id: &str) -> String {
    format!("snapshot {id}")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Use {
    Copying(usize),
    Deleting,
}

/// A source that cannot be used as asked right now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceBusy {
    #[error("{0} is being deleted")]
    Deleting(String),
    #[error("{0} is being copied (a snapshot, restore or clone of it is in progress)")]
    Copying(String),
}

/// Which IDs are being copied from or deleted.
#[derive(Debug, Default)]
pub struct Sources {
    uses: Mutex<HashMap<String, Use>>,
}

/// A copy from `id` in progress; dropping it ends it.
#[derive(Debug)]
pub struct Reading {
    sources: Arc<Sources>,
    id: String,
}

/// A deletion of `id` in progress; dropping it ends it.
#[derive(Debug)]
pub struct Deleting {
    sources: Arc<Sources>,
    id: String,
}

impl Sources {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    fn uses(&self) -> MutexGuard<'_, HashMap<String, Use>> {
        // Every critical section leaves the map consistent.
        crate::mutex::lock(&self.uses)
    }

    /// Starts a copy from `id`, unless it is being deleted.
    pub fn read(self: &Arc<Self>, id: &str) -> Result<Reading, SourceBusy> {
        let mut uses = self.uses();
        match uses.entry(id.to_owned()).or_insert(Use::Copying(0)) {
            Use::Deleting => return Err(SourceBusy::Deleting(id.to_owned())),
            Use::Copying(n) => *n += 1,
        }
        Ok(Reading {
            sources: Arc::clone(self),
            id: id.to_owned(),
        })
    }

    /// Starts deleting `id`, unless a copy from it (or another deletion) is running.
    pub fn delete(self: &Arc<Self>, id: &str) -> Result<Deleting, SourceBusy> {
        let mut uses = self.uses();
        match uses.get(id) {
            Some(Use::Copying(_)) => return Err(SourceBusy::Copying(id.to_owned())),
            Some(Use::Deleting) => return Err(SourceBusy::Deleting(id.to_owned())),
            None => uses.insert(id.to_owned(), Use::Deleting),
        };
        Ok(Deleting {
            sources: Arc::clone(self),
            id: id.to_owned(),
        })
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        let mut uses = self.sources.uses();
        if let Some(Use::Copying(n)) = uses.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                uses.remove(&self.id);
            }
        }
    }
}

impl Drop for Deleting {
    fn drop(&mut self) {
        self.sources.uses().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_share_a_source_and_keep_its_deletion_out_until_the_last_ends() {
        let sources = Sources::new();
        let first = sources.read("vol-a").unwrap();
        let second = sources.read("vol-a").unwrap();
        let other = sources.delete("vol-b").expect("other sources are free");
        assert_eq!(
            sources.delete("vol-a").unwrap_err(),
            SourceBusy::Copying("vol-a".into())
        );
        drop(first);
        assert!(sources.delete("vol-a").is_err(), "one copy still runs");
        drop(second);
        let deleting = sources.delete("vol-a").expect("no copy left");
        drop((other, deleting));
        assert!(sources.uses().is_empty(), "nothing is left registered");
    }

    #[test]
    fn a_deletion_keeps_copies_and_other_deletions_out_until_it_ends() {
        let sources = Sources::new();
        let deleting = sources.delete("snap-a").unwrap();
        let busy = SourceBusy::Deleting("snap-a".into());
        assert_eq!(sources.read("snap-a").unwrap_err(), busy);
        assert_eq!(sources.delete("snap-a").unwrap_err(), busy);
        drop(deleting);
        drop(sources.read("snap-a").expect("free again"));
        assert!(sources.uses().is_empty());
    }
}
