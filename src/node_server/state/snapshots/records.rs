//! What we remember about a snapshot and a group snapshot, and their JSON on disk. A record is
//! written only once the snapshot's data is complete and durable, so a record's existence is
//! what `ready_to_use` means.

use serde_json::{Value, json};

use crate::node_server::state::store::Persisted;

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

/// One snapshot: a copy of a volume's tree under `<state-dir>/snapshots/<id>/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub id: String,
    /// CreateSnapshot's name; empty for the members of a group, which are named by the group.
    pub name: String,
    pub source_volume: String,
    /// The source volume's capacity when the snapshot was cut: the least a restore needs.
    pub size: u64,
    /// When the copy began, just after the filesystem was synced.
    pub created: Time,
    /// The bytes its files hold (their allocated blocks), which `--capacity` counts.
    pub bytes: u64,
    /// The group snapshot it belongs to, which alone may delete it.
    pub group: Option<String>,
    /// Of a raw block volume (its file); absent in records from before block volumes.
    pub block: bool,
}

/// A group snapshot: its member snapshots, one per source volume, cut together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub id: String,
    pub name: String,
    /// The source volumes, as the request listed them.
    pub sources: Vec<String>,
    /// The member snapshot IDs, in the order of `sources`.
    pub members: Vec<String>,
    pub created: Time,
}

fn time_to_json((seconds, nanos): Time) -> Value {
    json!({ "seconds": seconds, "nanos": nanos })
}

fn time_from_json(value: &Value) -> Option<Time> {
    let nanos = u32::try_from(value.get("nanos")?.as_u64()?).ok()?;
    Some((value.get("seconds")?.as_i64()?, nanos))
}

fn text(value: &Value, key: &str) -> Option<String> {
    Some(value.get(key)?.as_str()?.to_owned())
}

fn strings(value: &Value) -> Option<Vec<String>> {
    (value.as_array()?.iter())
        .map(|v| v.as_str().map(str::to_owned))
        .collect()
}

impl Persisted for Snapshot {
    const KIND: &'static str = "snapshot";

    fn id(&self) -> &str {
        &self.id
    }

    fn to_json(&self) -> Value {
        let mut value = json!({
            "version": 1,
            "id": self.id,
            "name": self.name,
            "source_volume_id": self.source_volume,
            "size_bytes": self.size,
            "creation_time": time_to_json(self.created),
            "data_bytes": self.bytes,
            "group_snapshot_id": self.group,
        });
        if self.block {
            value["access_type"] = "block".into();
        }
        value
    }

    fn from_json(value: &Value) -> Option<Self> {
        let group = match value.get("group_snapshot_id")? {
            Value::Null => None,
            id => Some(id.as_str()?.to_owned()),
        };
        Some(Self {
            id: text(value, "id")?,
            name: text(value, "name")?,
            source_volume: text(value, "source_volume_id")?,
            size: value.get("size_bytes")?.as_u64()?,
            created: time_from_json(value.get("creation_time")?)?,
            bytes: value.get("data_bytes")?.as_u64()?,
            group,
            block: match value.get("access_type") {
                None => false,
                Some(kind) => kind.as_str()? == "block",
            },
        })
    }
}

impl Persisted for Group {
    const KIND: &'static str = "group snapshot";

    fn id(&self) -> &str {
        &self.id
    }

    fn to_json(&self) -> Value {
        json!({
            "version": 1,
            "creation_time": time_to_json(self.created),
            "id": self.id,
            "name": self.name,
            "source_volume_ids": self.sources,
            "snapshot_ids": self.members,
        })
    }

    fn from_json(value: &Value) -> Option<Self> {
        let group = Self {
            id: text(value, "id")?,
            name: text(value, "name")?,
            sources: strings(value.get("source_volume_ids")?)?,
            members: strings(value.get("snapshot_ids")?)?,
            created: time_from_json(value.get("creation_time")?)?,
        };
        (group.sources.len() == group.members.len()).then_some(group)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        for snapshot in [member, single, block] {
            assert_eq!(Snapshot::from_json(&snapshot.to_json()), Some(snapshot));
        }
        let group = Group {
            id: "group-1".into(),
            name: "group-a".into(),
            sources: vec!["vol-1".into(), "vol-2".into()],
            members: vec!["snap-1".into(), "snap-2".into()],
            created: (1, 2),
        };
        assert_eq!(Group::from_json(&group.to_json()), Some(group.clone()));
        let mut torn = group.to_json();
        torn["snapshot_ids"] = json!(["snap-1"]);
        assert_eq!(Group::from_json(&torn), None, "a member per source");
    }
}
