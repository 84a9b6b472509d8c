//! Helpers for the snapshot tests: request builders, calls that must succeed, a server whose
//! state directory is where the test says (a scratch filesystem), and tree checksums.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hasher};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use csi_nodekit::node_server::Config;
use csi_nodekit::proto::csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
use csi_nodekit::proto::csi::*;

use super::csi_node::{Csi, CsiServer, DRIVER, MountSandbox, NODE, create_request, start};

pub fn snapshot_request(name: &str, source: &str) -> CreateSnapshotRequest {
    CreateSnapshotRequest {
        name: name.into(),
        source_volume_id: source.into(),
        ..Default::default()
    }
}

fn with_source(name: &str, bytes: i64, source: Type) -> CreateVolumeRequest {
    CreateVolumeRequest {
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(source),
        }),
        ..create_request(name, bytes)
    }
}

/// CreateVolume from a snapshot, `bytes` the required size (0: none).
pub fn from_snapshot(name: &str, bytes: i64, snapshot_id: &str) -> CreateVolumeRequest {
    let source = Type::Snapshot(SnapshotSource {
        snapshot_id: snapshot_id.into(),
    });
    with_source(name, bytes, source)
}

/// CreateVolume cloning a volume.
pub fn from_volume(name: &str, bytes: i64, volume_id: &str) -> CreateVolumeRequest {
    let source = Type::Volume(VolumeSource {
        volume_id: volume_id.into(),
    });
    with_source(name, bytes, source)
}

pub fn delete_snapshot_request(id: &str) -> DeleteSnapshotRequest {
    DeleteSnapshotRequest {
        snapshot_id: id.into(),
        ..Default::default()
    }
}

/// A server whose state directory is `state` (on a scratch filesystem, say).
pub async fn start_at(sandbox: &MountSandbox, state: &Path, capacity: Option<u64>) -> CsiServer {
    let config = Config {
        capacity,
        ..Config::new(DRIVER, NODE, state)
    };
    start(sandbox, config).await
}

impl Csi {
    /// CreateSnapshot, which must succeed.
    pub async fn snapshot(&mut self, name: &str, source: &str) -> Snapshot {
        let reply = self
            .controller
            .create_snapshot(snapshot_request(name, source));
        let reply = reply
            .await
            .unwrap_or_else(|e| panic!("snapshot {name}: {e}"));
        reply.into_inner().snapshot.expect("a snapshot")
    }

    /// CreateVolume with a content source, which must succeed.
    pub async fn create_from(&mut self, request: CreateVolumeRequest) -> Volume {
        let name = request.name.clone();
        let reply = self.controller.create_volume(request).await;
        let reply = reply.unwrap_or_else(|e| panic!("create {name}: {e}"));
        reply.into_inner().volume.expect("a volume")
    }

    /// Every snapshot, in one page.
    pub async fn snapshots(&mut self) -> Vec<Snapshot> {
        let reply = self
            .controller
            .list_snapshots(ListSnapshotsRequest::default());
        let entries = reply.await.expect("list snapshots").into_inner().entries;
        entries.into_iter().filter_map(|e| e.snapshot).collect()
    }

    pub async fn delete_snapshot(&mut self, id: &str) {
        let reply = self.controller.delete_snapshot(delete_snapshot_request(id));
        reply
            .await
            .unwrap_or_else(|e| panic!("delete snapshot {id}: {e}"));
    }
}

/// Every path under `root` with a checksum of what it is: a file's bytes, a link's target, or
/// the kind of anything else.
pub fn checksums(root: &Path) -> BTreeMap<PathBuf, u64> {
    let mut sums = BTreeMap::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let path = root.join(&rel);
        let meta = std::fs::symlink_metadata(&path).expect("stat");
        let mut hasher = DefaultHasher::new();
        if meta.is_dir() {
            hasher.write(b"dir");
            for entry in std::fs::read_dir(&path).expect("read dir") {
                todo.push(rel.join(entry.expect("entry").file_name()));
            }
        } else if meta.is_symlink() {
            hasher.write(
                std::fs::read_link(&path)
                    .expect("readlink")
                    .as_os_str()
                    .as_bytes(),
            );
        } else if meta.is_file() {
            hasher.write(&std::fs::read(&path).expect("read"));
        } else {
            hasher.write(b"special");
        }
        sums.insert(rel, hasher.finish());
    }
    sums
}
