use super::*;
use crate::linux::quota::Order;

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
    assert_eq!(
        q.release(&record(Some(7)), SETTLE).unwrap(),
        Released::Freed,
        "not ours to manage now"
    );
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
fn the_inode_limit_is_the_volumes_inode_limit_attribute_and_one_per_16_kib_by_default() {
    use crate::node_server::state::capacity::MIN_INODES;
    assert_eq!(limits(&record(None)).inodes, MIN_INODES);
    let mut big = record(Some(7));
    big.capacity = 1 << 30;
    assert_eq!(limits(&big).inodes, 65536, "1 GiB / 16 KiB");
    big.attributes.inode_limit = Some(500);
    assert_eq!(limits(&big).inodes, 500);
    big.attributes.inode_limit = Some(0);
    assert_eq!(limits(&big).inodes, 0, "inodeLimit 0 asks for no limit");
}

use crate::linux::quota::quota_seam::fake::{Call, RecordingQuotas};
use crate::linux::quota::{Limits, Usage};

/// Quotas enforced by a fake the test keeps a handle on.
fn enforcing(quotas: RecordingQuotas) -> (VolumeQuotas, RecordingQuotas) {
    let q = VolumeQuotas::enforcing(Box::new(quotas.clone())).in_order(Order::LowestFirst);
    (q, quotas)
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
                    inodes: crate::node_server::state::capacity::MIN_INODES
                }
            ),
            Call::Assign(
                b,
                first + 1,
                Limits {
                    bytes: 20,
                    inodes: crate::node_server::state::capacity::MIN_INODES
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
    assert_eq!(q.release(&record, SETTLE).unwrap(), Released::Freed);
    assert_eq!(
        fake.calls(),
        [
            Call::SetLimits(
                id,
                Limits {
                    bytes: 4096,
                    inodes: crate::node_server::state::capacity::MIN_INODES
                }
            ),
            Call::Release(None, id),
        ]
    );
    assert_eq!(q.allocate().unwrap(), Some(id));
}

#[test]
fn a_deleted_volumes_project_is_freed_once_the_filesystem_has_dropped_the_removed_files() {
    let (q, fake) = enforcing(RecordingQuotas::default());
    q.adopt([]);
    let id = q.allocate().unwrap().unwrap();
    // Still charged with the removed tree until the third settle (XFS's inactivation).
    let removed = Usage {
        bytes: 8 << 20,
        inodes: 40,
        ..Default::default()
    };
    fake.projects.lock().unwrap().insert(id, removed);
    fake.draining.lock().unwrap().insert(id, 3);
    let released = q.release(&sized("v", 8 << 20, Some(id)), SETTLE);
    assert_eq!(released.unwrap(), Released::Freed);
    assert_eq!(fake.calls(), [Call::Release(None, id)]);
    assert_eq!(q.allocate().unwrap(), Some(id), "free for the next");
}

#[test]
fn a_deleted_volume_whose_project_still_holds_files_elsewhere_keeps_a_least_limit_and_its_id() {
    let (q, fake) = enforcing(RecordingQuotas::default());
    q.adopt([]);
    let id = q.allocate().unwrap().unwrap();
    let linked = Usage {
        bytes: 24 << 20,
        inodes: 2,
        ..Default::default()
    };
    fake.projects.lock().unwrap().insert(id, linked);
    let waited = std::time::Instant::now();
    let released = q.release(&sized("v", 8 << 20, Some(id)), Duration::from_millis(30));
    assert!(waited.elapsed() >= Duration::from_millis(30), "it waited");
    assert_eq!(released.unwrap(), Released::Kept(linked));
    let kept = Limits {
        bytes: LEFTOVER_BYTES,
        inodes: 2,
    };
    assert_eq!(fake.calls(), [Call::SetLimits(id, kept)], "not cleared");
    assert_ne!(q.allocate().unwrap(), Some(id), "not handed out again");
    // Once the files are gone, the next try frees it at once.
    fake.projects.lock().unwrap().get_mut(&id).unwrap().bytes = 0;
    fake.projects.lock().unwrap().get_mut(&id).unwrap().inodes = 0;
    let again = q.release(&sized("v", 8 << 20, Some(id)), Duration::ZERO);
    assert_eq!(again.unwrap(), Released::Freed);
    assert_eq!(fake.calls().last(), Some(&Call::Release(None, id)));
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

#[test]
fn a_quotad_volumes_limit_is_not_changeable_while_sizes_are_not_enforced() {
    let off = VolumeQuotas::off();
    let quotad = sized("v", 8 << 20, Some(*PROJECT_IDS.start()));
    let refused = off
        .check_changeable(&quotad)
        .expect_err("its old limit would stay");
    assert!(refused.project_id == *PROJECT_IDS.start(), "{refused:?}");
    assert!(
        refused.to_string().contains("stays at its old limit"),
        "{refused}"
    );
    off.check_changeable(&sized("w", 8 << 20, None))
        .expect("an unenforced volume's size is only accounted");
    let (on, _) = enforcing(RecordingQuotas::default());
    on.check_changeable(&quotad).expect("enforced: applied");
}
