//! The records' JSON on disk, kind by kind: what earlier versions wrote reads back to the same
//! values, what this one writes is byte for byte what they wrote (so a rollback reads it), and
//! what was optional, defaulted or refused still is.
//!
//! The fixtures are the bytes `Store::save` wrote before records were serde types (the
//! hand-written `to_json` of commit dfe4e26), captured from real saves, not typed by hand.
//!
//! Where the readers differ is only on JSON that no version wrote: a `null` for an optional
//! value now reads as its absence (`project_id`, `content_source`, an attribute; earlier it
//! refused the record), a snapshot without `group_snapshot_id` reads as no group (earlier:
//! refused), and `attributes` that are not an object, a `content_source` key that is not a
//! string beside the one that is, and a key given twice are refused (earlier: ignored).

use proptest::prelude::*;
use serde_json::{Value, json};

use crate::node_server::state::attributes::Attributes;
use crate::node_server::state::snapshots::{Group, Snapshot};
use crate::node_server::state::store::{Persisted, decode, encode};
use crate::node_server::state::volumes::{ContentSource, Layout, Record};

const VOLUME_MINIMAL: &str = r#"{"capacity_bytes":1073741824,"ephemeral":false,"id":"vol-0123456789abcdef0123456789abcdef","name":"pvc-8f9e","version":1}"#;
const VOLUME_FULL: &str = r#"{"access_type":"block","attributes":{"directIO":false,"inodeLimit":5000,"rootMode":1528},"capacity_bytes":18446744073709551615,"content_source":{"snapshot":"snap-1"},"ephemeral":false,"id":"vol-full","name":"pvc-full","project_id":4294967295,"version":1}"#;
const VOLUME_EPHEMERAL_CLONE: &str = r#"{"attributes":{"inodeLimit":0},"capacity_bytes":0,"content_source":{"volume":"vol-src"},"ephemeral":true,"id":"csi-eph\"quoteé","name":"","project_id":7,"version":1}"#;
const SNAPSHOT_SINGLE: &str = r#"{"creation_time":{"nanos":999999999,"seconds":1700000000},"data_bytes":4096,"group_snapshot_id":null,"id":"snap-single","name":"snapshot-a","size_bytes":1073741824,"source_volume_id":"vol-1","version":1}"#;
const SNAPSHOT_IMAGE: &str = r#"{"creation_time":{"nanos":0,"seconds":1},"data_bytes":8192,"group_snapshot_id":null,"id":"snap-image","layout":"image","name":"snapshot-i","size_bytes":16777216,"source_volume_id":"vol-3","version":1}"#;
const SNAPSHOT_MEMBER_BLOCK: &str = r#"{"access_type":"block","creation_time":{"nanos":0,"seconds":-5},"data_bytes":0,"group_snapshot_id":"group-1","id":"snap-member","name":"","size_bytes":1048576,"source_volume_id":"vol-2","version":1}"#;
const GROUP: &str = r#"{"creation_time":{"nanos":2,"seconds":1700000001},"id":"group-1","name":"group-a","snapshot_ids":["snap-1","snap-member"],"source_volume_ids":["vol-1","vol-2"],"version":1}"#;
const GROUP_EMPTY: &str = r#"{"creation_time":{"nanos":0,"seconds":0},"id":"group-empty","name":"","snapshot_ids":[],"source_volume_ids":[],"version":1}"#;

fn volumes() -> Vec<(&'static str, Record)> {
    vec![
        (
            VOLUME_MINIMAL,
            Record {
                id: "vol-0123456789abcdef0123456789abcdef".into(),
                name: "pvc-8f9e".into(),
                capacity: 1 << 30,
                ..Default::default()
            },
        ),
        (
            VOLUME_FULL,
            Record {
                id: "vol-full".into(),
                name: "pvc-full".into(),
                capacity: u64::MAX,
                ephemeral: false,
                project_id: Some(u32::MAX),
                source: Some(ContentSource::Snapshot("snap-1".into())),
                attributes: Attributes {
                    inode_limit: Some(5000),
                    root_mode: Some(0o2770),
                    direct_io: Some(false),
                    ..Default::default()
                },
                block: true,
                ..Default::default()
            },
        ),
        (
            VOLUME_EPHEMERAL_CLONE,
            Record {
                id: "csi-eph\"quote\u{e9}".into(),
                name: String::new(),
                capacity: 0,
                ephemeral: true,
                project_id: Some(7),
                source: Some(ContentSource::Volume("vol-src".into())),
                attributes: Attributes {
                    inode_limit: Some(0),
                    ..Default::default()
                },
                block: false,
                ..Default::default()
            },
        ),
    ]
}

