//! A volume's mutable attributes: what a VolumeAttributesClass (CreateVolume's and
//! ControllerModifyVolume's `mutable_parameters`) or a StorageClass (CreateVolume's
//! `parameters`) may set, and what node-server applies to a volume while it is in use.
//!
//! - `inodeLimit`: the most files, directories and symlinks the volume may hold, as the hard
//!   inode limit of its project quota (`0`: no limit; without it, the default for the size,
//!   `capacity::default_inodes`). Only where sizes are
//!   enforced: elsewhere there is no project to hold it to, and asking is INVALID_ARGUMENT.
//! - `rootMode`: the permission bits of the volume's root directory, octal (`0770`, `2775`;
//!   the default `0777` lets pods of any user write, like an emptyDir). Applied by `chmod` at
//!   once, to a published volume too.
//! - `directIO` (block and image volumes only): `true` (the default) or `false`, whether the volume's
//!   loop devices bypass the page cache for their file (`LOOP_SET_DIRECT_IO`), switched on
//!   the attached devices at once. `true` holds where the filesystem under the state
//!   directory allows it (not tmpfs); elsewhere the devices stay buffered.
//!
//! - `readBytesPerSecond`, `writeBytesPerSecond` (a quantity: `20Mi`, `1G`, `1048576`) and
//!   `readIOPS`, `writeIOPS` (a whole number): limits on the volume's own device for every pod
//!   it is published to, written as cgroup v2 `io.max` on the pod's cgroup at publish and
//!   changed there at once by ControllerModifyVolume (`0`: no limit). Block and image volumes
//!   only (a directory shares its filesystem's device with every other volume), and only on a
//!   node booted with cgroup v2.
//!
//! The first two apply to filesystem volumes (`inodeLimit` not to image volumes, whose inodes
//! are their own filesystem's), the last to block and image volumes; a key that does not apply
//! to the volume is refused.
//!
//! Only the keys given change anything (the CSI rule: absence of a key never modifies).

use std::collections::HashMap;

use serde::{Deserialize, Deserializer, Serialize};

pub const INODE_LIMIT: &str = "inodeLimit";
pub const ROOT_MODE: &str = "rootMode";
pub const DIRECT_IO: &str = "directIO";
pub const READ_BYTES_PER_SECOND: &str = "readBytesPerSecond";
pub const WRITE_BYTES_PER_SECOND: &str = "writeBytesPerSecond";
pub const READ_IOPS: &str = "readIOPS";
pub const WRITE_IOPS: &str = "writeIOPS";
/// Every key a VolumeAttributesClass may use, for error messages.
pub const KEYS: [&str; 7] = [
    INODE_LIMIT,
    ROOT_MODE,
    DIRECT_IO,
    READ_BYTES_PER_SECOND,
    WRITE_BYTES_PER_SECOND,
    READ_IOPS,
    WRITE_IOPS,
];

/// A volume's attributes; `None`: never set, the default holds.
///
/// In a volume record: numbers (the mode too, not its octal text) and a boolean, under the
/// parameters' own names; only those that are set. A record without attributes has the
/// defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Attributes {
    #[serde(rename = "inodeLimit", skip_serializing_if = "Option::is_none")]
    pub inode_limit: Option<u64>,
    #[serde(
        rename = "rootMode",
        skip_serializing_if = "Option::is_none",
        deserialize_with = "mode_bits"
    )]
    pub root_mode: Option<u32>,
    #[serde(rename = "directIO", skip_serializing_if = "Option::is_none")]
    pub direct_io: Option<bool>,
    /// IO limits (`Some(0)`: asked to be unlimited).
    #[serde(rename = "readBytesPerSecond", skip_serializing_if = "Option::is_none")]
    pub read_bytes_per_second: Option<u64>,
    #[serde(
        rename = "writeBytesPerSecond",
        skip_serializing_if = "Option::is_none"
    )]
    pub write_bytes_per_second: Option<u64>,
    #[serde(rename = "readIOPS", skip_serializing_if = "Option::is_none")]
    pub read_iops: Option<u64>,
    #[serde(rename = "writeIOPS", skip_serializing_if = "Option::is_none")]
    pub write_iops: Option<u64>,
}

/// A parameter node-server cannot apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParameterError {
    #[error(
        "{field} has {key:?}, which is not a mutable parameter of this driver (these are: {})",
        KEYS.join(", ")
    )]
    Unknown { field: &'static str, key: String },
    #[error("{field} {key}={value:?}: {why}")]
    Invalid {
        field: &'static str,
        key: &'static str,
        value: String,
        why: &'static str,
    },
}

