//! csi-sanity's test context (`TestContext`) and resource tracking (`Resources`): the
//! directories it creates before every spec and removes after, its sizes and names, the
//! volumes and snapshots each spec made (cleaned up newest first after it), and the helpers
//! its specs share (`MustCreateVolume`, `MustCreateSnapshot`, `verifySnapshotInfo`, …).

use std::path::{Path, PathBuf};

use csi_nodekit::proto::csi::volume_capability::access_mode::Mode;
use csi_nodekit::proto::csi::*;
use tonic::{Code, Status};

use super::common;
use common::csi_node::*;

/// csi-sanity's default `--csi.testvolumesize`.
pub const TEST_VOLUME_SIZE: i64 = 10 << 30;
/// What csi-sanity adds to the test size for expansion (`DefTestExpandIncrement`).
pub const EXPAND_INCREMENT: i64 = 1 << 30;
/// csi-sanity's `MaxNameLength` for volume (and snapshot) names.
pub const MAX_NAME_LENGTH: usize = 128;
/// csi-sanity's default `IdempotentCount`: how often "should be idempotent" repeats each call.
pub const IDEMPOTENT_COUNT: usize = 10;
/// csi-sanity's `GenerateInvalidVolumeID`.
pub const INVALID_VOLUME_ID: &str = "fake-vol-id";
/// What our `--csi.testvolumemutableparameters` file holds (`rootMode: "0770"`): a mutable
/// parameter every node can apply, with or without project quotas.
pub const MUTABLE_PARAMETERS: [(&str, &str); 1] = [("rootMode", "0770")];
/// The parameter csi-sanity's unsupported-parameter specs send.
pub const FAKE_MUTABLE_PARAMETER: (&str, &str) = ("XXX_FakeKey", "XXX_FakeValue");

/// Sixteen random hex digits (std's randomly keyed hasher).
pub fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let hasher = std::collections::hash_map::RandomState::new().build_hasher();
    format!("{:016X}", hasher.finish())
}

/// csi-sanity's `GenerateUniqueValidVolumeID`: well-formed, and no volume of ours.
pub fn unknown_volume_id() -> String {
    format!("fake-vol-id-{}", &random_hex()[..10])
}

/// What a spec created, for cleanup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    Volume(String),
    Snapshot(String),
}

/// csi-sanity's test context (`TestContext`) with its resource tracking (`Resources`).
pub struct Sanity {
    pub csi: Csi,
    /// `--csi.mountdir`: the *parent* of the target path.
    pub mount_dir: PathBuf,
    /// `--csi.stagingdir`: the staging path itself.
    pub staging: PathBuf,
    /// `--csi.testvolumesize`.
    pub size: i64,
    /// `--csi.testvolumeaccesstype=block`: every capability csi-sanity builds with
    /// `TestVolumeCapabilityWithAccessType` is a block one.
    pub block: bool,
    /// `--csi.testvolumemutableparameters` (`TestVolumeMutableParameters`).
    pub mutable_parameters: std::collections::HashMap<String, String>,
    /// `--csi.testvolumeparameters` (`TestVolumeParameters`): sent with every CreateVolume.
    pub parameters: std::collections::HashMap<String, String>,
    /// `--csi.testvolumeexpandsize` (`TestVolumeExpandSize`); unset, the test size plus 1 GiB.
    pub expand_to: Option<i64>,
    /// What to clean up after the spec, newest last; created twice is listed twice.
    resources: Vec<Resource>,
    /// `UniqueString`'s suffix, one per run.
    suffix: String,
}

impl Sanity {
    pub fn new(sandbox: &MountSandbox, csi: Csi, size: i64) -> Self {
        Self {
            csi,
            mount_dir: sandbox.path().join("csi-mount"),
            staging: sandbox.path().join("csi-staging"),
            size,
            block: false,
            mutable_parameters: (MUTABLE_PARAMETERS.iter())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            parameters: Default::default(),
            expand_to: None,
            resources: Vec::new(),
            suffix: format!("-{}", random_hex()),
        }
    }

    /// Before every spec: both directories, created by csi-sanity, never by the plugin.
    pub fn setup(&self) {
        for dir in [&self.mount_dir, &self.staging] {
            std::fs::create_dir(dir).unwrap_or_else(|e| {
                panic!(
                    "setup: mkdir {}: {e} (left by the last spec)",
                    dir.display()
                )
            });
        }
    }

