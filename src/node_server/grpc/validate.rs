//! Request checks with the exact gRPC codes the CSI spec demands. Everything here is pure:
//! handlers call these first, before looking anything up, so a malformed request is refused
//! the same way whether or not the volume exists.

use std::path::PathBuf;

use tonic::Status;

use crate::csi_spec::Field;
use crate::linux::mount::MountOptions;
use crate::linux::mount_options::{OptionsError, SelinuxContext};
use crate::proto::csi::{CapacityRange, VolumeCapability, volume_capability};

pub use volume_capability::access_mode::Mode as AccessMode;

pub use crate::node_server::grpc::field_limits::MAX_STRING;
pub use crate::node_server::state::state_dir::{MAX_VOLUME_ID, volume_id_problem};
pub use crate::paths::{nested, normalise};

/// A required string field.
pub fn required<'a>(field: &str, value: &'a str) -> Result<&'a str, Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{field} is required")));
    }
    Ok(value)
}

/// A CreateVolume name: see [`named`].
pub fn name(value: &str) -> Result<&str, Status> {
    named("name", value)
}

/// A name a CO gives (CreateVolume, CreateSnapshot, CreateVolumeGroupSnapshot): required, at
/// most the spec's 128 bytes, and free of the control characters the CSI spec excludes from
/// names (U+0000–U+0008, U+000B, U+000C, U+000E–U+001F, U+007F–U+009F).
pub fn named<'a>(field: &str, value: &'a str) -> Result<&'a str, Status> {
    required(field, value)?;
    if value.len() > MAX_STRING {
        return Err(Status::invalid_argument(format!(
            "{field} is {} bytes; the CSI spec allows at most {MAX_STRING}",
            value.len()
        )));
    }
    let excluded = |c: &char| matches!(c, '\u{0}'..='\u{8}' | '\u{b}' | '\u{c}' | '\u{e}'..='\u{1f}' | '\u{7f}'..='\u{9f}');
    match value.chars().find(excluded) {
        Some(c) => Err(Status::invalid_argument(format!(
            "{field} contains U+{:04X}, a control character the CSI spec excludes from names",
            u32::from(c)
        ))),
        None => Ok(value),
    }
}

/// A required ID of a snapshot or a group snapshot (`field` names which): at most the spec's
/// 128 bytes and one plain path component, as the IDs this plugin issues are.
pub fn snapshot_id<'a>(field: &str, id: &'a str) -> Result<&'a str, Status> {
    required(field, id)?;
    let problem = match id_problem(id) {
        _ if id.len() > MAX_STRING => Some("is longer than the spec's 128 bytes"),
        problem => problem,
    };
    match problem {
        Some(problem) => Err(Status::invalid_argument(format!(
            "{field} {:?} {problem}",
            clip(id)
        ))),
        None => Ok(id),
    }
}

/// A value from a request, cut short for a message: an error never carries a field whole.
pub fn clip(value: &str) -> String {
    match value.char_indices().nth(40) {
        Some((end, _)) => format!("{}…", &value[..end]),
        None => value.to_owned(),
    }
}

/// A required volume ID that is safe to use as a directory name.
pub fn volume_id(id: &str) -> Result<&str, Status> {
    volume_id_of("volume_id", id)
}

/// [`volume_id`], in a field of another name (`source_volume_id`, `source_volume_ids`).
pub fn volume_id_of<'a>(field: &str, id: &'a str) -> Result<&'a str, Status> {
    required(field, id)?;
    match id_problem(id) {
        Some(problem) => Err(Status::invalid_argument(format!(
            "{field} {:?} {problem}",
            clip(id)
        ))),
        None => Ok(id),
    }
}

/// What is wrong with an ID from a request: what makes it no directory name of ours, or a
/// control character (NUL, DEL, ESC…), which no ID this plugin issues has and which a message
/// naming the ID would carry to the CO's logs raw.
fn id_problem(id: &str) -> Option<&'static str> {
    match volume_id_problem(id) {
        None if id.chars().any(char::is_control) => Some("contains a control character"),
        problem => problem,
    }
}

/// A required absolute path from a request.
pub fn path(field: Field, value: &str) -> Result<PathBuf, Status> {
    required(field.wire_name(), value)?;
    normalise(value)
        .map_err(|problem| Status::invalid_argument(format!("{field} {value:?} {problem}")))
}

/// A volume capability, checked and reduced to what we act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capability {
    pub mode: AccessMode,
    /// Raw block access: the volume is a device, not a directory.
    pub block: bool,
    /// The capability's own mount flags (the request's `readonly` is added by the caller),
    /// the SELinux context taken out.
    pub flags: Vec<String>,
    /// `context=` among the mount flags: for a volume with a filesystem of its own only.
    pub context: Option<SelinuxContext>,
    /// `volume_mount_group`: the group that must own the volume.
    pub group: Option<u32>,
}