fn snapshots() -> Vec<(&'static str, Snapshot)> {
    vec![
        (
            SNAPSHOT_SINGLE,
            Snapshot {
                id: "snap-single".into(),
                name: "snapshot-a".into(),
                source_volume: "vol-1".into(),
                size: 1 << 30,
                created: (1_700_000_000, 999_999_999),
                bytes: 4096,
                group: None,
                block: false,
                layout: Default::default(),
            },
        ),
        (
            SNAPSHOT_IMAGE,
            Snapshot {
                id: "snap-image".into(),
                name: "snapshot-i".into(),
                source_volume: "vol-3".into(),
                size: 16 << 20,
                created: (1, 0),
                bytes: 8192,
                group: None,
                block: false,
                layout: Layout::Image,
            },
        ),
        (
            SNAPSHOT_MEMBER_BLOCK,
            Snapshot {
                id: "snap-member".into(),
                name: String::new(),
                source_volume: "vol-2".into(),
                size: 1 << 20,
                created: (-5, 0),
                bytes: 0,
                group: Some("group-1".into()),
                block: true,
                layout: Default::default(),
            },
        ),
    ]
}

fn groups() -> Vec<(&'static str, Group)> {
    vec![
        (
            GROUP,
            Group {
                id: "group-1".into(),
                name: "group-a".into(),
                sources: vec!["vol-1".into(), "vol-2".into()],
                members: vec!["snap-1".into(), "snap-member".into()],
                created: (1_700_000_001, 2),
            },
        ),
        (
            GROUP_EMPTY,
            Group {
                id: "group-empty".into(),
                name: String::new(),
                sources: vec![],
                members: vec![],
                created: (0, 0),
            },
        ),
    ]
}

/// Reads each fixture to its value, and writes each value to exactly its fixture's bytes.
fn same_both_ways<R: Persisted + PartialEq + std::fmt::Debug>(fixtures: Vec<(&str, R)>) {
    for (bytes, value) in fixtures {
        assert_eq!(decode::<R>(bytes.as_bytes()).unwrap(), value, "{bytes}");
        let written = String::from_utf8(encode(&value).unwrap()).unwrap();
        assert_eq!(written, bytes, "byte for byte what earlier versions wrote");
    }
}

#[test]
fn volume_records_of_earlier_versions_read_back_and_are_written_the_same() {
    same_both_ways(volumes());
}

#[test]
fn snapshot_records_of_earlier_versions_read_back_and_are_written_the_same() {
    same_both_ways(snapshots());
}

#[test]
fn group_records_of_earlier_versions_read_back_and_are_written_the_same() {
    same_both_ways(groups());
}

type Object = serde_json::Map<String, Value>;

/// A fixture with `change` made to its JSON.
fn edited(bytes: &str, change: impl FnOnce(&mut Object)) -> Vec<u8> {
    let mut value: Value = serde_json::from_str(bytes).unwrap();
    change(value.as_object_mut().unwrap());
    serde_json::to_vec(&value).unwrap()
}

