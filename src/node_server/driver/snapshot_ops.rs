//! The plugin's snapshot operations below the gRPC handlers: CreateSnapshot and DeleteSnapshot
//! of the Controller service, and the group snapshots of the GroupController. Each runs on the
//! blocking pool under the lock its handler takes (the snapshot's name or ID, the group's);
//! the source volumes are held as copy sources meanwhile ([`crate::node_server::state::sources`]), so they cannot
//! be deleted under the copy, while publishing or expanding them goes on.

use std::path::PathBuf;

use super::Driver;
use super::image_copies::unshare_in_background;
use crate::node_server::state::snapshots::SnapshotError;
use crate::node_server::state::snapshots::{Group, Snapshot};
use crate::node_server::state::sources::{snapshot_key, volume_key};
use crate::node_server::state::state_dir::block_image_in;
use crate::node_server::state::volumes::Layout;

/// Whether two lists of IDs hold the same IDs (the CSI compares sets).
fn same_set(a: &[String], b: &[String]) -> bool {
    let (mut a, mut b) = (a.to_vec(), b.to_vec());
    a.sort_unstable();
    b.sort_unstable();
    a == b
}

impl Driver {
    /// CreateSnapshot: the snapshot of that name if it is of the same volume, else a new one.
    pub fn create_snapshot(&self, name: &str, source: &str) -> Result<Snapshot, SnapshotError> {
        if let Some(existing) = self.snapshots.find_name(name) {
            if existing.source_volume == source {
                return Ok(existing);
            }
            return Err(SnapshotError::NameTaken {
                name: name.to_owned(),
                source_volume: existing.source_volume,
            });
        }
        let mut cut = self.cut_volumes(&[source.to_owned()])?;
        for snapshot in &mut cut {
            snapshot.name = name.to_owned();
        }
        self.commit(&cut, None)?;
        self.unshare_images(&cut);
        Ok(cut.remove(0))
    }

    /// DeleteSnapshot: gone already is fine; a group's member goes only with its group.
    pub fn delete_snapshot(&self, id: &str) -> Result<(), SnapshotError> {
        let Some(snapshot) = self.snapshots.get(id) else {
            return Ok(());
        };
        if let Some(group) = snapshot.group {
            return Err(SnapshotError::InGroup {
                id: id.to_owned(),
                group,
            });
        }
        let _deleting = self.sources.delete(&snapshot_key(id))?;
        let removed = self.snapshots.remove(id);
        if self.snapshots.get(id).is_none() {
            self.volumes.refund(snapshot.bytes);
        }
        removed
    }

    /// CreateVolumeGroupSnapshot: the group of that name if it is of the same volumes, else
    /// one snapshot of each volume, cut together, and the group that holds them.
    pub fn create_group(
        &self,
        name: &str,
        sources: &[String],
    ) -> Result<(Group, Vec<Snapshot>), SnapshotError> {
        if let Some(group) = self.snapshots.find_group_name(name) {
            if !same_set(&group.sources, sources) {
                return Err(SnapshotError::GroupNameTaken {
                    name: name.to_owned(),
                });
            }
            let members = self.snapshots.members(&group);
            return Ok((group, members));
        }
        let mut members = self.cut_volumes(sources)?;
        let id = self.snapshots.new_id("group-");
        for member in &mut members {
            member.group = Some(id.clone());
        }
        let group = Group {
            id,
            name: name.to_owned(),
            sources: sources.to_vec(),
            members: members.iter().map(|m| m.id.clone()).collect(),
            created: members.first().map(|m| m.created).unwrap_or_default(),
        };
        self.commit(&members, Some(&group))?;
        self.unshare_images(&members);
        log::info!(
            "created group snapshot {} of {} volume(s)",
            group.id,
            members.len()
        );
        Ok((group, members))
    }

    /// DeleteVolumeGroupSnapshot: the group and every member; gone already is fine.
    pub fn delete_group(&self, id: &str, snapshot_ids: &[String]) -> Result<(), SnapshotError> {
        let Some(group) = self.snapshots.group(id) else {
            return Ok(());
        };
        check_members(&group, snapshot_ids)?;
        let _deleting = (group.members.iter())
            .map(|member| self.sources.delete(&snapshot_key(member)))
            .collect::<Result<Vec<_>, _>>()?;
        let members = self.snapshots.members(&group);
        let removed = self.snapshots.remove_group(&group);
        for member in members {
            if self.snapshots.get(&member.id).is_none() {
                self.volumes.refund(member.bytes);
            }
        }
        removed
    }

    /// GetVolumeGroupSnapshot.
    pub fn get_group(
        &self,
        id: &str,
        snapshot_ids: &[String],
    ) -> Result<(Group, Vec<Snapshot>), SnapshotError> {
        let group = (self.snapshots.group(id))
            .ok_or_else(|| SnapshotError::GroupNotFound { id: id.to_owned() })?;
        check_members(&group, snapshot_ids)?;
        let members = self.snapshots.members(&group);
        Ok((group, members))
    }

