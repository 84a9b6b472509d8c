//! What we remember about a snapshot and a group snapshot, and their JSON on disk. A record is
//! written only once the snapshot's data is complete and durable, so a record's existence is
//! what `ready_to_use` means.

use serde::{Deserialize, Serialize};

use crate::node_server::state::store::Persisted;
use crate::node_server::state::volumes::Layout;
use crate::node_server::state::volumes::volume_record::access_type;

/// Seconds and nanoseconds since the Unix epoch.
pub type Time = (i64, u32);

/// The time now, as a snapshot's `creation_time`.
pub fn now() -> Time {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (
        i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        since.subsec_nanos(),
    )
}

/// A [`Time`] on disk: `{"seconds": <i64>, "nanos": <u32>}`, as protobuf's Timestamp.
mod timestamp {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::Time;

    #[derive(Serialize, Deserialize)]
    struct Timestamp {
        seconds: i64,
        nanos: u32,
    }

    pub fn serialize<S: Serializer>(&(seconds, nanos): &Time, to: S) -> Result<S::Ok, S::Error> {
        Timestamp { seconds, nanos }.serialize(to)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(from: D) -> Result<Time, D::Error> {
        let Timestamp { seconds, nanos } = Timestamp::deserialize(from)?;
        Ok((seconds, nanos))
    }
}

/// One snapshot: a copy of a volume's tree in its own data directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub id: String,
    /// CreateSnapshot's name; empty for the members of a group, which are named by the group.
    pub name: String,
    #[serde(rename = "source_volume_id")]
    pub source_volume: String,
    /// The source volume's capacity when the snapshot was cut: the least a restore needs.
    #[serde(rename = "size_bytes")]
    pub size: u64,
    /// When the copy began, just after the filesystem was synced.
    #[serde(rename = "creation_time", with = "timestamp")]
    pub created: Time,
    /// The bytes its files hold (their allocated blocks), which `--capacity` counts.
    #[serde(rename = "data_bytes")]
    pub bytes: u64,
    /// The group snapshot it belongs to, which alone may delete it. Always written, `null`
    /// for none: earlier versions refuse a record without the key.
    #[serde(rename = "group_snapshot_id")]
    pub group: Option<String>,
    /// Of a raw block volume (its file); absent in records from before block volumes.
    #[serde(
        rename = "access_type",
        default,
        skip_serializing_if = "access_type::is_mount",
        serialize_with = "access_type::serialize",
        deserialize_with = "access_type::deserialize_any_string"
    )]
    pub block: bool,
    /// Of an image volume (its file, holding its filesystem): restored only as one. Absent
    /// for a directory volume's, and in records from before layouts.
    #[serde(default, skip_serializing_if = "Layout::is_directory")]
    pub layout: Layout,
}

/// A group snapshot: its member snapshots, one per source volume, cut together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    pub id: String,
    pub name: String,
    /// The source volumes, as the request listed them.
    #[serde(rename = "source_volume_ids")]
    pub sources: Vec<String>,
    /// The member snapshot IDs, in the order of `sources`.
    #[serde(rename = "snapshot_ids")]
    pub members: Vec<String>,
    #[serde(rename = "creation_time", with = "timestamp")]
    pub created: Time,
}

impl Persisted for Snapshot {
    const KIND: &'static str = "snapshot";

    fn id(&self) -> &str {
        &self.id
    }
}

impl Persisted for Group {
    const KIND: &'static str = "group snapshot";

    fn id(&self) -> &str {
        &self.id
    }

    /// A member per source.
    fn problem(&self) -> Option<String> {
        (self.sources.len() != self.members.len()).then(|| {
            format!(
                "{} source volume(s) but {} member snapshot(s)",
                self.sources.len(),
                self.members.len()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_server::state::store::{decode, encode};

    #[test]
    fn snapshot_and_group_records_read_back_what_they_wrote() {
        let member = Snapshot {
            id: "snap-1".into(),
            name: String::new(),
            source_volume: "vol-1".into(),
            size: 1 << 30,
            created: (1_700_000_000, 999_999_999),
            bytes: 4096,
            group: Some("group-1".into()),
            block: false,
            layout: Layout::Directory,
        };
        let single = Snapshot {
            name: "snapshot-a".into(),
            group: None,
            ..member.clone()
        };
        let block = Snapshot {
            block: true,
            ..single.clone()
        };
        let image = Snapshot {
            layout: Layout::Image,
            ..single.clone()
        };
        for snapshot in [member, single, block, image] {
            let bytes = encode(&snapshot).unwrap();
            assert_eq!(decode::<Snapshot>(&bytes).unwrap(), snapshot);
        }
        let group = Group {
            id: "group-1".into(),
            name: "group-a".into(),
            sources: vec!["vol-1".into(), "vol-2".into()],
            members: vec!["snap-1".into(), "snap-2".into()],
            created: (1, 2),
        };
        let bytes = encode(&group).unwrap();
        assert_eq!(decode::<Group>(&bytes).unwrap(), group);
        assert_eq!(group.problem(), None);
        let torn = Group {
            members: vec!["snap-1".into()],
            ..group
        };
        assert_eq!(
            torn.problem().as_deref(),
            Some("2 source volume(s) but 1 member snapshot(s)"),
            "a member per source"
        );
    }
}