#[test]
fn unknown_fields_are_ignored_at_every_level() {
    let extra = |map: &mut Object| {
        map.insert("written_by_a_later_version".into(), json!({ "x": [1, 2] }));
    };
    for (bytes, value) in volumes() {
        let later = edited(bytes, |map| {
            extra(map);
            if let Some(Value::Object(attributes)) = map.get_mut("attributes") {
                attributes.insert("laterLimit".into(), json!(9));
            }
            if let Some(Value::Object(source)) = map.get_mut("content_source") {
                source.insert("later".into(), json!("x"));
            }
        });
        assert_eq!(decode::<Record>(&later).unwrap(), value);
    }
    for (bytes, value) in snapshots() {
        assert_eq!(decode::<Snapshot>(&edited(bytes, extra)).unwrap(), value);
    }
    for (bytes, value) in groups() {
        assert_eq!(decode::<Group>(&edited(bytes, extra)).unwrap(), value);
    }
}

#[test]
fn fields_older_records_lack_take_their_defaults() {
    // As written before project quotas, content sources, attributes, block volumes (and
    // without "version", which no reader has ever needed), keys in the writer's order.
    let oldest = r#"{"id":"old","name":"pvc-old","capacity_bytes":7,"ephemeral":false}"#;
    let read = decode::<Record>(oldest.as_bytes()).unwrap();
    let expected = Record {
        id: "old".into(),
        name: "pvc-old".into(),
        capacity: 7,
        ..Default::default()
    };
    assert_eq!(read, expected);
    assert_eq!(
        (read.project_id, &read.source, read.attributes, read.block),
        (None, &None, Attributes::default(), false)
    );
    let empty_attributes = edited(VOLUME_MINIMAL, |map| {
        map.insert("attributes".into(), json!({}));
    });
    assert_eq!(decode::<Record>(&empty_attributes).unwrap(), volumes()[0].1);
    // A snapshot from before block volumes has no access_type.
    let (bytes, single) = &snapshots()[0];
    assert!(!bytes.contains("access_type"));
    assert!(!decode::<Snapshot>(bytes.as_bytes()).unwrap().block);
    assert_eq!(&decode::<Snapshot>(bytes.as_bytes()).unwrap(), single);
}

/// A fixture with `key` set to `value`, or removed (`None`).
fn with(bytes: &str, key: &str, value: Option<Value>) -> Vec<u8> {
    edited(bytes, |map| {
        match value {
            Some(value) => map.insert(key.to_owned(), value),
            None => map.remove(key),
        };
    })
}

#[test]
fn values_earlier_versions_refused_are_still_refused() {
    let refused = [
        ("id", None),
        ("name", None),
        ("capacity_bytes", None),
        ("ephemeral", None),
        ("capacity_bytes", Some(json!("7"))),
        ("capacity_bytes", Some(json!(-1))),
        ("capacity_bytes", Some(json!(1.5))),
        ("project_id", Some(json!(1u64 << 32))),
        ("access_type", Some(json!("file"))),
        ("content_source", Some(json!({}))),
        (
            "content_source",
            Some(json!({ "snapshot": "s", "volume": "v" })),
        ),
        ("attributes", Some(json!({ "rootMode": 0o10000 }))),
        ("attributes", Some(json!({ "inodeLimit": -1 }))),
        ("attributes", Some(json!({ "directIO": "true" }))),
    ];
    for (key, value) in refused {
        let bytes = with(VOLUME_FULL, key, value.clone());
        assert!(decode::<Record>(&bytes).is_err(), "{key}: {value:?}");
    }
    let refused = [
        ("creation_time", Some(json!({ "seconds": 1 }))),
        (
            "creation_time",
            Some(json!({ "seconds": 1, "nanos": 1u64 << 32 })),
        ),
        ("group_snapshot_id", Some(json!(5))),
        ("access_type", Some(json!(true))),
        ("data_bytes", None),
    ];
    for (key, value) in refused {
        let bytes = with(SNAPSHOT_SINGLE, key, value.clone());
        assert!(decode::<Snapshot>(&bytes).is_err(), "{key}: {value:?}");
    }
    // As always, a snapshot's access_type is "block" or means a filesystem volume's.
    let mount = with(SNAPSHOT_SINGLE, "access_type", Some(json!("mount")));
    assert!(!decode::<Snapshot>(&mount).unwrap().block);
    let torn = with(GROUP, "snapshot_ids", Some(json!(["snap-1"])));
    let torn = decode::<Group>(&torn).unwrap();
    assert!(torn.problem().is_some(), "a member per source");
    assert_eq!(groups()[0].1.problem(), None);
    assert!(decode::<Record>(b"[1]").is_err() && decode::<Record>(b"").is_err());
}

