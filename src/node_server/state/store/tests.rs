use super::*;
use crate::node_server::state::attributes::Attributes;
use crate::node_server::state::volumes::{ContentSource, Record};

/// A store's directory: any will do.
fn records(dir: &tempfile::TempDir) -> RecordDir {
    RecordDir::at(dir.path().join("records"))
}

fn record(id: &str) -> Record {
    Record {
        id: id.into(),
        name: format!("pvc-{id}"),
        capacity: 42,
        ephemeral: false,
        project_id: None,
        source: None,
        attributes: Attributes::default(),
        block: false,
        ..Default::default()
    }
}

#[test]
fn saved_records_are_loaded_back_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (store, loaded) = Store::<Record>::open(records(&dir)).unwrap();
    assert!(loaded.is_empty());
    store.save(&record("a")).unwrap();
    store.save(&record("b")).unwrap();
    store.remove("b").unwrap();
    store.remove("never-existed").unwrap();
    let (_, loaded) = Store::<Record>::open(records(&dir)).unwrap();
    assert_eq!(loaded, vec![record("a")]);
}

#[test]
fn a_rewrite_replaces_the_record_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::<Record>::open(records(&dir)).unwrap();
    store.save(&record("a")).unwrap();
    let bigger = Record {
        capacity: 1 << 40,
        ..record("a")
    };
    store.save(&bigger).unwrap();
    let (_, loaded) = Store::<Record>::open(records(&dir)).unwrap();
    assert_eq!(loaded, vec![bigger]);
}

#[test]
fn a_project_id_is_kept_and_records_without_one_still_load() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::<Record>::open(records(&dir)).unwrap();
    let quota = Record {
        project_id: Some(1 << 30),
        ..record("q")
    };
    store.save(&quota).unwrap();
    // As written before project quotas existed.
    let old = r#"{"version":1,"id":"old","name":"pvc-old","capacity_bytes":7,"ephemeral":false}"#;
    std::fs::write(records(&dir).record("old"), old).unwrap();
    let (_, mut loaded) = Store::<Record>::open(records(&dir)).unwrap();
    loaded.sort_by(|a, b| a.id.cmp(&b.id));
    let old = Record {
        name: "pvc-old".into(),
        capacity: 7,
        ..record("old")
    };
    assert_eq!(loaded, vec![old, quota]);
}

#[test]
fn a_content_source_is_kept_and_records_from_before_snapshots_still_load() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::<Record>::open(records(&dir)).unwrap();
    let restored = Record {
        source: Some(ContentSource::Snapshot("snap-1".into())),
        ..record("a")
    };
    let cloned = Record {
        source: Some(ContentSource::Volume("b".into())),
        ..record("c")
    };
    store.save(&restored).unwrap();
    store.save(&cloned).unwrap();
    let old = r#"{"version":1,"id":"d","name":"pvc-d","capacity_bytes":42,"ephemeral":false}"#;
    std::fs::write(records(&dir).record("d"), old).unwrap();
    let bad = r#"{"id":"e","name":"","capacity_bytes":1,"ephemeral":false,"content_source":{}}"#;
    std::fs::write(records(&dir).record("e"), bad).unwrap();
    let (_, mut loaded) = Store::<Record>::open(records(&dir)).unwrap();
    loaded.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(loaded, vec![restored, cloned, record("d")]);
}

#[test]
fn attributes_and_the_block_access_type_are_kept_and_older_records_load_with_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::<Record>::open(records(&dir)).unwrap();
    let modified = Record {
        attributes: Attributes {
            inode_limit: Some(5000),
            root_mode: Some(0o750),
            direct_io: None,
            ..Default::default()
        },
        ..record("a")
    };
    store.save(&modified).unwrap();
    let block = Record {
        block: true,
        ..record("c")
    };
    store.save(&block).unwrap();
    let old = r#"{"version":1,"id":"b","name":"pvc-b","capacity_bytes":42,"ephemeral":false}"#;
    std::fs::write(records(&dir).record("b"), old).unwrap();
    let (_, mut loaded) = Store::<Record>::open(records(&dir)).unwrap();
    loaded.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(loaded, vec![modified, record("b"), block]);
}

