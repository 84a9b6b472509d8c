//! A volume's IO limits (the `readBytesPerSecond`… attributes) held on the pods it is published
//! to: one cgroup v2 `io.max` line per device of the volume (its read-write loop device, and a
//! read-only one where a read-only publish attached it) in the pod's cgroup, found from the pod
//! UID the kubelet passes with `podInfoOnMount`. Written at publish (checked before anything is
//! mounted), lifted at unpublish, and rewritten for every pod by ControllerModifyVolume.
//!
//! The kernel throttles the IO the pod's processes submit to the loop device: reads and
//! direct writes at once, buffered writes when they are written back (cgroup v2 writeback).

use crate::linux::cgroup_io::{CgroupError, Hierarchy, Limits};
use crate::linux::loopdev::LoopError;
use crate::node_server::state::volumes::Record;

use super::Driver;

/// The volume context key the kubelet fills with the pod's UID (`podInfoOnMount: true`).
pub const POD_UID: &str = "csi.storage.k8s.io/pod.uid";

/// Why a volume's limits could not be held on a pod.
#[derive(Debug, thiserror::Error)]
pub enum IoLimitError {
    #[error(
        "volume {id} has IO limits, and the request names no pod (volume context \
         {POD_UID}): the CSIDriver needs podInfoOnMount: true"
    )]
    NoPod { id: String },
    #[error("volume {id}'s IO limits: {source}")]
    Cgroup {
        id: String,
        #[source]
        source: CgroupError,
    },
    #[error("volume {id}'s IO limits: finding its devices: {source}")]
    Loop {
        id: String,
        #[source]
        source: LoopError,
    },
    #[error("volume {id}'s IO limits: the numbers of device {device}: {source}")]
    DeviceNumbers {
        id: String,
        device: String,
        #[source]
        source: std::io::Error,
    },
}

impl Driver {
    /// The cgroup v2 hierarchy IO limits are written in, if this node has one with `io`.
    pub(super) fn io_hierarchy(&self) -> Result<Hierarchy, CgroupError> {
        Hierarchy::at(&self.config.cgroup_root)
    }

    /// Before a publish mounts anything: whether `record`'s limits (if any) can be held on
    /// `pod`. `Some` is the pod to hold them on.
    pub(super) fn io_limits_can_hold(
        &self,
        record: &Record,
        pod: Option<&str>,
    ) -> Result<Option<String>, IoLimitError> {
        if record.attributes.io_limits().is_none() || !record.has_own_file() {
            return Ok(None);
        }
        let id = &record.id;
        let pod = pod.ok_or_else(|| IoLimitError::NoPod { id: id.clone() })?;
        let cgroup = |source| IoLimitError::Cgroup {
            id: id.clone(),
            source,
        };
        self.io_hierarchy()
            .and_then(|h| h.pod(pod))
            .map_err(cgroup)?;
        Ok(Some(pod.to_owned()))
    }

    /// Writes `record`'s limits for each of its devices in `pod`'s cgroup (`Limits` unset:
    /// every key `max`, lifting them).
    pub(super) fn hold_io_limits(
        &self,
        record: &Record,
        pod: &str,
        limits: Limits,
    ) -> Result<(), IoLimitError> {
        let id = &record.id;
        let cgroup = |source| IoLimitError::Cgroup {
            id: id.clone(),
            source,
        };
        let hierarchy = self.io_hierarchy().map_err(cgroup)?;
        let found = (self.loops.find(&self.image_of(id))).map_err(|source| IoLimitError::Loop {
            id: id.clone(),
            source,
        })?;
        for status in &found.ours {
            let numbers = device_numbers(&status.device.to_string()).map_err(|source| {
                IoLimitError::DeviceNumbers {
                    id: id.clone(),
                    device: status.device.to_string(),
                    source,
                }
            })?;
            let line = limits.io_max_line(numbers);
            hierarchy.set(pod, &line).map_err(cgroup)?;
            log::debug!("volume {id}: pod {pod} io.max {line}");
        }
        Ok(())
    }

    /// At unpublish: the limits lifted from the pod's cgroup, if it is still there (the
    /// kubelet removes it once the pod is gone, and the limits with it).
    pub(super) fn lift_io_limits(&self, record: &Record, pod: &str) {
        match self.hold_io_limits(record, pod, Limits::default()) {
            Ok(()) => {}
            Err(IoLimitError::Cgroup {
                source: CgroupError::PodNotFound { .. },
                ..
            }) => {}
            Err(e) => log::warn!("{e}; left as they were"),
        }
    }

    /// ControllerModifyVolume: the new limits written for every pod the volume is published
    /// to.
    pub(super) fn rehold_io_limits(&self, record: &Record) -> Result<(), IoLimitError> {
        let Some(limits) = record.attributes.io_limits() else {
            return Ok(());
        };
        for pod in record.targets.iter().filter_map(|t| t.pod.as_deref()) {
            match self.hold_io_limits(record, pod, limits) {
                // A pod whose cgroup is gone is being torn down: nothing to limit.
                Err(IoLimitError::Cgroup {
                    source: CgroupError::PodNotFound { .. },
                    ..
                }) => {}
                other => other?,
            }
        }
        Ok(())
    }
}

/// A block device's `major:minor`, from sysfs (`/sys/class/block/<name>/dev`): the kernel's
/// own numbering, whatever the loop driver's `max_part`.
fn device_numbers(device: &str) -> std::io::Result<(u32, u32)> {
    let name = device.rsplit('/').next().unwrap_or(device);
    let text = std::fs::read_to_string(format!("/sys/class/block/{name}/dev"))?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{text:?}"));
    let (major, minor) = text.trim().split_once(':').ok_or_else(bad)?;
    Ok((
        major.parse().map_err(|_| bad())?,
        minor.parse().map_err(|_| bad())?,
    ))
}
