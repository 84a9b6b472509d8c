//! Helpers for the node-server tests: a mount sandbox that cleans up its mounts, the plugin
//! served in-process on a temporary socket, CSI clients, and request builders.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use csi_nodekit::linux::mountinfo::MountTable;
use csi_nodekit::node_server::state::owner::Owner;
use csi_nodekit::node_server::state::state_dir::StateDir;
use csi_nodekit::node_server::{Config, Mounter, Plugin, Seams, serve};
use csi_nodekit::proto::csi::controller_client::ControllerClient;
use csi_nodekit::proto::csi::group_controller_client::GroupControllerClient;
use csi_nodekit::proto::csi::identity_client::IdentityClient;
use csi_nodekit::proto::csi::node_client::NodeClient;
use csi_nodekit::proto::csi::snapshot_metadata_client::SnapshotMetadataClient;
use csi_nodekit::proto::csi::volume_capability::access_mode::Mode;
use csi_nodekit::proto::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_nodekit::proto::csi::*;
use csi_nodekit::shutdown::{Shutdown, Trigger};
use tonic::transport::Channel;

pub const DRIVER: &str = "test.nodekit.io";
pub const NODE: &str = "node-a";

/// A temporary directory for node-server tests. Dropping it unmounts everything under it first
/// (deepest first), so a failed test neither leaks mounts nor deletes through one. Tests that
/// mount need root and say so (`#[ignore = "needs root: …"]`); the others run as anyone.
pub struct MountSandbox {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl MountSandbox {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("create sandbox");
        let path = dir.path().canonicalize().expect("resolve sandbox");
        Self {
            dir: Some(dir),
            path,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A directory inside the sandbox, created.
    pub fn dir(&self, name: &str) -> PathBuf {
        let dir = self.path.join(name);
        std::fs::create_dir_all(&dir).expect("create directory");
        dir
    }

    /// Mount points at or under the sandbox, deepest first.
    pub fn mounts(&self) -> Vec<PathBuf> {
        let table = MountTable::read().expect("read mount table");
        let mut points: Vec<PathBuf> = table
            .mounts_under(&self.path)
            .map(|e| e.mount_point.clone())
            .collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        points
    }
}

impl Drop for MountSandbox {
    fn drop(&mut self) {
        for point in self.mounts() {
            let _ = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH);
        }
        let Some(dir) = self.dir.take() else { return };
        if !self.mounts().is_empty() {
            // Never delete through a mount that refused to go: keep the directory.
            let _ = dir.keep();
        }
    }
}

/// The config tests use: state under `<sandbox>/state`.
pub fn config(sandbox: &MountSandbox) -> Config {
    Config::new(DRIVER, NODE, sandbox.path().join("state"))
}

/// The plugin served in-process on a socket in the sandbox.
pub struct CsiServer {
    pub socket: PathBuf,
    trigger: Trigger,
    task: tokio::task::JoinHandle<Result<(), csi_nodekit::BoxError>>,
}

pub async fn start(sandbox: &MountSandbox, config: Config) -> CsiServer {
    start_plugin(sandbox, open(config, Seams::linux())).await
}

pub async fn start_with(
    sandbox: &MountSandbox,
    config: Config,
    mounter: Arc<dyn Mounter>,
) -> CsiServer {
    let seams = Seams {
        mounter,
        ..Seams::linux()
    };
    start_plugin(sandbox, open(config, seams)).await
}

/// The plugin on `config`'s state directory, its lock taken now.
pub fn open(config: Config, seams: Seams) -> Plugin {
    let state_dir = StateDir::open(&config.state_dir).expect("open the state directory");
    let owner = Owner::try_take(&state_dir).expect("take the state directory");
    Plugin::open(config, owner, seams).expect("open plugin")
}

async fn start_plugin(sandbox: &MountSandbox, plugin: Plugin) -> CsiServer {
    let socket = sandbox.path().join(format!(
        "csi-{}.sock",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    let perms = csi_nodekit::socket::Permissions {
        mode: 0o600,
        gid: None,
    };
    let (listener, guard) = csi_nodekit::socket::bind_tokio(&socket, perms).expect("bind");
    let (trigger, shutdown) = Shutdown::manual();
    let task = tokio::spawn(async move {
        let _guard = guard;
        serve(listener, plugin, shutdown).await
    });
    CsiServer {
        socket,
        trigger,
        task,
    }
}

/// Clients of the five services over one connection.
#[derive(Clone)]
pub struct Csi {
    pub identity: IdentityClient<Channel>,
    pub node: NodeClient<Channel>,
    pub controller: ControllerClient<Channel>,
    pub group: GroupControllerClient<Channel>,
    pub metadata: SnapshotMetadataClient<Channel>,
}

/// Clients of the five services over one connection to `socket` (an in-process server's or
/// the real binary's).
pub async fn connect(socket: &Path) -> Csi {
    let channel = csi_nodekit::socket::connect(socket).await.expect("connect");
    Csi {
        identity: IdentityClient::new(channel.clone()),
        node: NodeClient::new(channel.clone()),
        controller: ControllerClient::new(channel.clone()),
        group: GroupControllerClient::new(channel.clone()),
        metadata: SnapshotMetadataClient::new(channel),
    }
}

impl CsiServer {
    pub async fn client(&self) -> Csi {
        connect(&self.socket).await
    }

    /// Stops serving and waits until the server has finished.
    pub async fn stop(self) {
        self.trigger.fire();
        self.task.await.expect("join").expect("serve");
    }
}

pub fn capability(mode: Mode, flags: &[&str]) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: String::new(),
            mount_flags: flags.iter().map(|s| s.to_string()).collect(),
            volume_mount_group: String::new(),
        })),
    }
}

