//! The SnapshotMetadata service against the real plugin: block volumes written at random
//! through their loop devices, snapshotted twice, and the allocated and changed-block maps
//! checked against a reference computed by reading both snapshots byte by byte; then a backup
//! client that copies only the delta, read from a restore of the second snapshot, rebuilds that
//! snapshot bit for bit. On XFS and btrfs (extents shared by reflink: only what changed is
//! read) and ext4 (no reflinks: both snapshots compared by content), as extents and as fixed
//! blocks; and every error code the spec names.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::common::csi_block::*;
use crate::common::csi_node::*;
use crate::common::csi_snapshots::*;
use crate::common::scratch_fs::{Kind, run};
use csi_nodekit::node_server::block_maps::Shape;
use csi_nodekit::node_server::config::Config;
use csi_nodekit::proto::csi::*;
use tonic::Code;

const VOLUME: u64 = 64 * MIB;
const GRANULE: u64 = 4096;

/// A small deterministic generator (xorshift64*): the same writes on every run.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| (self.next() >> 32) as u8 | 1).collect()
    }
}

/// `rounds` writes of 1 byte to 256 KiB at random offsets through the device.
fn scribble(device: &Path, random: &mut Random, rounds: usize) {
    let dev = std::fs::OpenOptions::new()
        .write(true)
        .open(device)
        .unwrap();
    for _ in 0..rounds {
        let len = 1 + random.below(256 << 10) as usize;
        let at = random.below(VOLUME - len as u64);
        dev.write_all_at(&random.bytes(len), at).unwrap();
    }
    dev.sync_all().unwrap();
}

/// Each 4 KiB granule of the two files (the second may be absent: zeros) that differs.
fn reference(a: &Path, b: Option<&Path>) -> Vec<u64> {
    let a = std::fs::read(a).unwrap();
    let b = b.map_or_else(|| vec![0; a.len()], |b| std::fs::read(b).unwrap());
    (a.chunks(GRANULE as usize).zip(b.chunks(GRANULE as usize)))
        .enumerate()
        .filter(|(_, (x, y))| x != y)
        .map(|(i, _)| i as u64 * GRANULE)
        .collect()
}

/// The granules a map's entries cover.
fn granules(entries: &[(u64, u64)]) -> Vec<u64> {
    let mut all: Vec<u64> = (entries.iter())
        .flat_map(|&(offset, size)| offset / GRANULE..(offset + size).div_ceil(GRANULE))
        .map(|g| g * GRANULE)
        .collect();
    all.dedup();
    all
}

/// One streamed map: its entries, the type and capacity every message carried, and how many
/// messages there were.
#[derive(Debug)]
struct Map {
    entries: Vec<(u64, u64)>,
    kind: i32,
    capacity: i64,
    messages: usize,
}

impl Map {
    fn add(&mut self, kind: i32, capacity: i64, entries: Vec<BlockMetadata>, max: usize) {
        assert!(
            entries.len() <= max,
            "a message of {} over max_results {max}",
            entries.len()
        );
        assert!(!entries.is_empty(), "an empty message");
        if self.messages > 0 {
            assert_eq!(
                (kind, capacity),
                (self.kind, self.capacity),
                "changed mid-stream"
            );
        }
        (self.kind, self.capacity) = (kind, capacity);
        self.messages += 1;
        for e in entries {
            let entry = (e.byte_offset as u64, e.size_bytes as u64);
            if let Some(&(offset, size)) = self.entries.last() {
                assert!(entry.0 >= offset + size, "ascending, no overlap: {entry:?}");
            }
            self.entries.push(entry);
        }
    }

    fn empty() -> Self {
        Self {
            entries: Vec::new(),
            kind: 0,
            capacity: 0,
            messages: 0,
        }
    }
}

async fn allocated(csi: &mut Csi, id: &str, start: i64, max: i32) -> Result<Map, tonic::Status> {
    let request = GetMetadataAllocatedRequest {
        snapshot_id: id.into(),
        starting_offset: start,
        max_results: max,
        ..Default::default()
    };
    let mut stream = csi
        .metadata
        .get_metadata_allocated(request)
        .await?
        .into_inner();
    let mut map = Map::empty();
    while let Some(message) = stream.message().await? {
        let (kind, capacity) = (message.block_metadata_type, message.volume_capacity_bytes);
        map.add(kind, capacity, message.block_metadata, max as usize);
    }
    Ok(map)
}

