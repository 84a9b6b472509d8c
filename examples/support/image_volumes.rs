//! Image volumes (`layout: image`) made, staged and removed for a benchmark, through gRPC.

use std::path::{Path, PathBuf};

use csi_nodekit::proto::csi::controller_client::ControllerClient;
use csi_nodekit::proto::csi::node_client::NodeClient;
use csi_nodekit::proto::csi::volume_capability::access_mode::Mode;
use csi_nodekit::proto::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_nodekit::proto::csi::*;

pub fn capability() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

/// Image volumes made, staged and removed for the benchmark.
pub struct Volumes {
    pub controller: ControllerClient<tonic::transport::Channel>,
    pub node: NodeClient<tonic::transport::Channel>,
    pub dir: PathBuf,
}

/// CreateVolume of a mount volume of `bytes` with `parameters`.
pub fn create_request(name: &str, bytes: u64, parameters: &[(&str, &str)]) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability()],
        parameters: (parameters.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

impl Volumes {
    /// An image volume of `bytes` with `directIO` as given, staged: its ID and staging path.
    pub async fn staged(&mut self, name: &str, bytes: u64, direct_io: &str) -> (String, PathBuf) {
        let parameters = [("layout", "image"), ("directIO", direct_io)];
        let create = create_request(name, bytes, &parameters);
        let created = self.controller.create_volume(create).await.expect("create");
        let id = created.into_inner().volume.expect("volume").volume_id;
        let staging = self.dir.join(format!("staging-{name}"));
        std::fs::create_dir(&staging).expect("staging path");
        let stage = NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(capability()),
            ..Default::default()
        };
        self.node.node_stage_volume(stage).await.expect("stage");
        (id, staging)
    }

    pub async fn remove(&mut self, id: &str, staging: &Path) {
        std::fs::remove_file(staging.join("file")).expect("remove");
        let unstage = NodeUnstageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
        };
        self.node
            .node_unstage_volume(unstage)
            .await
            .expect("unstage");
        std::fs::remove_dir(staging).expect("remove the staging path");
        let delete = DeleteVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        };
        self.controller.delete_volume(delete).await.expect("delete");
    }
}
