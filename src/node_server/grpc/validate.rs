//! Request checks with the exact gRPC codes the CSI spec demands. Everything here is pure:
//! handlers call these first, before looking anything up, so a malformed request is refused
//! the same way whether or not the volume exists.

use std::path::PathBuf;

use tonic::Status;

use crate::linux::mount::MountOptions;
use crate::proto::csi::{CapacityRange, VolumeCapability, volume_capability};

pub use volume_capability::access_mode::Mode as AccessMode;

pub use crate::node_server::state::layout::{MAX_VOLUME_ID, volume_id_problem};
pub use crate::paths::{nested, normalise};

/// A required string field.
pub fn required<'a>(field: &str, value: &'a str) -> Result<&'a str, Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{field} is required")));
    }
    Ok(value)
}

/// A CreateVolume name: required, and free of the control characters the CSI spec excludes
/// from names (U+0000–U+0008, U+000B, U+000C, U+000E–U+001F, U+007F–U+009F).
pub fn name(value: &str) -> Result<&str, Status> {
    required("name", value)?;
    let excluded = |c: &char| matches!(c, '\u{0}'..='\u{8}' | '\u{b}' | '\u{c}' | '\u{e}'..='\u{1f}' | '\u{7f}'..='\u{9f}');
    match value.chars().find(excluded) {
        Some(c) => Err(Status::invalid_argument(format!(
            "name contains U+{:04X}, a control character the CSI spec excludes from names",
            u32::from(c)
        ))),
        None => Ok(value),
    }
}

/// A required volume ID that is safe to use as a directory name.
pub fn volume_id(id: &str) -> Result<&str, Status> {
    required("volume_id", id)?;
    match volume_id_problem(id) {
        Some(problem) => Err(Status::invalid_argument(format!(
            "volume_id {id:?} {problem}"
        ))),
        None => Ok(id),
    }
}

/// A required absolute path from a request.
pub fn path(field: &str, value: &str) -> Result<PathBuf, Status> {
    required(field, value)?;
    normalise(value)
        .map_err(|problem| Status::invalid_argument(format!("{field} {value:?} {problem}")))
}

/// A volume capability, checked and reduced to what we act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capability {
    pub mode: AccessMode,
    /// Raw block access: the volume is a device, not a directory.
    pub block: bool,
    /// The capability's own mount flags (the request's `readonly` is added by the caller).
    pub flags: Vec<String>,
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
            group: None,
        }),
        Some(volume_capability::AccessType::Mount(mount)) => {
            MountOptions::parse(&mount.mount_flags, false)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
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
                flags: mount.mount_flags.clone(),
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

/// ListVolumes tokens are the hex-encoded ID of the next volume to return: opaque to the CO,
/// stable when volumes before it are deleted, and anything we did not issue fails to decode.
pub fn encode_token(next_id: &str) -> String {
    next_id.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Decodes a `starting_token`; an empty token means "from the start". Invalid → ABORTED, as
/// the spec demands.
pub fn decode_token(token: &str) -> Result<Option<String>, Status> {
    if token.is_empty() {
        return Ok(None);
    }
    let invalid = || Status::aborted(format!("starting_token {token:?} is not valid"));
    if !token.len().is_multiple_of(2) {
        return Err(invalid());
    }
    let bytes = (0..token.len())
        .step_by(2)
        .map(|i| {
            token
                .get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
        })
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(invalid)?;
    let id = String::from_utf8(bytes).map_err(|_| invalid())?;
    if volume_id_problem(&id).is_some() {
        return Err(invalid());
    }
    Ok(Some(id))
}

#[cfg(test)]
mod tests;