/// The mode bits `chmod` takes: permissions, setuid, setgid, sticky.
const MODE_BITS: u32 = 0o7777;

/// A recorded `rootMode`: a number within [`MODE_BITS`].
fn mode_bits<'de, D: Deserializer<'de>>(from: D) -> Result<Option<u32>, D::Error> {
    match Option::<u64>::deserialize(from)? {
        Some(mode) if mode > u64::from(MODE_BITS) => Err(serde::de::Error::custom(format_args!(
            "rootMode {mode:#o} has bits beyond 0o7777"
        ))),
        mode => Ok(mode.map(|m| m as u32)),
    }
}

fn inode_limit(field: &'static str, value: &str) -> Result<u64, ParameterError> {
    let invalid = |why| ParameterError::Invalid {
        field,
        key: INODE_LIMIT,
        value: value.to_owned(),
        why,
    };
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid("must be a whole number of inodes (0: no limit)"));
    }
    value
        .parse()
        .map_err(|_| invalid("is larger than the kernel can count"))
}

fn root_mode(field: &'static str, value: &str) -> Result<u32, ParameterError> {
    let invalid = |why| ParameterError::Invalid {
        field,
        key: ROOT_MODE,
        value: value.to_owned(),
        why,
    };
    let digits = value.strip_prefix("0o").unwrap_or(value);
    if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b))
    {
        return Err(invalid(
            "must be octal permission bits, such as 0770 or 2775",
        ));
    }
    let mode = u32::from_str_radix(digits, 8).map_err(|_| invalid("is not octal"))?;
    if mode & !MODE_BITS != 0 {
        return Err(invalid("has bits beyond 07777"));
    }
    Ok(mode)
}

fn direct_io(field: &'static str, value: &str) -> Result<bool, ParameterError> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(ParameterError::Invalid {
            field,
            key: DIRECT_IO,
            value: value.to_owned(),
            why: "must be true or false",
        }),
    }
}

fn bytes_per_second(
    field: &'static str,
    key: &'static str,
    value: &str,
) -> Result<u64, ParameterError> {
    crate::quantity::parse_quantity(value).map_err(|_| ParameterError::Invalid {
        field,
        key,
        value: value.to_owned(),
        why: "must be bytes per second, such as 20Mi, 1G or 1048576 (0: no limit)",
    })
}

fn iops(field: &'static str, key: &'static str, value: &str) -> Result<u64, ParameterError> {
    let invalid = || ParameterError::Invalid {
        field,
        key,
        value: value.to_owned(),
        why: "must be a whole number of operations per second (0: no limit)",
    };
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    value.parse().map_err(|_| invalid())
}

impl Attributes {
    /// `mutable_parameters`: every key must be ours.
    pub fn from_mutable(map: &HashMap<String, String>) -> Result<Self, ParameterError> {
        Self::parse("mutable_parameters", map, true)
    }

    /// A StorageClass's `parameters`: our keys are checked, any other key is left alone (the
    /// external-provisioner adds its own, such as the PVC's name with `--extra-create-metadata`).
    pub fn from_parameters(map: &HashMap<String, String>) -> Result<Self, ParameterError> {
        Self::parse("parameters", map, false)
    }

    fn parse(
        field: &'static str,
        map: &HashMap<String, String>,
        strict: bool,
    ) -> Result<Self, ParameterError> {
        let mut attributes = Self::default();
        // In key order, so the first error named is the same on every call.
        let mut keys: Vec<&String> = map.keys().collect();
        keys.sort();
        for key in keys {
            let value = map[key].as_str();
            match key.as_str() {
                INODE_LIMIT => attributes.inode_limit = Some(inode_limit(field, value)?),
                ROOT_MODE => attributes.root_mode = Some(root_mode(field, value)?),
                DIRECT_IO => attributes.direct_io = Some(direct_io(field, value)?),
                READ_BYTES_PER_SECOND => {
                    attributes.read_bytes_per_second =
                        Some(bytes_per_second(field, READ_BYTES_PER_SECOND, value)?)
                }
                WRITE_BYTES_PER_SECOND => {
                    attributes.write_bytes_per_second =
                        Some(bytes_per_second(field, WRITE_BYTES_PER_SECOND, value)?)
                }
                READ_IOPS => attributes.read_iops = Some(iops(field, READ_IOPS, value)?),
                WRITE_IOPS => attributes.write_iops = Some(iops(field, WRITE_IOPS, value)?),
                _ if strict => {
                    return Err(ParameterError::Unknown {
                        field,
                        key: key.clone(),
                    });
                }
                _ => {}
            }
        }
        Ok(attributes)
    }