pub fn rwo() -> VolumeCapability {
    capability(Mode::SingleNodeWriter, &[])
}

pub fn create_request(name: &str, bytes: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![rwo()],
        ..Default::default()
    }
}

pub fn stage_request(id: &str, staging: &Path) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(rwo()),
        ..Default::default()
    }
}

pub fn publish_request(
    id: &str,
    staging: &Path,
    target: &Path,
    readonly: bool,
) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(rwo()),
        readonly,
        ..Default::default()
    }
}

pub fn unpublish_request(id: &str, target: &Path) -> NodeUnpublishVolumeRequest {
    NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.display().to_string(),
    }
}

pub fn unstage_request(id: &str, staging: &Path) -> NodeUnstageVolumeRequest {
    NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
    }
}

/// Creates a volume and returns its ID.
pub async fn create(csi: &mut Csi, name: &str, bytes: i64) -> String {
    create_with(csi, create_request(name, bytes)).await
}

/// CreateVolume of `request`, which must succeed; the volume's ID.
pub async fn create_with(csi: &mut Csi, request: CreateVolumeRequest) -> String {
    csi.controller
        .create_volume(request)
        .await
        .expect("create volume")
        .into_inner()
        .volume
        .expect("volume")
        .volume_id
}

/// The gRPC code of a failed call (panics on success, naming what succeeded).
pub fn code<T: std::fmt::Debug>(result: Result<tonic::Response<T>, tonic::Status>) -> tonic::Code {
    match result {
        Ok(reply) => panic!("expected an error, got {:?}", reply.into_inner()),
        Err(status) => status.code(),
    }
}

/// Whether `path` is a mount point right now.
pub fn is_mounted(path: &Path) -> bool {
    MountTable::read()
        .expect("read mount table")
        .mounted_at(path)
        .is_some()
}

/// Whether the mount at `path` is read-only.
pub fn is_readonly(path: &Path) -> bool {
    MountTable::read()
        .expect("read mount table")
        .mounted_at(path)
        .is_some_and(|e| e.is_readonly())
}

/// A sandbox, and a server with 64 MiB of capacity serving it, and a client.
pub async fn setup() -> (MountSandbox, CsiServer, Csi) {
    let sandbox = MountSandbox::new();
    let config = Config {
        capacity: Some(64 << 20),
        ..config(&sandbox)
    };
    let server = start(&sandbox, config).await;
    let csi = server.client().await;
    (sandbox, server, csi)
}

pub fn delete_request(id: &str) -> DeleteVolumeRequest {
    DeleteVolumeRequest {
        volume_id: id.into(),
        ..Default::default()
    }
}

pub fn stats_request(id: &str, path: &str) -> NodeGetVolumeStatsRequest {
    NodeGetVolumeStatsRequest {
        volume_id: id.into(),
        volume_path: path.into(),
        staging_target_path: String::new(),
    }
}

impl Csi {
    /// Stages `id` at `staging` and publishes it at `target`, both with [`rwo`].
    pub async fn stage_and_publish(&mut self, id: &str, staging: &Path, target: &Path, ro: bool) {
        self.node
            .node_stage_volume(stage_request(id, staging))
            .await
            .expect("stage");
        self.node
            .node_publish_volume(publish_request(id, staging, target, ro))
            .await
            .expect("publish");
    }

    /// Unpublishes `id` from `target` and unstages it from `staging`.
    pub async fn unpublish_and_unstage(&mut self, id: &str, target: &Path, staging: &Path) {
        self.node
            .node_unpublish_volume(unpublish_request(id, target))
            .await
            .expect("unpublish");
        self.node
            .node_unstage_volume(unstage_request(id, staging))
            .await
            .expect("unstage");
    }

    /// Every volume ListVolumes returns, in one page.
    pub async fn list(&mut self) -> Vec<Volume> {
        let reply = self
            .controller
            .list_volumes(ListVolumesRequest::default())
            .await;
        let entries = reply.expect("list volumes").into_inner().entries;
        entries.into_iter().filter_map(|e| e.volume).collect()
    }
}
