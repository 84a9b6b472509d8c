//! What the block-volume tests share: block capabilities and requests, a guard that detaches
//! every loop device of ours left on a state directory's volumes (even when a test fails), and
//! reading and writing through a published device node.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use csi_nodekit::linux::loopdev::{self, LoopDevice};
use csi_nodekit::node_server::Config;
use csi_nodekit::proto::csi::volume_capability::{AccessMode, AccessType, BlockVolume};
use csi_nodekit::proto::csi::*;

use super::csi_node::{
    Csi, CsiServer, DRIVER, MountSandbox, NODE, create_request, publish_request, stage_request,
    start,
};
use super::scratch_fs::{Kind, ScratchFs};

pub const MIB: u64 = 1 << 20;

pub fn block_cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

pub fn block_create(name: &str, bytes: u64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        volume_capabilities: vec![block_cap()],
        ..create_request(name, bytes as i64)
    }
}

pub fn block_stage(id: &str, staging: &Path) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_capability: Some(block_cap()),
        ..stage_request(id, staging)
    }
}

pub fn block_publish(
    id: &str,
    staging: &Path,
    target: &Path,
    ro: bool,
) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_capability: Some(block_cap()),
        ..publish_request(id, staging, target, ro)
    }
}

/// Detaches, on drop, every device of ours backed by a volume file under `<state>/volumes`.
/// Declare it after the filesystem the state lives on and before the mount sandbox, so that
/// targets are unmounted first and the filesystem goes last.
pub struct DetachOnDrop(pub PathBuf);

impl Drop for DetachOnDrop {
    fn drop(&mut self) {
        let Ok(dirs) = std::fs::read_dir(self.0.join("volumes")) else {
            return;
        };
        for dir in dirs.flatten() {
            let image = dir.path().join("volume.img");
            let Ok(found) = loopdev::find(&image) else {
                continue;
            };
            for status in found.ours {
                if let Err(e) = loopdev::detach(status.device, &image) {
                    eprintln!("cleanup: {e}");
                }
            }
        }
    }
}

/// Where a block test's plugin keeps its state: a scratch filesystem of its own, the guard
/// that detaches its loop devices, and a mount sandbox for staging paths and targets. The
/// fields drop in this order: targets unmounted first, then devices detached, the filesystem
/// last.
pub struct BlockNode {
    pub sandbox: MountSandbox,
    _devices: DetachOnDrop,
    pub state: PathBuf,
    pub fs: ScratchFs,
}

impl BlockNode {
    pub fn new(kind: Kind) -> Self {
        let fs = ScratchFs::new(kind);
        let state = fs.path().join("state");
        Self {
            sandbox: MountSandbox::new(),
            _devices: DetachOnDrop(state.clone()),
            state,
            fs,
        }
    }

    /// The plugin served in-process on this node's state (again, after a stop: a restart).
    pub async fn start(&self) -> CsiServer {
        start(&self.sandbox, Config::new(DRIVER, NODE, &self.state)).await
    }
}

/// What a block test begins with: a [`BlockNode`] on `kind`, its plugin served, and a client.
pub async fn start_block_node(kind: Kind) -> (BlockNode, CsiServer, Csi) {
    let node = BlockNode::new(kind);
    let server = node.start().await;
    let csi = server.client().await;
    (node, server, csi)
}

/// How many loop devices (anyone's) are attached to a file under `state`.
pub fn attached_under(state: &Path) -> usize {
    let blocks = std::fs::read_dir("/sys/block").unwrap().flatten();
    blocks
        .filter(|entry| {
            let backing = std::fs::read_to_string(entry.path().join("loop/backing_file"));
            backing.is_ok_and(|file| file.starts_with(&*state.to_string_lossy()))
        })
        .count()
}

/// A block volume's file.
pub fn image(state: &Path, id: &str) -> PathBuf {
    state.join("volumes").join(id).join("volume.img")
}

/// Our devices on a volume's file: (read-write, read-only).
pub fn devices(state: &Path, id: &str) -> (Vec<LoopDevice>, Vec<LoopDevice>) {
    let found = loopdev::find(&image(state, id)).expect("find devices");
    assert!(found.foreign.is_empty(), "{:?}", found.foreign);
    let (ro, rw): (Vec<_>, Vec<_>) = found.ours.iter().partition(|s| s.read_only);
    (
        rw.iter().map(|s| s.device).collect(),
        ro.iter().map(|s| s.device).collect(),
    )
}

/// The one read-write device of ours on volume `id`'s file, however often it was staged,
/// with direct I/O (the tests' state directories are on filesystems that allow it).
pub fn the_one_direct_io_device(state: &Path, id: &str) -> LoopDevice {
    let (rw, ro) = devices(state, id);
    assert_eq!(
        (rw.len(), ro.len()),
        (1, 0),
        "one device, however often staged"
    );
    let status = loopdev::status(rw[0]).unwrap().unwrap();
    assert!(status.direct_io, "direct I/O: {status:?}");
    rw[0]
}

/// Whether `device` is no longer bound to volume `id`'s image: unbound, or (the tests run in
/// parallel and the kernel hands a freed number to the next attach) bound to another file.
pub fn let_go(device: LoopDevice, state: &Path, id: &str) -> bool {
    let ours = loopdev::Identity::of(&image(state, id)).expect("the image's identity");
    loopdev::status(device)
        .expect("status of the device")
        .is_none_or(|status| status.backing != ours)
}

/// Writes through the device node at `path` and makes it durable.
pub fn write_at(path: &Path, at: u64, data: &[u8]) -> std::io::Result<()> {
    let dev = std::fs::OpenOptions::new().write(true).open(path)?;
    dev.write_all_at(data, at)?;
    dev.sync_all()
}

pub fn read_at(path: &Path, at: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    std::fs::File::open(path)
        .expect("open")
        .read_exact_at(&mut buf, at)
        .expect("read");
    buf
}

/// A recognisable block of data: `seed` in every byte, a position in every 512.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| if i % 512 == 0 { (i / 512) as u8 } else { seed })
        .collect()
}

impl Csi {
    pub async fn create_block(&mut self, name: &str, bytes: u64) -> Volume {
        let reply = self
            .controller
            .create_volume(block_create(name, bytes))
            .await;
        reply
            .expect("create block volume")
            .into_inner()
            .volume
            .unwrap()
    }

    /// Stages and publishes a block volume.
    pub async fn attach_block(&mut self, id: &str, staging: &Path, target: &Path, ro: bool) {
        let staged = self.node.node_stage_volume(block_stage(id, staging)).await;
        staged.expect("stage block volume");
        let published = self
            .node
            .node_publish_volume(block_publish(id, staging, target, ro));
        published.await.expect("publish block volume");
    }

    pub async fn detach_block(&mut self, id: &str, staging: &Path, target: &Path) {
        self.unpublish_and_unstage(id, target, staging).await;
    }
}