    /// These attributes with the ones `change` sets (and only those) replaced.
    pub fn with(self, change: Attributes) -> Self {
        Self {
            inode_limit: change.inode_limit.or(self.inode_limit),
            root_mode: change.root_mode.or(self.root_mode),
            direct_io: change.direct_io.or(self.direct_io),
            read_bytes_per_second: change.read_bytes_per_second.or(self.read_bytes_per_second),
            write_bytes_per_second: change
                .write_bytes_per_second
                .or(self.write_bytes_per_second),
            read_iops: change.read_iops.or(self.read_iops),
            write_iops: change.write_iops.or(self.write_iops),
        }
    }

    /// The IO keys these attributes set, in [`KEYS`] order.
    fn io_values(&self) -> [(&'static str, Option<u64>); 4] {
        [
            (READ_BYTES_PER_SECOND, self.read_bytes_per_second),
            (WRITE_BYTES_PER_SECOND, self.write_bytes_per_second),
            (READ_IOPS, self.read_iops),
            (WRITE_IOPS, self.write_iops),
        ]
    }

    /// The first IO key these attributes set, if any (`0` included).
    pub fn io_key(&self) -> Option<&'static str> {
        self.io_values()
            .into_iter()
            .find_map(|(key, v)| v.map(|_| key))
    }