async fn delta(
    csi: &mut Csi,
    base: &str,
    target: &str,
    start: i64,
    max: i32,
) -> Result<Map, tonic::Status> {
    let request = GetMetadataDeltaRequest {
        base_snapshot_id: base.into(),
        target_snapshot_id: target.into(),
        starting_offset: start,
        max_results: max,
        ..Default::default()
    };
    let mut stream = csi.metadata.get_metadata_delta(request).await?.into_inner();
    let mut map = Map::empty();
    while let Some(message) = stream.message().await? {
        let (kind, capacity) = (message.block_metadata_type, message.volume_capacity_bytes);
        map.add(kind, capacity, message.block_metadata, max as usize);
    }
    Ok(map)
}

fn snapshot_file(state: &Path, id: &str) -> PathBuf {
    state.join("snapshots").join(id).join("volume.img")
}

/// The node, served with `shape`, on `kind`.
async fn start_node(kind: Kind, shape: Shape) -> (BlockNode, CsiServer, Csi) {
    let node = BlockNode::new(kind);
    let config = Config {
        block_metadata: shape,
        advertise_snapshot_metadata: true,
        ..Config::new(DRIVER, NODE, &node.state)
    };
    let server = start(&node.sandbox, config).await;
    let csi = server.client().await;
    (node, server, csi)
}

/// Every granule the reference names is in the map; in extents, nothing else is (a range is
/// reported only where bytes differ or data meets a hole, and the writes are never zeros); in
/// fixed blocks, each block holds at least one such granule.
fn check_against(map: &Map, reference: &[u64], shape: Shape, what: &str) {
    let covered = granules(&map.entries);
    let missing: Vec<&u64> = (reference.iter())
        .filter(|g| covered.binary_search(g).is_err())
        .collect();
    assert!(
        missing.is_empty(),
        "{what}: {} granules missing, first {:?}",
        missing.len(),
        missing.first()
    );
    match shape {
        Shape::Extents => {
            assert_eq!(map.kind, BlockMetadataType::VariableLength as i32);
            assert_eq!(covered, reference, "{what}: exactly the differing granules");
        }
        Shape::Blocks(size) => {
            assert_eq!(map.kind, BlockMetadataType::FixedLength as i32);
            for &(offset, length) in &map.entries {
                assert_eq!((offset % size, length), (0, size), "{what}: aligned blocks");
                let holds = reference
                    .iter()
                    .any(|g| (offset..offset + size).contains(g));
                assert!(holds, "{what}: block {offset} holds nothing that differs");
            }
        }
    }
}

