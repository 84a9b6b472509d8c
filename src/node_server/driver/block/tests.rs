//! The block-volume logic against in-memory loop devices and a recording mounter: which devices
//! are attached, detached, refreshed and flushed, and when a call is refused. The files are
//! real (in a temporary state directory), the devices and mounts are not; what needs real
//! device nodes (a target's `st_rdev`) is tested on real loop devices in `tests/`.

use std::sync::Arc;

use super::*;
use crate::linux::loopdev::loop_seam::fake::RecordingLoops;
use crate::linux::loopdev::{LoopDevice, LoopError};
use crate::linux::mount::fake::RecordingMounter;
use crate::linux::quota;
use crate::node_server::Config;
use crate::node_server::driver::{Kind, Seams};
use crate::node_server::state::attributes::Attributes;
use crate::node_server::state::owner::Owner;
use crate::node_server::state::state_dir::StateDir;
use crate::node_server::state::volumes::Layout;

const BLOCK: Kind = Kind {
    block: true,
    layout: Layout::Directory,
};

struct Node {
    _dir: tempfile::TempDir,
    driver: Driver,
    loops: Arc<RecordingLoops>,
    mounter: Arc<RecordingMounter>,
}

fn new_node() -> Node {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new("test.csi.local", "node-1", dir.path().join("state"));
    config.quota = quota::Mode::Off;
    let loops = Arc::new(RecordingLoops::default());
    let mounter = Arc::new(RecordingMounter::with_root());
    let owner = Owner::try_take(&StateDir::open(&config.state_dir).unwrap()).unwrap();
    let seams = Seams {
        mounter: mounter.clone(),
        loops: loops.clone(),
    };
    let driver = Driver::open(config, owner, seams).unwrap();
    Node {
        _dir: dir,
        driver,
        loops,
        mounter,
    }
}

fn block_volume(node: &Node, attributes: Attributes) -> Record {
    (node.driver)
        .create("pvc-1", 1 << 20, 0, None, attributes, BLOCK)
        .unwrap()
}

fn devices(node: &Node) -> Vec<(u32, bool)> {
    let attached = node.loops.attached.lock().unwrap();
    attached.iter().map(|s| (s.device.0, s.read_only)).collect()
}

#[test]
fn staging_attaches_one_writable_device_and_staging_again_attaches_none() {
    let node = new_node();
    let record = block_volume(&node, Attributes::default());
    node.driver.stage_block(&record).unwrap();
    node.driver.stage_block(&record).unwrap();
    assert_eq!(devices(&node), [(0, false)]);
    let attaches = node
        .loops
        .calls()
        .iter()
        .filter(|c| c.starts_with("attach"))
        .count();
    assert_eq!(attaches, 1, "{:?}", node.loops.calls());
}

#[test]
fn a_device_is_attached_with_direct_io_unless_the_volume_says_otherwise() {
    let node = new_node();
    let record = block_volume(&node, Attributes::default());
    node.driver.stage_block(&record).unwrap();
    let attached = node.loops.attached.lock().unwrap().clone();
    assert!(attached[0].direct_io);

    let other = new_node();
    let buffered = Attributes {
        direct_io: Some(false),
        ..Default::default()
    };
    let record = block_volume(&other, buffered);
    other.driver.stage_block(&record).unwrap();
    assert!(!other.loops.attached.lock().unwrap()[0].direct_io);
}

#[test]
fn unstaging_detaches_every_device_of_the_volume_and_again_detaches_nothing() {
    let node = new_node();
    let record = block_volume(&node, Attributes::default());
    node.driver.stage_block(&record).unwrap();
    node.driver.unstage_block(&record).unwrap();
    assert_eq!(devices(&node), []);
    node.driver.unstage_block(&record).unwrap();
    let detaches = node
        .loops
        .calls()
        .iter()
        .filter(|c| c.starts_with("detach"))
        .count();
    assert_eq!(detaches, 1, "{:?}", node.loops.calls());
}

#[test]
fn a_device_held_open_is_not_unstaged_and_stays_attached() {
    let node = new_node();
    let record = block_volume(&node, Attributes::default());
    node.driver.stage_block(&record).unwrap();
    node.loops.busy.lock().unwrap().push(LoopDevice(0));
    let err = node.driver.unstage_block(&record).unwrap_err();
    assert!(
        matches!(err, NodeError::Loop(LoopError::Busy { .. })),
        "{err:?}"
    );
    assert_eq!(devices(&node), [(0, false)]);
}