impl Capability {
    /// Mount options for this capability plus the request's `readonly`.
    pub fn options(&self, readonly: bool) -> Result<MountOptions, Status> {
        MountOptions::parse(&self.flags, readonly)
            .map_err(|e| Status::invalid_argument(e.to_string()))
    }
}

/// A required, well-formed volume capability.
pub fn capability(cap: Option<&VolumeCapability>) -> Result<Capability, Status> {
    let cap = cap.ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
    let mode = cap
        .access_mode
        .as_ref()
        .ok_or_else(|| Status::invalid_argument("volume_capability.access_mode is required"))?;
    let mode = match AccessMode::try_from(mode.mode) {
        Ok(AccessMode::Unknown) | Err(_) => {
            return Err(Status::invalid_argument(format!(
                "volume_capability.access_mode {} is not a known mode",
                mode.mode
            )));
        }
        Ok(mode) => mode,
    };
    match &cap.access_type {
        None => Err(Status::invalid_argument(
            "volume_capability.access_type (mount or block) is required",
        )),
        Some(volume_capability::AccessType::Block(_)) => Ok(Capability {
            mode,
            block: true,
            flags: Vec::new(),
            context: None,
            group: None,
        }),
        Some(volume_capability::AccessType::Mount(mount)) => {
            let invalid = |e: OptionsError| Status::invalid_argument(e.to_string());
            let (context, flags) = SelinuxContext::take(&mount.mount_flags).map_err(invalid)?;
            MountOptions::parse(&flags, false).map_err(invalid)?;
            let group = match mount.volume_mount_group.as_str() {
                "" => None,
                text => Some(text.parse::<u32>().map_err(|_| {
                    Status::invalid_argument(format!(
                        "volume_mount_group {text:?} is not a numeric group ID"
                    ))
                })?),
            };
            Ok(Capability {
                mode,
                block: false,
                flags,
                context,
                group,
            })
        }
    }
}

/// A non-empty list of well-formed capabilities.
pub fn capabilities(caps: &[VolumeCapability]) -> Result<Vec<Capability>, Status> {
    if caps.is_empty() {
        return Err(Status::invalid_argument("volume_capabilities is required"));
    }
    caps.iter().map(|c| capability(Some(c))).collect()
}

/// A capacity range as (required, limit) bytes; zero means "no bound" on either side.
pub fn capacity_range(range: Option<&CapacityRange>) -> Result<(u64, u64), Status> {
    let Some(range) = range else {
        return Ok((0, 0));
    };
    let (Ok(required), Ok(limit)) = (
        u64::try_from(range.required_bytes),
        u64::try_from(range.limit_bytes),
    ) else {
        return Err(Status::invalid_argument(
            "capacity_range bytes may not be negative",
        ));
    };
    if limit > 0 && required > limit {
        return Err(Status::out_of_range(format!(
            "capacity_range required_bytes {required} exceeds limit_bytes {limit}"
        )));
    }
    Ok((required, limit))
}

/// The longest `starting_token` this plugin issues: the hex of the longest volume ID.
pub const MAX_TOKEN: usize = 2 * MAX_VOLUME_ID;

/// ListVolumes and ListSnapshots tokens are the lowercase hex of the ID of the next entry to
/// return: opaque to the CO, stable when entries before it are deleted, and anything we did
/// not issue fails to decode.
pub fn encode_token(next_id: &str) -> String {
    next_id.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Decodes a `starting_token`; an empty token means "from the start". A token we could not
/// have issued — too long, not lowercase hex pairs, or not the hex of an ID `issued` accepts —
/// is ABORTED, as the spec demands, and is not echoed in the message (a CO's error metadata
/// is bounded too).
pub fn decode_token(token: &str, issued: fn(&str) -> bool) -> Result<Option<String>, Status> {
    if token.is_empty() {
        return Ok(None);
    }
    let invalid = || {
        Status::aborted(format!(
            "starting_token ({} bytes) is not a token this plugin issued; list from the start",
            token.len()
        ))
    };
    let hex = |b: u8| matches!(b, b'0'..=b'9' | b'a'..=b'f');
    if token.len() > MAX_TOKEN || !token.len().is_multiple_of(2) || !token.bytes().all(hex) {
        return Err(invalid());
    }
    let bytes = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&token[i..i + 2], 16).ok())
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(invalid)?;
    let id = String::from_utf8(bytes).map_err(|_| invalid())?;
    if volume_id_problem(&id).is_some() || id.chars().any(char::is_control) || !issued(&id) {
        return Err(invalid());
    }
    Ok(Some(id))
}

/// Any volume ID: kubelet's inline-volume IDs are ours to list too.
pub fn any_volume_id(_: &str) -> bool {
    true
}

/// A snapshot ID as this plugin makes them: `snap-` and 32 lowercase hex digits.
pub fn issued_snapshot_id(id: &str) -> bool {
    id.strip_prefix("snap-").is_some_and(|rest| {
        rest.len() == 32 && rest.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

#[cfg(test)]
mod tests;