#[test]
fn interrupted_writes_are_cleaned_up_and_torn_records_left_in_place() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(records(&dir).path()).unwrap();
    std::fs::write(records(&dir).temporary("a"), "{\"half").unwrap();
    std::fs::write(records(&dir).record("b"), "not json").unwrap();
    std::fs::write(records(&dir).record("c"), encode(&record("other")).unwrap()).unwrap();
    let (_, loaded) = Store::<Record>::open(records(&dir)).unwrap();
    assert!(loaded.is_empty());
    assert!(!records(&dir).temporary("a").exists());
    assert!(records(&dir).record("b").exists(), "evidence is kept");
    assert!(records(&dir).record("c").exists());
}

#[test]
fn each_unreadable_record_is_reported_once_with_why_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let records = records(&dir);
    let (store, _) = Store::<Record>::open(records.clone()).unwrap();
    store.save(&record("good")).unwrap();
    std::fs::create_dir(records.record("a-directory")).unwrap();
    std::fs::write(records.record("torn"), r#"{"id":"to"#).unwrap();
    let nameless = r#"{"id":"nameless","capacity_bytes":1,"ephemeral":false}"#;
    std::fs::write(records.record("nameless"), nameless).unwrap();
    let other = encode(&record("someone-else")).unwrap();
    std::fs::write(records.record("other"), other).unwrap();
    std::fs::write(records.record(".."), encode(&record("..")).unwrap()).unwrap();
    let mut said = Vec::new();
    let (_, loaded) = Store::<Record>::open_reporting(records.clone(), |path, why| {
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        said.push((name, why.to_string()));
    })
    .unwrap();
    assert_eq!(loaded, vec![record("good")]);
    said.sort();
    let said: Vec<(&str, &str)> = said.iter().map(|(n, w)| (&**n, &**w)).collect();
    assert_eq!(
        said,
        [
            (
                "...json",
                r#"refused: the ID its file name gives, "..", begins with a dot"#
            ),
            ("a-directory.json", "read: Is a directory (os error 21)"),
            (
                "nameless.json",
                "parse: missing field `name` at line 1 column 54"
            ),
            (
                "other.json",
                r#"refused: it holds the record of "someone-else", not of "other" as its file name says"#
            ),
            (
                "torn.json",
                "parse: EOF while parsing a string at line 1 column 9"
            ),
        ]
    );
    for name in ["..", "a-directory", "torn", "nameless", "other"] {
        assert!(records.record(name).exists(), "{name} is left in place");
    }
}

#[test]
fn a_group_without_a_member_per_source_is_refused_saying_so() {
    use crate::node_server::state::snapshots::Group;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(records(&dir).path()).unwrap();
    let torn = r#"{"creation_time":{"nanos":0,"seconds":0},"id":"group-1","name":"","snapshot_ids":["snap-1"],"source_volume_ids":["vol-1","vol-2"],"version":1}"#;
    let path = records(&dir).record("group-1");
    std::fs::write(&path, torn).unwrap();
    let why = Store::<Group>::load(&path, "group-1").unwrap_err();
    assert!(matches!(why, RecordError::Refused(_)), "{why:?}");
    assert_eq!(
        why.to_string(),
        "refused: 2 source volume(s) but 1 member snapshot(s)"
    );
}

#[test]
fn a_volume_being_deleted_says_so_in_its_record_and_others_do_not_mention_it() {
    let plain = serde_json::to_string(&record("vol-1")).unwrap();
    assert!(!plain.contains("deleting"), "{plain}");
    let marked = Record {
        deleting: true,
        ..record("vol-1")
    };
    let text = serde_json::to_string(&marked).unwrap();
    assert!(text.contains("\"deleting\":true"), "{text}");
    let back: Record = serde_json::from_str(&text).unwrap();
    assert_eq!(back, marked);
    let old: Record = serde_json::from_str(&plain).unwrap();
    assert!(
        !old.deleting,
        "records from before the mark read as not deleting"
    );
}