    /// After every spec: delete what it created, newest first (a volume is unpublished and
    /// unstaged first, NOT_FOUND tolerated; any other error fails), then remove the
    /// directories, which fails if anything is left in or on them.
    pub async fn teardown(&mut self) {
        while let Some(resource) = self.resources.pop() {
            match resource {
                Resource::Volume(id) => self.clean_up_volume(&id).await,
                Resource::Snapshot(id) => {
                    let deleted = self.csi.controller.delete_snapshot(delete_snapshot(&id));
                    let deleted = deleted.await;
                    deleted.unwrap_or_else(|e| panic!("cleanup: DeleteSnapshot {id}: {e}"));
                }
            }
        }
        for dir in [&self.mount_dir, &self.staging] {
            std::fs::remove_dir(dir)
                .unwrap_or_else(|e| panic!("teardown: rmdir {}: {e}", dir.display()));
        }
    }

    async fn clean_up_volume(&mut self, id: &str) {
        let unpublish = unpublish_request(id, &self.target());
        tolerate_not_found(id, self.csi.node.node_unpublish_volume(unpublish).await);
        let unstage = unstage_request(id, &self.staging);
        tolerate_not_found(id, self.csi.node.node_unstage_volume(unstage).await);
        let deleted = self.csi.controller.delete_volume(delete_request(id)).await;
        deleted.unwrap_or_else(|e| panic!("cleanup: DeleteVolume {id}: {e}"));
    }