    /// One snapshot of each volume, cut together and counted against `--capacity`, not yet
    /// recorded: unnamed and in no group.
    fn cut_volumes(&self, ids: &[String]) -> Result<Vec<Snapshot>, SnapshotError> {
        // Held first, so a volume found below cannot be deleted before it is copied.
        let _reading = (ids.iter())
            .map(|id| self.sources.read(&volume_key(id)))
            .collect::<Result<Vec<_>, _>>()?;
        let volumes = (ids.iter())
            .map(|id| self.volumes.records().provisioned(id, "a snapshot"))
            .collect::<Result<Vec<_>, _>>()?;
        for volume in volumes.iter().filter(|v| v.block) {
            self.flush_block(volume)?;
        }
        let dirs: Vec<PathBuf> = ids.iter().map(|id| self.volumes.path_of(id)).collect();
        // Image volumes' filesystems held still, all of them before the first copy, until
        // the last copy is made (see `image_copies`).
        let frozen = self.freeze_images(&volumes)?;
        let first = frozen.iter().map(|f| f.since()).min();
        let cut = self.snapshots.cut(&dirs);
        drop(frozen);
        if let Some(first) = first {
            log::info!(
                "held the writers of {} image volume(s) {:?} for their snapshots (from the \
                 first freeze to the last thaw)",
                volumes.iter().filter(|v| v.is_image()).count(),
                first.elapsed()
            );
        }
        let (created, cuts) = cut?;
        let snapshots: Vec<Snapshot> = (cuts.into_iter().zip(volumes))
            .map(|(cut, volume)| Snapshot {
                id: cut.id,
                name: String::new(),
                source_volume: volume.id,
                size: volume.capacity,
                created,
                bytes: cut.report.bytes_allocated,
                group: None,
                block: volume.block,
                layout: volume.layout,
            })
            .collect();
        let bytes = snapshots
            .iter()
            .fold(0u64, |sum, s| sum.saturating_add(s.bytes));
        if let Err(e) = self.volumes.charge(bytes) {
            for snapshot in &snapshots {
                if let Err(left) = self.snapshots.discard(&snapshot.id) {
                    log::error!("could not remove the copy {}: {left}", snapshot.id);
                }
            }
            return Err(e.into());
        }
        Ok(snapshots)
    }

    /// Gives each image volume's snapshot among `snapshots` blocks of its own, in the
    /// background, so the volume's writes never meet a full host filesystem (see
    /// [`unshare_in_background`]).
    fn unshare_images(&self, snapshots: &[Snapshot]) {
        for snapshot in snapshots.iter().filter(|s| s.layout == Layout::Image) {
            let what = format!(
                "snapshot {} of volume {}",
                snapshot.id, snapshot.source_volume
            );
            let path = block_image_in(&self.snapshots.path_of(&snapshot.id));
            unshare_in_background(path, what);
        }
    }

    /// Records what [`cut_volumes`](Self::cut_volumes) cut; on failure gives its bytes back.
    fn commit(&self, snapshots: &[Snapshot], group: Option<&Group>) -> Result<(), SnapshotError> {
        self.snapshots.commit(snapshots, group).inspect_err(|_| {
            let bytes = snapshots
                .iter()
                .fold(0u64, |sum, s| sum.saturating_add(s.bytes));
            self.volumes.refund(bytes);
        })
    }
}

/// The CSI's `snapshot_ids` check: required, and the group's members exactly.
fn check_members(group: &Group, snapshot_ids: &[String]) -> Result<(), SnapshotError> {
    if snapshot_ids.is_empty() {
        return Err(SnapshotError::SnapshotIdsRequired {
            id: group.id.clone(),
        });
    }
    if !same_set(&group.members, snapshot_ids) {
        return Err(SnapshotError::MembersDiffer {
            id: group.id.clone(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_lists_compare_as_sets() {
        let ids = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(same_set(&ids(&["b", "a"]), &ids(&["a", "b"])));
        assert!(!same_set(&ids(&["a", "b"]), &ids(&["a"])));
        assert!(!same_set(&ids(&["a", "a"]), &ids(&["a", "b"])));
        let group = Group {
            id: "group-1".into(),
            name: "g".into(),
            sources: ids(&["vol-1", "vol-2"]),
            members: ids(&["snap-1", "snap-2"]),
            created: (0, 0),
        };
        assert!(check_members(&group, &ids(&["snap-2", "snap-1"])).is_ok());
        assert!(matches!(
            check_members(&group, &[]),
            Err(SnapshotError::SnapshotIdsRequired { .. })
        ));
        assert!(matches!(
            check_members(&group, &ids(&["snap-1"])),
            Err(SnapshotError::MembersDiffer { .. })
        ));
    }
}
