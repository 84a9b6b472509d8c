//! Start-up recovery and the record life of [`Snapshots`], on plain temporary directories.

use std::fs;

use super::*;

fn snapshot(id: &str, source: &str, group: Option<&str>) -> Snapshot {
    Snapshot {
        id: id.into(),
        name: if group.is_some() { "" } else { id }.into(),
        source_volume: source.into(),
        size: 1 << 20,
        created: (1_700_000_000, 5),
        bytes: 4096,
        group: group.map(str::to_owned),
        block: false,
        layout: Default::default(),
    }
}

fn open(state: &tempfile::TempDir) -> Snapshots {
    open_setting_aside(state).0
}

/// Opened, with what start-up set aside (not removed yet).
fn open_setting_aside(state: &tempfile::TempDir) -> (Snapshots, Orphans) {
    let orphans = Orphans::new();
    let snapshots = Snapshots::open(&StateDir::open(state.path()).unwrap(), &orphans).unwrap();
    (snapshots, orphans)
}

/// A snapshot's data, as a cut leaves it.
fn data(snapshots: &Snapshots, id: &str) {
    let dir = snapshots.path_of(id);
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("file"), b"data").unwrap();
}

#[test]
fn committed_snapshots_and_groups_are_loaded_back_and_listed_in_pages() {
    let state = tempfile::tempdir().unwrap();
    let snapshots = open(&state);
    for id in ["snap-a", "snap-b", "snap-c"] {
        data(&snapshots, id);
    }
    let single = snapshot("snap-a", "vol-1", None);
    let members = [
        snapshot("snap-b", "vol-1", Some("group-x")),
        snapshot("snap-c", "vol-2", Some("group-x")),
    ];
    let group = Group {
        id: "group-x".into(),
        name: "g".into(),
        sources: vec!["vol-1".into(), "vol-2".into()],
        members: vec!["snap-b".into(), "snap-c".into()],
        created: (1, 2),
    };
    snapshots
        .commit(std::slice::from_ref(&single), None)
        .unwrap();
    snapshots.commit(&members, Some(&group)).unwrap();
    drop(snapshots);

    let snapshots = open(&state);
    assert_eq!(snapshots.find_name("snap-a"), Some(single.clone()));
    assert_eq!(snapshots.find_group_name("g"), Some(group.clone()));
    assert_eq!(snapshots.members(&group), members.to_vec());
    assert_eq!(snapshots.total_bytes(), 3 * 4096);
    let all = Filter::default();
    let (page, next) = snapshots.page(all, None, 2);
    assert_eq!(page.len(), 2);
    assert_eq!(next.as_deref(), Some("snap-c"));
    let (rest, next) = snapshots.page(all, next.as_deref(), 0);
    assert_eq!((rest.len(), next), (1, None));
    let of_vol_1 = Filter {
        source_volume: Some("vol-1"),
        ..all
    };
    let ids: Vec<String> = (snapshots.page(of_vol_1, None, 0).0.into_iter())
        .map(|s| s.id)
        .collect();
    assert_eq!(ids, ["snap-a", "snap-b"]);
    let one = Filter {
        snapshot: Some("snap-c"),
        ..all
    };
    assert_eq!(snapshots.page(one, None, 0).0, vec![members[1].clone()]);
}

#[test]
fn start_up_sets_aside_partial_copies_unrecorded_data_and_members_of_unfinished_groups() {
    let state = tempfile::tempdir().unwrap();
    let snapshots = open(&state);
    // A copy killed midway: a temporary name from another (dead) process.
    let partial = snapshots
        .state
        .snapshot_data()
        .join(".partial-999999-0-snap-p");
    fs::create_dir_all(partial.join("deep")).unwrap();
    // A copy finished, its record never written.
    data(&snapshots, "snap-unrecorded");
    // A group cut in part: member records, no group record.
    data(&snapshots, "snap-m1");
    data(&snapshots, "snap-m2");
    let members = [
        snapshot("snap-m1", "vol-1", Some("group-gone")),
        snapshot("snap-m2", "vol-2", Some("group-gone")),
    ];
    snapshots.commit(&members, None).unwrap();
    // A good one, to be kept.
    data(&snapshots, "snap-good");
    let good = snapshot("snap-good", "vol-1", None);
    snapshots.commit(std::slice::from_ref(&good), None).unwrap();
    drop(snapshots);

    let (snapshots, orphans) = open_setting_aside(&state);
    let listed: Vec<Snapshot> = snapshots.page(Filter::default(), None, 0).0;
    assert_eq!(listed, vec![good]);
    let left = || {
        let mut left: Vec<String> = fs::read_dir(snapshots.state.snapshot_data())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        left
    };
    let named: Vec<String> = (left().into_iter())
        .filter(|n| !n.starts_with(".orphan-"))
        .collect();
    assert_eq!(
        named,
        ["snap-good"],
        "only orphan names besides it, at once"
    );
    assert_eq!(orphans.len(), 4);
    orphans.remove_in_background(|| ()).unwrap().join().unwrap();
    assert_eq!(left(), ["snap-good"]);
    for id in ["snap-m1", "snap-m2"] {
        assert!(!snapshots.store.has_file(id), "{id}'s record is gone too");
    }
}

#[test]
fn data_whose_record_cannot_be_read_is_kept_and_a_record_without_data_is_not_offered() {
    let state = tempfile::tempdir().unwrap();
    let snapshots = open(&state);
    data(&snapshots, "snap-torn");
    let records = snapshots.state.snapshot_records().clone();
    fs::write(records.record("snap-torn"), b"{\"id\": \"snap-to").unwrap();
    snapshots
        .commit(&[snapshot("snap-nodata", "vol-1", None)], None)
        .unwrap();
    drop(snapshots);

    let snapshots = open(&state);
    assert_eq!(snapshots.page(Filter::default(), None, 0).0, vec![]);
    assert!(
        snapshots.path_of("snap-torn").join("file").exists(),
        "evidence is kept"
    );
    assert!(
        records.record("snap-nodata").exists(),
        "its record is left in place"
    );
}

#[test]
fn deleting_removes_the_record_before_the_data_and_a_group_takes_its_members() {
    let state = tempfile::tempdir().unwrap();
    let snapshots = open(&state);
    for id in ["snap-1", "snap-2"] {
        data(&snapshots, id);
    }
    let members = [
        snapshot("snap-1", "vol-1", Some("group-1")),
        snapshot("snap-2", "vol-2", Some("group-1")),
    ];
    let group = Group {
        id: "group-1".into(),
        name: "g".into(),
        sources: vec!["vol-1".into(), "vol-2".into()],
        members: vec!["snap-1".into(), "snap-2".into()],
        created: (0, 0),
    };
    snapshots.commit(&members, Some(&group)).unwrap();
    snapshots.remove_group(&group).unwrap();
    assert_eq!(snapshots.group("group-1"), None);
    assert_eq!(snapshots.get("snap-1"), None);
    assert!(!snapshots.path_of("snap-2").exists());
    assert_eq!(snapshots.total_bytes(), 0);
    let fresh = snapshots.new_id("snap-");
    assert!(fresh.starts_with("snap-") && fresh.len() == 37, "{fresh}");
    assert!(volume_id_problem(&fresh).is_none());
}