    /// The same in `--csi.testvolumeaccesstype=block` mode, with `parameters` as the
    /// mutable-parameters file.
    pub fn in_block_mode(mut self, parameters: &[(&str, &str)]) -> Self {
        self.block = true;
        self.mutable_parameters = (parameters.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self
    }

    /// The same with a `--csi.testvolumeparameters` file holding `layout: image`, and
    /// `--csi.testvolumeexpandsize` twice the test size (a thick image is allocated whole).
    pub fn in_image_layout(mut self) -> Self {
        self.parameters = [("layout".to_owned(), "image".to_owned())].into();
        self.expand_to = Some(2 * self.size);
        self
    }

    /// Whether every volume is an image volume (`layout: image`).
    pub fn image(&self) -> bool {
        self.parameters.get("layout").is_some_and(|l| l == "image")
    }

    /// `TestVolumeCapabilityWithAccessType`: `mode`, mount or block as configured.
    pub fn cap(&self, mode: Mode) -> VolumeCapability {
        match self.block {
            false => capability(mode, &[]),
            true => VolumeCapability {
                access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
                access_type: Some(volume_capability::AccessType::Block(
                    volume_capability::BlockVolume {},
                )),
            },
        }
    }

    /// A single-node-writer capability of the configured access type.
    pub fn rwo(&self) -> VolumeCapability {
        self.cap(Mode::SingleNodeWriter)
    }

    /// A request's capabilities replaced by one of the configured access type, and the
    /// test volume parameters added, as csi-sanity builds every CreateVolume it means to pass.
    pub fn with_access(&self, request: CreateVolumeRequest) -> CreateVolumeRequest {
        let mut parameters = request.parameters;
        parameters.extend(self.parameters.clone());
        CreateVolumeRequest {
            volume_capabilities: vec![self.rwo()],
            parameters,
            ..request
        }
    }

    pub fn target(&self) -> PathBuf {
        self.mount_dir.join("target")
    }

    pub fn unique(&self, prefix: &str) -> String {
        format!("{prefix}{}", self.suffix)
    }

    /// `UniqueStringWithLength`: the unique string padded with `a` to `len` bytes.
    pub fn unique_with_length(&self, prefix: &str, len: usize) -> String {
        let mut name = self.unique(prefix);
        assert!(name.len() <= len, "{prefix:?} is too long");
        name.extend(std::iter::repeat_n('a', len - name.len()));
        name
    }

    pub fn expand_size(&self) -> i64 {
        self.expand_to.unwrap_or(self.size + EXPAND_INCREMENT)
    }

    /// `MakeCreateVolumeReq`: one single-node-writer mount capability, the test size as both
    /// bounds.
    pub fn create_request(&self, name: &str) -> CreateVolumeRequest {
        self.with_access(CreateVolumeRequest {
            capacity_range: Some(CapacityRange {
                required_bytes: self.size,
                limit_bytes: self.size,
            }),
            ..create_request(name, 0)
        })
    }

    /// `MakeModifyVolumeReq`: the configured mutable parameters.
    pub fn modify_request(&self, id: &str) -> ControllerModifyVolumeRequest {
        ControllerModifyVolumeRequest {
            volume_id: id.into(),
            mutable_parameters: self.mutable_parameters.clone(),
            ..Default::default()
        }
    }

    /// CreateVolume, registering what it creates for cleanup.
    pub async fn create_volume(
        &mut self,
        req: CreateVolumeRequest,
    ) -> Result<tonic::Response<CreateVolumeResponse>, Status> {
        let reply = self.csi.controller.create_volume(req).await?;
        let id = reply.get_ref().volume.as_ref().map(|v| v.volume_id.clone());
        let id = id.filter(|id| !id.is_empty());
        self.resources.extend(id.map(Resource::Volume));
        Ok(reply)
    }

    /// `MustCreateVolume`: a volume with an ID, or the spec fails.
    pub async fn must_create(&mut self, req: CreateVolumeRequest) -> Volume {
        let volume = self.create_volume(req).await.expect("volume create failed");
        let volume = volume.into_inner().volume.expect("volume in response");
        assert!(!volume.volume_id.is_empty(), "volume ID in response");
        volume
    }

    /// DeleteVolume, which unregisters the volume once it succeeded.
    pub async fn delete_volume(&mut self, id: &str) {
        let deleted = self.csi.controller.delete_volume(delete_request(id)).await;
        deleted.unwrap_or_else(|e| panic!("DeleteVolume {id}: {e}"));
        self.unregister(&Resource::Volume(id.to_owned()));
    }

    fn unregister(&mut self, resource: &Resource) {
        if let Some(at) = self.resources.iter().position(|r| r == resource) {
            self.resources.remove(at);
        }
    }

    /// CreateSnapshot, registering what it creates for cleanup.
    pub async fn create_snapshot(
        &mut self,
        req: CreateSnapshotRequest,
    ) -> Result<tonic::Response<CreateSnapshotResponse>, Status> {
        let reply = self.csi.controller.create_snapshot(req).await?;
        let id = reply
            .get_ref()
            .snapshot
            .as_ref()
            .map(|s| s.snapshot_id.clone());
        let id = id.filter(|id| !id.is_empty());
        self.resources.extend(id.map(Resource::Snapshot));
        Ok(reply)
    }

    /// `MustCreateSnapshot`: a snapshot that passes `verifySnapshotInfo`, or the spec fails.
    pub async fn must_create_snapshot(&mut self, name: &str, source: &str) -> Snapshot {
        let reply = self.create_snapshot(snapshot_request(name, source)).await;
        let snapshot = reply.expect("snapshot create failed").into_inner().snapshot;
        let snapshot = snapshot.expect("snapshot in response");
        verify_snapshot_info(&snapshot);
        snapshot
    }

    /// `MustCreateSnapshotFromVolumeRequest`: a volume of the test size, then its snapshot.
    pub async fn must_create_snapshot_of_new_volume(
        &mut self,
        volume_name: &str,
        snapshot_name: &str,
    ) -> (Volume, Snapshot) {
        let volume = self.must_create(self.create_request(volume_name)).await;
        let snapshot = self
            .must_create_snapshot(snapshot_name, &volume.volume_id)
            .await;
        (volume, snapshot)
    }

    /// DeleteSnapshot, which unregisters the snapshot once it succeeded.
    pub async fn delete_snapshot(&mut self, id: &str) {
        let deleted = self
            .csi
            .controller
            .delete_snapshot(delete_snapshot(id))
            .await;
        deleted.unwrap_or_else(|e| panic!("DeleteSnapshot {id}: {e}"));
        self.unregister(&Resource::Snapshot(id.to_owned()));
    }

    pub async fn list_snapshots(&mut self, request: ListSnapshotsRequest) -> Vec<Snapshot> {
        let reply = self.csi.controller.list_snapshots(request).await;
        let entries = reply.expect("ListSnapshots").into_inner().entries;
        entries
            .into_iter()
            .map(|e| e.snapshot.expect("an entry's snapshot"))
            .collect()
    }

    pub async fn list_ids(
        &mut self,
        max_entries: i32,
        starting_token: &str,
    ) -> (Vec<String>, String) {
        let request = ListVolumesRequest {
            max_entries,
            starting_token: starting_token.into(),
        };
        let page = self.csi.controller.list_volumes(request).await;
        let page = page.expect("ListVolumes").into_inner();
        let ids = page.entries.into_iter().map(|e| {
            let volume = e.volume.expect("every entry carries a volume");
            assert!(!volume.volume_id.is_empty(), "every volume has an ID");
            volume.volume_id
        });
        (ids.collect(), page.next_token)
    }

    pub async fn node_info(&mut self) -> NodeGetInfoResponse {
        let info = self.csi.node.node_get_info(NodeGetInfoRequest {}).await;
        let info = info.expect("NodeGetInfo").into_inner();
        assert!(!info.node_id.is_empty(), "a node ID");
        info
    }

    pub async fn stage(&mut self, id: &str, cap: VolumeCapability) {
        let request = NodeStageVolumeRequest {
            volume_capability: Some(cap),
            ..stage_request(id, &self.staging)
        };
        let staged = self.csi.node.node_stage_volume(request).await;
        staged.unwrap_or_else(|e| panic!("NodeStageVolume {id}: {e}"));
    }

    pub fn publish_request(
        &self,
        id: &str,
        target: &Path,
        cap: VolumeCapability,
    ) -> NodePublishVolumeRequest {
        NodePublishVolumeRequest {
            volume_capability: Some(cap),
            ..publish_request(id, &self.staging, target, false)
        }
    }

    pub async fn publish(&mut self, id: &str, cap: VolumeCapability) {
        let request = self.publish_request(id, &self.target(), cap);
        let published = self.csi.node.node_publish_volume(request).await;
        published.unwrap_or_else(|e| panic!("NodePublishVolume {id}: {e}"));
    }

    /// A fresh single-node-writer volume of the test size, staged and published.
    pub async fn published_volume(&mut self, name: &str) -> String {
        let id = self
            .must_create(self.create_request(&self.unique(name)))
            .await
            .volume_id;
        self.stage(&id, self.rwo()).await;
        self.publish(&id, self.rwo()).await;
        id
    }
}

/// How many mounts are stacked at `path`.
pub fn mounts_at(path: &Path) -> usize {
    let table = csi_nodekit::linux::mountinfo::MountTable::read().expect("mount table");
    table
        .entries()
        .iter()
        .filter(|e| e.mount_point == path)
        .count()
}

/// Cleanup ignores NOT_FOUND and nothing else.
fn tolerate_not_found<T>(id: &str, result: Result<tonic::Response<T>, Status>) {
    if let Err(status) = result
        && status.code() != Code::NotFound
    {
        panic!("cleanup of {id}: {status}");
    }
}

/// csi-sanity's pattern for plugin names, stricter than the spec's (letters at both ends):
/// `^[a-zA-Z][A-Za-z0-9-\.\_]{0,61}[a-zA-Z]$`.
pub fn sanity_accepts_name(name: &str) -> bool {
    let b = name.as_bytes();
    let inner = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_');
    (2..=63).contains(&b.len())
        && b[0].is_ascii_alphabetic()
        && b[b.len() - 1].is_ascii_alphabetic()
        && b[1..b.len() - 1].iter().all(inner)
}

/// `MakeCreateSnapshotReq`: no parameters, no secrets (csi-sanity's defaults).
pub fn snapshot_request(name: &str, source: &str) -> CreateSnapshotRequest {
    CreateSnapshotRequest {
        name: name.into(),
        source_volume_id: source.into(),
        ..Default::default()
    }
}

/// `MakeDeleteSnapshotReq`.
pub fn delete_snapshot(id: &str) -> DeleteSnapshotRequest {
    DeleteSnapshotRequest {
        snapshot_id: id.into(),
        ..Default::default()
    }
}

/// `verifySnapshotInfo`: an ID, a source, a creation time.
pub fn verify_snapshot_info(snapshot: &Snapshot) {
    assert!(!snapshot.snapshot_id.is_empty(), "{snapshot:?}");
    assert!(!snapshot.source_volume_id.is_empty(), "{snapshot:?}");
    let time = snapshot.creation_time.as_ref().expect("a creation time");
    assert!(time.seconds != 0 || time.nanos != 0, "{snapshot:?}");
}