#[test]
fn publishing_before_staging_is_refused_and_attaches_and_mounts_nothing() {
    let node = new_node();
    let record = block_volume(&node, Attributes::default());
    let target = node._dir.path().join("target");
    let err = (node.driver)
        .publish_block(&record, None, &target, false, false)
        .unwrap_err();
    assert!(
        matches!(err, NodeError::Bind(BindError::NotStaged { .. })),
        "{err:?}"
    );
    assert_eq!(node.loops.calls(), Vec::<String>::new());
    assert_eq!(node.mounter.calls(), Vec::<String>::new());
    assert!(!target.exists(), "no target file is left behind");
}

#[test]
fn a_read_only_publish_binds_a_read_only_device_of_its_own_onto_a_new_target_file() {
    let node = new_node();
    let record = block_volume(&node, Attributes::default());
    node.driver.stage_block(&record).unwrap();
    let target = node._dir.path().join("target");
    let published = (node.driver)
        .publish_block(&record, None, &target, true, false)
        .unwrap();
    assert_eq!(published, Published::Mounted { created: true });
    assert_eq!(devices(&node), [(0, false), (1, true)]);
    assert!(target.is_file(), "the target file was made");
    assert_eq!(
        node.mounter.calls(),
        [format!("bind-file /dev/loop1 {}", target.display())]
    );
}

#[test]
fn a_writable_publish_binds_the_staged_device_and_attaches_no_other() {
    let node = new_node();
    let record = block_volume(&node, Attributes::default());
    node.driver.stage_block(&record).unwrap();
    let target = node._dir.path().join("target");
    (node.driver)
        .publish_block(&record, None, &target, false, false)
        .unwrap();
    assert_eq!(devices(&node), [(0, false)]);
    assert_eq!(
        node.mounter.calls(),
        [format!("bind-file /dev/loop0 {}", target.display())]
    );
}

#[test]
fn expansion_grows_the_file_and_tells_every_device_its_new_size() {
    let node = new_node();
    let mut record = block_volume(&node, Attributes::default());
    node.driver.stage_block(&record).unwrap();
    record.capacity = 4 << 20;
    let size = node.driver.expand_block_on_node(&record).unwrap();
    assert_eq!(size, 4 << 20);
    let image = node.driver.image_of(&record.id);
    assert_eq!(std::fs::metadata(image).unwrap().len(), 4 << 20);
    assert!(
        node.loops
            .calls()
            .contains(&"refresh /dev/loop0".to_owned())
    );
}

#[test]
fn direct_io_is_switched_on_attached_devices_only_where_it_differs() {
    let node = new_node();
    let mut record = block_volume(&node, Attributes::default());
    node.driver.stage_block(&record).unwrap();
    record.attributes.direct_io = Some(true);
    node.driver.apply_direct_io(&record).unwrap();
    assert!(
        !node
            .loops
            .calls()
            .iter()
            .any(|c| c.starts_with("direct-io"))
    );
    record.attributes.direct_io = Some(false);
    node.driver.apply_direct_io(&record).unwrap();
    assert!(
        node.loops
            .calls()
            .contains(&"direct-io /dev/loop0 false".to_owned())
    );
}

#[test]
fn before_a_copy_only_writable_devices_are_flushed_and_a_volume_in_use_is_named() {
    let node = new_node();
    let record = block_volume(&node, Attributes::default());
    assert_eq!(node.driver.block_user(&record).unwrap(), None);
    node.driver.stage_block(&record).unwrap();
    let target = node._dir.path().join("target");
    (node.driver)
        .publish_block(&record, None, &target, true, false)
        .unwrap();
    node.driver.flush_block(&record).unwrap();
    let flushes: Vec<String> = (node.loops.calls().into_iter())
        .filter(|c| c.starts_with("flush"))
        .collect();
    assert_eq!(flushes, ["flush /dev/loop0"]);
    assert_eq!(
        node.driver.block_user(&record).unwrap(),
        Some(PathBuf::from("/dev/loop0"))
    );
}