    /// The first IO key set to a limit (not `0`), if any.
    pub fn io_limit_key(&self) -> Option<&'static str> {
        (self.io_values().into_iter()).find_map(|(key, v)| v.filter(|&v| v > 0).map(|_| key))
    }

    /// The volume's device limits, if any IO key was ever set (all `max` once set to `0`).
    pub fn io_limits(&self) -> Option<crate::linux::cgroup_io::Limits> {
        self.io_key()?;
        let limit = |v: Option<u64>| v.filter(|&v| v > 0);
        Some(crate::linux::cgroup_io::Limits {
            read_bytes: limit(self.read_bytes_per_second),
            write_bytes: limit(self.write_bytes_per_second),
            read_iops: limit(self.read_iops),
            write_iops: limit(self.write_iops),
        })
    }

    /// Whether every attribute `wanted` sets has that value here.
    pub fn agrees_with(&self, wanted: &Attributes) -> bool {
        self.with(*wanted) == *self
    }

    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// As the CO gave them, for ValidateVolumeCapabilities and log lines.
    pub fn to_map(self) -> HashMap<String, String> {
        let mut map = HashMap::new();
        if let Some(limit) = self.inode_limit {
            map.insert(INODE_LIMIT.to_owned(), limit.to_string());
        }
        if let Some(mode) = self.root_mode {
            map.insert(ROOT_MODE.to_owned(), format!("{mode:04o}"));
        }
        if let Some(on) = self.direct_io {
            map.insert(DIRECT_IO.to_owned(), on.to_string());
        }
        for (key, value) in self.io_values() {
            if let Some(value) = value {
                map.insert(key.to_owned(), value.to_string());
            }
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn both_keys_are_read_and_an_unknown_key_is_refused_only_in_mutable_parameters() {
        let given = map(&[
            ("inodeLimit", "1000"),
            ("rootMode", "0770"),
            ("directIO", "false"),
        ]);
        let expected = Attributes {
            inode_limit: Some(1000),
            root_mode: Some(0o770),
            direct_io: Some(false),
            ..Default::default()
        };
        assert_eq!(Attributes::from_mutable(&given), Ok(expected));
        let fake = map(&[("XXX_FakeKey", "XXX_FakeValue")]);
        let err = Attributes::from_mutable(&fake).unwrap_err();
        assert!(matches!(err, ParameterError::Unknown { .. }), "{err}");
        assert!(
            err.to_string().contains("inodeLimit, rootMode, directIO"),
            "{err}"
        );
        let provisioner = map(&[("csi.storage.k8s.io/pvc/name", "data"), ("rootMode", "755")]);
        let from_class = Attributes::from_parameters(&provisioner).unwrap();
        assert_eq!(from_class.root_mode, Some(0o755));
    }

    #[test]
    fn malformed_values_are_refused_naming_the_key_and_the_value() {
        for (key, value) in [
            ("inodeLimit", "-1"),
            ("inodeLimit", "1e6"),
            ("inodeLimit", ""),
            ("inodeLimit", "99999999999999999999999"),
            ("rootMode", "0778"),
            ("rootMode", "rwxr-x---"),
            ("rootMode", "17777"),
            ("rootMode", ""),
            ("directIO", "yes"),
        ] {
            let err = Attributes::from_mutable(&map(&[(key, value)])).unwrap_err();
            let text = err.to_string();
            assert!(text.contains(key) && text.contains(value), "{text}");
        }
        let mode = Attributes::from_mutable(&map(&[("rootMode", "0o2775")])).unwrap();
        assert_eq!(mode.root_mode, Some(0o2775));
    }

    #[test]
    fn a_change_replaces_only_the_attributes_it_names() {
        let now = Attributes {
            inode_limit: Some(10),
            root_mode: Some(0o700),
            direct_io: None,
            ..Default::default()
        };
        let change = Attributes {
            root_mode: Some(0o750),
            ..Default::default()
        };
        let after = now.with(change);
        assert_eq!(after.inode_limit, Some(10));
        assert_eq!(after.root_mode, Some(0o750));
        assert!(after.agrees_with(&change));
        assert!(!now.agrees_with(&change));
        assert!(now.agrees_with(&Attributes::default()));
    }

    #[test]
    fn attributes_round_trip_through_a_record_and_absent_ones_stay_absent() {
        use serde_json::{from_value, json, to_value};
        let full = Attributes {
            inode_limit: Some(0),
            root_mode: Some(0o2770),
            direct_io: Some(true),
            read_bytes_per_second: Some(1 << 20),
            write_bytes_per_second: Some(0),
            read_iops: Some(100),
            write_iops: Some(50),
        };
        let written = to_value(full).unwrap();
        assert_eq!(
            written,
            json!({ "inodeLimit": 0, "rootMode": 0o2770, "directIO": true,
                    "readBytesPerSecond": 1048576, "writeBytesPerSecond": 0,
                    "readIOPS": 100, "writeIOPS": 50 })
        );
        let mut keys: Vec<&str> = written.as_object().unwrap().keys().map(|k| &**k).collect();
        let mut ours = KEYS.to_vec();
        keys.sort();
        ours.sort();
        assert_eq!(keys, ours, "the records use the parameters' own names");
        assert_eq!(from_value::<Attributes>(written).unwrap(), full);
        let none = Attributes::default();
        assert_eq!(to_value(none).unwrap(), json!({}));
        assert_eq!(from_value::<Attributes>(json!({})).unwrap(), none);
        let bad = from_value::<Attributes>(json!({ "rootMode": 0o17777 })).unwrap_err();
        assert!(bad.to_string().contains("rootMode 0o17777"), "{bad}");
        assert!(from_value::<Attributes>(json!({ "rootMode": "0770" })).is_err());
        assert_eq!(full.to_map()["rootMode"], "2770");
    }

    #[test]
    fn io_limits_take_quantities_and_whole_numbers_and_zero_lifts_one() {
        let given = map(&[
            ("readBytesPerSecond", "20Mi"),
            ("writeBytesPerSecond", "0"),
            ("writeIOPS", "150"),
        ]);
        let attributes = Attributes::from_mutable(&given).unwrap();
        assert_eq!(attributes.read_bytes_per_second, Some(20 << 20));
        assert_eq!(attributes.io_key(), Some(READ_BYTES_PER_SECOND));
        assert_eq!(attributes.io_limit_key(), Some(READ_BYTES_PER_SECOND));
        let limits = attributes.io_limits().unwrap();
        assert_eq!(
            limits.io_max_line((7, 1)),
            "7:1 rbps=20971520 wbps=max riops=max wiops=150"
        );
        let lifted = attributes
            .with(Attributes::from_mutable(&map(&[("readBytesPerSecond", "0")])).unwrap());
        assert_eq!(lifted.io_limit_key(), Some(WRITE_IOPS));
        assert!(Attributes::default().io_limits().is_none());
        for (key, bad) in [
            ("readIOPS", "1.5"),
            ("writeIOPS", "-1"),
            ("readBytesPerSecond", "fast"),
        ] {
            let err = Attributes::from_mutable(&map(&[(key, bad)])).unwrap_err();
            assert!(
                err.to_string().contains(key) && err.to_string().contains(bad),
                "{err}"
            );
        }
    }
}