/// The whole check on one filesystem in one shape.
async fn maps_match_the_reference_and_rebuild_the_second_snapshot(kind: Kind, shape: Shape) {
    let (node, _server, mut csi) = start_node(kind, shape).await;
    let (state, sandbox) = (node.state.clone(), &node.sandbox);
    let id = csi.create_block("pvc-maps", VOLUME).await.volume_id;
    let (staging, device) = (sandbox.dir("staging"), sandbox.dir("pods").join("dev"));
    csi.attach_block(&id, &staging, &device, false).await;
    let mut random = Random(0x9e37_79b9_7f4a_7c15 ^ kind as u64);
    scribble(&device, &mut random, 40);
    let first = csi.snapshot("first", &id).await.snapshot_id;
    scribble(&device, &mut random, 12);
    // Rewritten with the same bytes: new blocks on XFS and btrfs, the same content.
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&device)
        .unwrap();
    let same = read_at(&device, 8 * MIB, 64 << 10);
    dev.write_all_at(&same, 8 * MIB).unwrap();
    drop(dev);
    // Discarded: a hole in the volume's file where the first snapshot has data.
    run(
        "blkdiscard",
        &[
            "-o",
            &(40 * MIB).to_string(),
            "-l",
            &MIB.to_string(),
            device.to_str().unwrap(),
        ],
    );
    let second = csi.snapshot("second", &id).await.snapshot_id;
    csi.detach_block(&id, &staging, &device).await;
    let (first_file, second_file) = (
        snapshot_file(&state, &first),
        snapshot_file(&state, &second),
    );

    let full = allocated(&mut csi, &first, 0, 7).await.unwrap();
    assert_eq!(full.capacity, VOLUME as i64);
    assert!(full.messages > 1, "paged by max_results");
    let nonzero = reference(&first_file, None);
    let covered = granules(&full.entries);
    assert!(
        nonzero.iter().all(|g| covered.binary_search(g).is_ok()),
        "{kind:?}: every granule holding data is allocated"
    );
    let allocated_bytes: u64 = full.entries.iter().map(|e| e.1).sum();
    assert!(
        allocated_bytes < VOLUME / 2,
        "{kind:?}: {allocated_bytes} bytes allocated of a sparse volume"
    );

    let changed = delta(&mut csi, &first, &second, 0, 100).await.unwrap();
    let differing = reference(&first_file, Some(&second_file));
    assert!(!differing.is_empty());
    check_against(&changed, &differing, shape, &format!("{kind:?} delta"));
    // Resumed mid-volume: the same map from there on (rounded down to the shape's alignment).
    let resumed = delta(&mut csi, &first, &second, (32 * MIB + 123) as i64, 100)
        .await
        .unwrap();
    let after: Vec<u64> = differing
        .iter()
        .copied()
        .filter(|&g| g >= 32 * MIB)
        .collect();
    check_against(&resumed, &after, shape, &format!("{kind:?} resumed delta"));

    // A backup client: the first backup is the first snapshot's allocated ranges (read from a
    // restore of it); the incremental one copies the delta from a restore of the second.
    let mut backup = vec![0u8; VOLUME as usize];
    for (restore, map) in [(&first, &full), (&second, &changed)] {
        let volume = csi
            .create_from(CreateVolumeRequest {
                volume_capabilities: vec![block_cap()],
                ..from_snapshot(&format!("restore-{restore}"), 0, restore)
            })
            .await
            .volume_id;
        let (staging, device) = (
            sandbox.dir(&format!("s-{volume}")),
            sandbox.dir("pods").join(&volume),
        );
        csi.attach_block(&volume, &staging, &device, true).await;
        let dev = std::fs::File::open(&device).unwrap();
        for &(offset, size) in &map.entries {
            let size = size.min(VOLUME - offset) as usize;
            dev.read_exact_at(&mut backup[offset as usize..offset as usize + size], offset)
                .unwrap();
        }
        drop(dev);
        csi.detach_block(&volume, &staging, &device).await;
    }
    assert!(
        backup == std::fs::read(&second_file).unwrap(),
        "{kind:?}: the incremental backup rebuilds the second snapshot bit for bit"
    );
    let copied: u64 = changed.entries.iter().map(|e| e.1).sum();
    eprintln!("{kind:?} {shape:?}: delta {copied} bytes of {VOLUME}, allocated {allocated_bytes}");
}

#[ignore = "needs root: real loop devices, XFS and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_xfs_the_extent_maps_match_a_byte_by_byte_reference_and_the_delta_rebuilds_the_second_snapshot()
 {
    maps_match_the_reference_and_rebuild_the_second_snapshot(Kind::Xfs, Shape::Extents).await;
}

#[ignore = "needs root: real loop devices, btrfs and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_btrfs_the_extent_maps_match_a_byte_by_byte_reference_and_the_delta_rebuilds_the_second_snapshot()
 {
    maps_match_the_reference_and_rebuild_the_second_snapshot(Kind::Btrfs, Shape::Extents).await;
}

#[ignore = "needs root: real loop devices, ext4 and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_reflinks_on_ext4_the_delta_is_found_by_content_and_still_rebuilds_the_second_snapshot()
 {
    maps_match_the_reference_and_rebuild_the_second_snapshot(Kind::Ext4, Shape::Extents).await;
}

