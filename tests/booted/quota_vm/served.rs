//! Inside the VM: the real node-server binary on a test filesystem, and what the cases that
//! drive it through gRPC share — starting and restarting it, a pod's staging and target
//! paths, the volume records it writes, and its answers to the calls.

use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_nodekit::proto::csi::*;

use super::fixtures::TestFs;
use crate::common::csi_node::{self, Csi};
use crate::common::{self, KillOnDrop};

/// A node-server process with its state on a test filesystem.
pub struct Served {
    pub state: PathBuf,
    pub socket: PathBuf,
    process: Option<KillOnDrop>,
    extra: Vec<String>,
    /// Socket, staging and pod directories, off the test filesystem (as on a node, where
    /// they are the kubelet's).
    scratch: tempfile::TempDir,
}

impl Served {
    /// Starts node-server with `--state-dir=<fs>/<name>` and `extra` flags.
    pub fn start(fs: &TestFs, name: &str, extra: &[&str]) -> Self {
        Self::start_on(&fs.mnt, name, extra)
    }

    /// Starts node-server with `--state-dir=<mnt>/<name>` and `extra` flags.
    pub fn start_on(mnt: &Path, name: &str, extra: &[&str]) -> Self {
        let scratch = tempfile::Builder::new()
            .prefix("quota-vm-served-")
            .tempdir()
            .expect("scratch dir");
        let mut served = Self {
            state: mnt.join(name),
            socket: scratch.path().join("csi.sock"),
            process: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            scratch,
        };
        served.restart();
        served
    }

    /// The fanotify groups node-server holds open (its write watch is one).
    pub fn fanotify_groups(&self) -> usize {
        let process = self.process.as_ref().expect("running");
        let fds = format!("/proc/{}/fd", process.0.id());
        std::fs::read_dir(fds)
            .expect("its descriptors")
            .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
            .filter(|link| link.as_os_str() == "anon_inode:[fanotify]")
            .count()
    }

    /// Stops the process (SIGTERM, as the kubelet does) and waits for its exit code.
    pub fn stop(&mut self) -> i32 {
        let Some(mut process) = self.process.take() else {
            return 0;
        };
        common::send_signal(&process.0, nix::sys::signal::Signal::SIGTERM);
        let status = common::wait_exit(&mut process.0, Duration::from_secs(60));
        status.code().unwrap_or(-1)
    }

    /// Stops it if it runs, and starts it again on the same state and socket.
    pub fn restart(&mut self) {
        assert_eq!(self.stop(), 0, "node-server exit code");
        let mut flags = vec!["--node-id=vm".to_owned()];
        flags.extend(self.extra.iter().cloned());
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let process = common::spawn_node_server(&self.socket, &self.state, &flags);
        let socket = self.socket.clone();
        let up =
            common::wait_until_blocking(Duration::from_secs(60), || common::is_socket(&socket));
        assert!(up, "node-server did not listen:\n{}", process.stderr());
        self.process = Some(process);
    }

    /// What node-server has logged so far.
    pub fn logs(&self) -> String {
        self.process
            .as_ref()
            .map(KillOnDrop::stderr)
            .unwrap_or_default()
    }

    pub async fn client(&self) -> Csi {
        csi_node::connect(&self.socket).await
    }

    /// A volume's data directory.
    pub fn volume_dir(&self, id: &str) -> PathBuf {
        self.state.join("volumes").join(id)
    }

    /// The project ID a volume's record holds.
    pub fn recorded_project(&self, id: &str) -> Option<u32> {
        let path = self.state.join("meta").join(format!("{id}.json"));
        let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let record: serde_json::Value = serde_json::from_slice(&text).expect("record JSON");
        record["project_id"].as_u64().map(|id| id as u32)
    }

    /// A pod's paths for a volume: the kubelet's staging path and the pod's target.
    pub fn pod(&self, name: &str) -> Pod {
        let dir = self.scratch.path().join(name);
        std::fs::create_dir_all(dir.join("pod")).expect("pod dir");
        Pod {
            staging: dir.join("globalmount"),
            target: dir.join("pod/mount"),
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        // Mounts first: the scratch directory must not be deleted through one.
        if let Ok(table) = csi_nodekit::linux::mountinfo::MountTable::read() {
            let mut points: Vec<PathBuf> = table
                .mounts_under(self.scratch.path())
                .map(|e| e.mount_point.clone())
                .collect();
            points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
            for point in points {
                let _ = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH);
            }
        }
        self.stop();
    }
}

pub struct Pod {
    pub staging: PathBuf,
    pub target: PathBuf,
}

/// A runtime for one case's calls (the server is another process, so one thread serves).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// CreateVolume of `bytes`, staged and published in `pod`; the volume's ID.
pub async fn create_and_publish(csi: &mut Csi, name: &str, bytes: u64, pod: &Pod) -> String {
    let id = csi_node::create(csi, name, bytes as i64).await;
    csi.stage_and_publish(&id, &pod.staging, &pod.target, false)
        .await;
    id
}

/// Unpublishes, unstages and deletes a volume.
pub async fn remove(csi: &mut Csi, id: &str, pod: &Pod) {
    csi.unpublish_and_unstage(id, &pod.target, &pod.staging)
        .await;
    csi.controller
        .delete_volume(csi_node::delete_request(id))
        .await
        .expect("delete volume");
}

/// NodeGetVolumeStats at `path`: (bytes, inodes, condition message).
pub async fn stats(csi: &mut Csi, id: &str, path: &Path) -> (VolumeUsage, VolumeUsage, String) {
    let reply = csi
        .node
        .node_get_volume_stats(csi_node::stats_request(id, &path.display().to_string()))
        .await
        .expect("stats")
        .into_inner();
    let find = |unit: volume_usage::Unit| {
        reply
            .usage
            .iter()
            .find(|u| u.unit == unit as i32)
            .cloned()
            .unwrap_or_else(|| panic!("no {unit:?} in {:?}", reply.usage))
    };
    let condition = reply.volume_condition.expect("condition");
    assert!(!condition.abnormal, "{condition:?}");
    (
        find(volume_usage::Unit::Bytes),
        find(volume_usage::Unit::Inodes),
        condition.message,
    )
}

/// ControllerExpandVolume and then NodeExpandVolume to `bytes`, as the external-resizer and
/// the kubelet would; both answer the new size.
pub async fn expand(csi: &mut Csi, id: &str, bytes: u64, volume_path: &Path) {
    let range = Some(CapacityRange {
        required_bytes: bytes as i64,
        limit_bytes: 0,
    });
    let controller = csi
        .controller
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: id.into(),
            capacity_range: range,
            ..Default::default()
        })
        .await
        .expect("controller expand")
        .into_inner();
    assert_eq!(controller.capacity_bytes, bytes as i64);
    let node = csi
        .node
        .node_expand_volume(NodeExpandVolumeRequest {
            volume_id: id.into(),
            volume_path: volume_path.display().to_string(),
            capacity_range: range,
            ..Default::default()
        })
        .await
        .expect("node expand")
        .into_inner();
    assert_eq!(node.capacity_bytes, bytes as i64);
}
