//! Per-device I/O limits of a pod, in cgroup v2's `io.max`: the pod's cgroup found from its UID
//! under either layout the kubelet makes, and the limit line for one device written there.
//! Nothing here knows volumes: `node_server::driver::io_limits` writes a volume's limits at
//! publish, lifts them at unpublish and rewrites them at ControllerModifyVolume.
//!
//! The kubelet's two cgroup drivers name a pod's cgroup differently (its QoS class picks the
//! middle level; Guaranteed pods sit directly under the top):
//!
//! - systemd: `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`, the
//!   UID's dashes written as underscores (a dash is systemd's slice separator);
//! - cgroupfs: `kubepods/burstable/pod<uid>`.

use std::path::{Path, PathBuf};

use crate::path_io::PathIoError;

/// A device's limits; `None` is no limit (`max`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub read_bytes: Option<u64>,
    pub write_bytes: Option<u64>,
    pub read_iops: Option<u64>,
    pub write_iops: Option<u64>,
}

impl Limits {
    /// The `io.max` line setting these limits on device `major:minor` (every key written, so a
    /// limit dropped from a volume is lifted rather than kept).
    pub fn io_max_line(&self, (major, minor): (u32, u32)) -> String {
        let value = |v: Option<u64>| v.map_or_else(|| "max".to_owned(), |v| v.to_string());
        format!(
            "{major}:{minor} rbps={} wbps={} riops={} wiops={}",
            value(self.read_bytes),
            value(self.write_bytes),
            value(self.read_iops),
            value(self.write_iops)
        )
    }
}

/// Why a pod's limits cannot be set.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "{} is not a cgroup v2 hierarchy (no cgroup.controllers): per-volume IO limits need a \
         node booted with cgroup v2 (systemd.unified_cgroup_hierarchy=1)",
        root.display()
    )]
    NotV2 { root: PathBuf },
    #[error(
        "the io controller is not available in {} (cgroup.controllers: {controllers:?}): \
         per-volume IO limits need it",
        root.display()
    )]
    NoIoController { root: PathBuf, controllers: String },
    #[error("pod UID {0:?} is not a UID (8-4-4-4-12 hexadecimal digits)")]
    BadUid(String),
    #[error(
        "no cgroup of pod {uid} under {} (looked for the systemd and the cgroupfs drivers' \
         names in every QoS class)",
        root.display()
    )]
    PodNotFound { uid: String, root: PathBuf },
    #[error(
        "the io controller is not enabled for pod {uid}'s cgroup {} (no io.max): the parent's \
         cgroup.subtree_control lacks +io",
        cgroup.display()
    )]
    NotEnabled { uid: String, cgroup: PathBuf },
    #[error(transparent)]
    Io(#[from] PathIoError),
}

/// A cgroup v2 hierarchy with the io controller.
#[derive(Debug, Clone)]
pub struct Hierarchy {
    root: PathBuf,
}

impl Hierarchy {
    /// The hierarchy mounted at `root` (`/sys/fs/cgroup` on a node), if it is cgroup v2 and
    /// offers the io controller.
    pub fn at(root: &Path) -> Result<Self, CgroupError> {
        let listed = root.join("cgroup.controllers");
        let controllers = match std::fs::read_to_string(&listed) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(CgroupError::NotV2 {
                    root: root.to_owned(),
                });
            }
            Err(e) => return Err(PathIoError::new("read", &listed, e).into()),
        };
        if !controllers.split_whitespace().any(|c| c == "io") {
            return Err(CgroupError::NoIoController {
                root: root.to_owned(),
                controllers: controllers.trim().to_owned(),
            });
        }
        Ok(Self {
            root: root.to_owned(),
        })
    }

    /// The cgroup of the pod with `uid`, in either driver's layout and any QoS class.
    pub fn pod(&self, uid: &str) -> Result<PathBuf, CgroupError> {
        if !is_uid(uid) {
            return Err(CgroupError::BadUid(uid.to_owned()));
        }
        let found = candidates(uid)
            .into_iter()
            .map(|relative| self.root.join(relative))
            .find(|path| path.is_dir());
        found.ok_or_else(|| CgroupError::PodNotFound {
            uid: uid.to_owned(),
            root: self.root.clone(),
        })
    }

    /// Writes `line` (see [`Limits::io_max_line`]) to the pod cgroup's `io.max`.
    pub fn set(&self, uid: &str, line: &str) -> Result<(), CgroupError> {
        let cgroup = self.pod(uid)?;
        let file = cgroup.join("io.max");
        if !file.exists() {
            return Err(CgroupError::NotEnabled {
                uid: uid.to_owned(),
                cgroup,
            });
        }
        std::fs::write(&file, line).map_err(PathIoError::at("write", &file))?;
        Ok(())
    }
}

/// Whether `uid` has a Kubernetes UID's shape; nothing else may become part of a path.
fn is_uid(uid: &str) -> bool {
    let groups: Vec<&str> = uid.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Where each driver puts the pod's cgroup, for each QoS class.
fn candidates(uid: &str) -> Vec<PathBuf> {
    let systemd_uid = uid.replace('-', "_");
    let mut paths = vec![
        PathBuf::from(format!("kubepods.slice/kubepods-pod{systemd_uid}.slice")),
        PathBuf::from(format!("kubepods/pod{uid}")),
    ];
    for qos in ["burstable", "besteffort"] {
        paths.push(PathBuf::from(format!(
            "kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{systemd_uid}.slice"
        )));
        paths.push(PathBuf::from(format!("kubepods/{qos}/pod{uid}")));
    }
    paths
}

#[cfg(test)]
mod tests;