#[ignore = "needs root: real loop devices, XFS and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_length_blocks_cover_every_changed_granule_and_the_delta_rebuilds_the_second_snapshot()
 {
    maps_match_the_reference_and_rebuild_the_second_snapshot(Kind::Xfs, Shape::Blocks(64 << 10))
        .await;
}

#[ignore = "needs root: real loop devices, XFS and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metadata_calls_answer_the_codes_the_spec_names_and_hold_their_snapshots() {
    let (node, _server, mut csi) = start_node(Kind::Xfs, Shape::Extents).await;
    let caps = csi
        .identity
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await;
    let wanted = plugin_capability::service::Type::SnapshotMetadataService as i32;
    let advertised = (caps.unwrap().into_inner().capabilities.iter()).any(
        |c| matches!(&c.r#type, Some(plugin_capability::Type::Service(s)) if s.r#type == wanted),
    );
    assert!(
        advertised,
        "GetPluginCapabilities lists SNAPSHOT_METADATA_SERVICE"
    );
    let block = csi.create_block("pvc-a", VOLUME).await.volume_id;
    let other = csi.create_block("pvc-b", VOLUME).await.volume_id;
    let files = csi
        .controller
        .create_volume(create_request("pvc-fs", MIB as i64))
        .await;
    let files = files.unwrap().into_inner().volume.unwrap().volume_id;
    let a = csi.snapshot("a", &block).await.snapshot_id;
    let b = csi.snapshot("b", &other).await.snapshot_id;
    let fs = csi.snapshot("fs", &files).await.snapshot_id;
    let code = |r: Result<Map, tonic::Status>| r.map(|_| Code::Ok).unwrap_or_else(|s| s.code());

    assert_eq!(
        code(allocated(&mut csi, "", 0, 0).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(allocated(&mut csi, "snap-none", 0, 0).await),
        Code::NotFound
    );
    assert_eq!(
        code(allocated(&mut csi, &fs, 0, 0).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(allocated(&mut csi, &a, -1, 0).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(allocated(&mut csi, &a, 0, -1).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(allocated(&mut csi, &a, VOLUME as i64 + 1, 0).await),
        Code::OutOfRange
    );
    let at_end = allocated(&mut csi, &a, VOLUME as i64, 0).await.unwrap();
    assert_eq!(at_end.entries, [], "from the end: nothing, and no error");
    assert_eq!(
        code(delta(&mut csi, &a, "", 0, 0).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(delta(&mut csi, &a, "snap-none", 0, 0).await),
        Code::NotFound
    );
    assert_eq!(
        code(delta(&mut csi, &a, &b, 0, 0).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(delta(&mut csi, &a, &a, VOLUME as i64 + 1, 0).await),
        Code::OutOfRange
    );
    let itself = delta(&mut csi, &a, &a, 0, 0).await.unwrap();
    assert_eq!(itself.entries, [], "a snapshot does not differ from itself");

    // A stream nobody reads holds its snapshot: deleting it meanwhile is ABORTED (retried by
    // the CO); once the stream is gone, the delete goes through.
    let dev = std::fs::OpenOptions::new()
        .write(true)
        .open(image(&node.state, &block))
        .unwrap();
    for i in 0..4096u64 {
        dev.write_all_at(&[1], i * 2 * GRANULE).unwrap();
    }
    drop(dev);
    let c = csi.snapshot("c", &block).await.snapshot_id;
    let request = GetMetadataAllocatedRequest {
        snapshot_id: c.clone(),
        max_results: 1,
        ..Default::default()
    };
    let mut held = csi.metadata.clone();
    let stream = held
        .get_metadata_allocated(request)
        .await
        .unwrap()
        .into_inner();
    let deleted = csi
        .controller
        .delete_snapshot(delete_snapshot_request(&c))
        .await;
    assert_eq!(
        deleted.unwrap_err().code(),
        Code::Aborted,
        "held by the stream"
    );
    drop(stream);
    let mut gone = false;
    for _ in 0..100 {
        if csi
            .controller
            .delete_snapshot(delete_snapshot_request(&c))
            .await
            .is_ok()
        {
            gone = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(gone, "deleted once the stream was dropped");
}