fn id() -> impl Strategy<Value = String> {
    "[a-z0-9-]{1,40}"
}

fn time() -> impl Strategy<Value = (i64, u32)> {
    (any::<i64>(), any::<u32>())
}

fn record() -> impl Strategy<Value = Record> {
    let source = prop_oneof![
        Just(None),
        id().prop_map(|id| Some(ContentSource::Snapshot(id))),
        id().prop_map(|id| Some(ContentSource::Volume(id))),
    ];
    let attributes = (
        proptest::option::of(any::<u64>()),
        proptest::option::of(0u32..=0o7777),
        proptest::option::of(any::<bool>()),
        proptest::array::uniform4(proptest::option::of(any::<u64>())),
    )
        .prop_map(|(inode_limit, root_mode, direct_io, io)| Attributes {
            inode_limit,
            root_mode,
            direct_io,
            read_bytes_per_second: io[0],
            write_bytes_per_second: io[1],
            read_iops: io[2],
            write_iops: io[3],
        });
    (
        (id(), ".{0,20}", any::<u64>(), any::<bool>()),
        (
            proptest::option::of(any::<u32>()),
            source,
            attributes,
            any::<bool>(),
        ),
    )
        .prop_map(
            |((id, name, capacity, ephemeral), (project_id, source, attributes, block))| Record {
                id,
                name,
                capacity,
                ephemeral,
                project_id,
                source,
                attributes,
                block,
                ..Default::default()
            },
        )
}

fn snapshot() -> impl Strategy<Value = Snapshot> {
    (
        (id(), ".{0,20}", id(), any::<u64>()),
        (
            time(),
            any::<u64>(),
            proptest::option::of(id()),
            any::<bool>(),
            any::<bool>(),
        ),
    )
        .prop_map(
            |((id, name, source_volume, size), (created, bytes, group, block, image))| Snapshot {
                id,
                name,
                source_volume,
                size,
                created,
                bytes,
                group,
                block,
                // An image is never a block volume's.
                layout: match image && !block {
                    true => Layout::Image,
                    false => Layout::Directory,
                },
            },
        )
}

fn group() -> impl Strategy<Value = Group> {
    (
        id(),
        ".{0,20}",
        proptest::collection::vec((id(), id()), 0..5),
        time(),
    )
        .prop_map(|(id, name, pairs, created)| Group {
            id,
            name,
            sources: pairs.iter().map(|(s, _)| s.clone()).collect(),
            members: pairs.into_iter().map(|(_, m)| m).collect(),
            created,
        })
}

/// Written compactly, keys in order, `"version": 1` among them: what earlier versions wrote.
fn as_earlier_versions_wrote<R: Persisted>(record: &R) -> Vec<u8> {
    let bytes = encode(record).unwrap();
    let value: Value = serde_json::from_slice(&bytes).unwrap();
    let map = value.as_object().unwrap();
    assert_eq!(map["version"], json!(1));
    let keys: Vec<&String> = map.keys().collect();
    assert!(keys.is_sorted(), "{keys:?}");
    assert_eq!(serde_json::to_vec(&value).unwrap(), bytes, "compact");
    bytes
}

proptest! {
    #[test]
    fn volume_records_round_trip(record in record()) {
        let bytes = as_earlier_versions_wrote(&record);
        prop_assert_eq!(decode::<Record>(&bytes).unwrap(), record);
    }

    #[test]
    fn snapshot_records_round_trip(snapshot in snapshot()) {
        let bytes = as_earlier_versions_wrote(&snapshot);
        prop_assert_eq!(decode::<Snapshot>(&bytes).unwrap(), snapshot);
    }

    #[test]
    fn group_records_round_trip(group in group()) {
        let bytes = as_earlier_versions_wrote(&group);
        prop_assert_eq!(decode::<Group>(&bytes).unwrap(), group);
    }
}
