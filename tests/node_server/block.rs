//! Raw block volumes with real loop devices and real bind mounts (in the README's private
//! mount namespace): a sparse file of exactly the size, attached at stage, its device node
//! bound onto a target file at publish, data written through it landing in the file; a
//! read-only publish on a read-only device; a restart and a simulated reboot; online
//! expansion (ControllerExpandVolume then NodeExpandVolume, or NodeExpandVolume alone, the
//! external-resizer's node-only path); and what is refused while a device is in use.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use crate::common::csi_block::*;
use crate::common::csi_node::*;
use crate::common::scratch_fs::Kind;
use csi_nodekit::linux::loopdev;
use csi_nodekit::proto::csi::*;
use tonic::Code;

fn rdev(path: &Path) -> u64 {
    let meta = std::fs::metadata(path).expect("stat target");
    assert!(
        meta.file_type().is_block_device(),
        "{} is a device",
        path.display()
    );
    meta.rdev()
}

fn mounts_at(path: &Path) -> usize {
    let table = csi_nodekit::linux::mountinfo::MountTable::read().unwrap();
    table
        .entries()
        .iter()
        .filter(|e| e.mount_point == path)
        .count()
}

async fn stats_total(csi: &mut Csi, id: &str, path: &Path) -> (Vec<VolumeUsage>, VolumeCondition) {
    let request = stats_request(id, &path.display().to_string());
    let reply = csi
        .node
        .node_get_volume_stats(request)
        .await
        .expect("stats");
    let reply = reply.into_inner();
    (reply.usage, reply.volume_condition.expect("a condition"))
}

#[ignore = "needs root: real loop devices and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_volume_is_a_sparse_file_on_a_loop_device_published_as_a_device_node() {
    let (node, server, mut csi) = start_block_node(Kind::Ext4).await;
    let (state, sandbox) = (node.state.clone(), &node.sandbox);
    let volume = csi.create_block("pvc-block", 8 * MIB).await;
    assert_eq!(volume.capacity_bytes, (8 * MIB) as i64);
    let id = volume.volume_id;
    let file = std::fs::metadata(image(&state, &id)).unwrap();
    assert_eq!(file.len(), 8 * MIB, "exactly the size");
    assert!(file.blocks() < 64, "sparse: {} blocks", file.blocks());
    assert_eq!(
        devices(&state, &id),
        (vec![], vec![]),
        "nothing attached before staging"
    );

    let (staging, target) = (sandbox.dir("staging"), sandbox.dir("pods").join("dev"));
    for _ in 0..2 {
        csi.attach_block(&id, &staging, &target, false).await;
    }
    let device = the_one_direct_io_device(&state, &id);
    assert_eq!(
        rdev(&target),
        device.rdev(),
        "the target is the staged device"
    );
    assert_eq!(mounts_at(&target), 1, "published once, however often asked");

    let data = pattern(7, 64 << 10);
    write_at(&target, MIB, &data).unwrap();
    assert!(
        read_at(&image(&state, &id), MIB, data.len()) == data,
        "in the file"
    );
    let (usage, condition) = stats_total(&mut csi, &id, &target).await;
    assert_eq!(usage.len(), 1);
    assert_eq!(usage[0].unit, volume_usage::Unit::Bytes as i32);
    assert_eq!(usage[0].total, (8 * MIB) as i64);
    assert!(!condition.abnormal, "{condition:?}");

    for _ in 0..2 {
        csi.node
            .node_unpublish_volume(unpublish_request(&id, &target))
            .await
            .expect("unpublish");
    }
    assert!(!target.exists(), "the target file publish made is gone");
    assert_eq!(devices(&state, &id).0, vec![device], "still staged");
    for _ in 0..2 {
        let unstaged = csi.node.node_unstage_volume(unstage_request(&id, &staging));
        unstaged.await.expect("unstage");
    }
    assert_eq!(devices(&state, &id), (vec![], vec![]), "detached");
    assert!(let_go(device, &state, &id), "the device was detached");
    csi.controller
        .delete_volume(delete_request(&id))
        .await
        .unwrap();
    assert!(!state.join("volumes").join(&id).exists());
    server.stop().await;
}

#[ignore = "needs root: real loop devices and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_publish_gets_a_read_only_device_of_its_own_detached_with_its_last_target() {
    let (node, server, mut csi) = start_block_node(Kind::Ext4).await;
    let (state, sandbox) = (node.state.clone(), &node.sandbox);
    let id = csi.create_block("pvc-ro", 4 * MIB).await.volume_id;
    let staging = sandbox.dir("staging");
    let (rw_target, ro_target) = (
        sandbox.dir("pods").join("rw"),
        sandbox.path().join("pods/ro"),
    );
    csi.attach_block(&id, &staging, &rw_target, false).await;
    let data = pattern(3, 4096);
    write_at(&rw_target, 0, &data).unwrap();
    for _ in 0..2 {
        let published = csi
            .node
            .node_publish_volume(block_publish(&id, &staging, &ro_target, true));
        published.await.expect("read-only publish");
    }
    let (rw, ro) = devices(&state, &id);
    assert_eq!(
        (rw.len(), ro.len()),
        (1, 1),
        "a read-only device beside the staged one"
    );
    assert_eq!(rdev(&ro_target), ro[0].rdev());
    assert!(
        read_at(&ro_target, 0, data.len()) == data,
        "the data written"
    );
    let written = write_at(&ro_target, 0, &pattern(9, 4096));
    assert!(
        written.is_err(),
        "a write through the read-only target fails"
    );
    assert!(
        read_at(&rw_target, 0, data.len()) == data,
        "and changed nothing"
    );
    let read_write = block_publish(&id, &staging, &ro_target, false);
    let reply = csi.node.node_publish_volume(read_write).await;
    assert_eq!(
        code(reply),
        Code::AlreadyExists,
        "read-write where it is read-only"
    );

    let unpublished = csi
        .node
        .node_unpublish_volume(unpublish_request(&id, &ro_target));
    unpublished.await.expect("unpublish read-only");
    assert_eq!(
        devices(&state, &id),
        (rw.clone(), vec![]),
        "the read-only device went with it"
    );
    assert!(
        let_go(ro[0], &state, &id),
        "the read-only device was detached"
    );
    csi.detach_block(&id, &staging, &rw_target).await;
    assert_eq!(devices(&state, &id), (vec![], vec![]));
    server.stop().await;
}

#[ignore = "needs root: real loop devices and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_finds_the_device_and_after_a_reboot_staging_attaches_a_new_one() {
    let node = BlockNode::new(Kind::Ext4);
    let (state, sandbox) = (node.state.clone(), &node.sandbox);
    let first = node.start().await;
    let mut csi = first.client().await;
    let id = csi.create_block("pvc-reboot", 4 * MIB).await.volume_id;
    let (staging, target) = (sandbox.dir("staging"), sandbox.dir("pods").join("dev"));
    csi.attach_block(&id, &staging, &target, false).await;
    let data = pattern(5, 8192);
    write_at(&target, 2 * MIB, &data).unwrap();
    let (before, _) = devices(&state, &id);
    first.stop().await;

    let second = node.start().await;
    let mut csi = second.client().await;
    csi.attach_block(&id, &staging, &target, false).await;
    assert_eq!(
        devices(&state, &id).0,
        before,
        "the same device, found by its file"
    );
    assert_eq!(mounts_at(&target), 1, "nothing stacked");
    second.stop().await;

    // A reboot: mounts and loop devices are gone, the kubelet's target file is still there.
    nix::mount::umount2(&target, nix::mount::MntFlags::MNT_DETACH).unwrap();
    loopdev::detach(before[0], &image(&state, &id)).unwrap();
    let third = node.start().await;
    let mut csi = third.client().await;
    csi.attach_block(&id, &staging, &target, false).await;
    let (after, _) = devices(&state, &id);
    assert_eq!(after.len(), 1, "attached anew");
    assert_eq!(rdev(&target), after[0].rdev());
    assert!(
        read_at(&target, 2 * MIB, data.len()) == data,
        "the data outlived the reboot"
    );
    csi.detach_block(&id, &staging, &target).await;
    third.stop().await;
}

#[ignore = "needs root: real loop devices and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_block_volume_expands_online() {
    grow_a_published_block_volume_held_open(Route::ControllerThenNode).await;
}

/// The external-resizer's node-only path: the kubelet's NodeExpandVolume with the size the PV
/// now records, no ControllerExpandVolume before it.
#[ignore = "needs root: real loop devices and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_expand_volume_alone_grows_a_published_block_volume_online() {
    grow_a_published_block_volume_held_open(Route::NodeOnly).await;
}

/// How an expansion reaches node-server.
#[derive(PartialEq)]
enum Route {
    ControllerThenNode,
    NodeOnly,
}

/// An 8 MiB raw block volume, published and held open by a pod's writer, grown to 16 MiB
/// along `route`: the file, the loop device, a write past the old end, the stats.
async fn grow_a_published_block_volume_held_open(route: Route) {
    let (node, server, mut csi) = start_block_node(Kind::Ext4).await;
    let (state, sandbox) = (node.state.clone(), &node.sandbox);
    let id = csi.create_block("pvc-grow", 8 * MIB).await.volume_id;
    let (staging, target) = (sandbox.dir("staging"), sandbox.dir("pods").join("dev"));
    csi.attach_block(&id, &staging, &target, false).await;
    let data = pattern(1, 4096);
    write_at(&target, 0, &data).unwrap();
    // A pod holding the device open all along.
    let held = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&target)
        .unwrap();
    let range = Some(CapacityRange {
        required_bytes: (16 * MIB) as i64,
        limit_bytes: 0,
    });
    if route == Route::ControllerThenNode {
        let expand = ControllerExpandVolumeRequest {
            volume_id: id.clone(),
            capacity_range: range,
            ..Default::default()
        };
        let reply = csi
            .controller
            .controller_expand_volume(expand)
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.capacity_bytes, (16 * MIB) as i64);
        assert!(reply.node_expansion_required, "the device must be told");
        assert_eq!(
            std::fs::metadata(image(&state, &id)).unwrap().len(),
            16 * MIB
        );
        let (rw, _) = devices(&state, &id);
        assert_eq!(loopdev::size(rw[0]).unwrap(), 8 * MIB, "not yet");
    }
    let node_expand = NodeExpandVolumeRequest {
        volume_id: id.clone(),
        volume_path: target.display().to_string(),
        capacity_range: range,
        ..Default::default()
    };
    let reply = csi
        .node
        .node_expand_volume(node_expand)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.capacity_bytes, (16 * MIB) as i64);
    assert_eq!(
        std::fs::metadata(image(&state, &id)).unwrap().len(),
        16 * MIB
    );
    let (rw, _) = devices(&state, &id);
    assert_eq!(loopdev::size(rw[0]).unwrap(), 16 * MIB, "the device told");
    let listed = csi.list().await;
    let recorded = listed.iter().find(|v| v.volume_id == id).expect("listed");
    assert_eq!(recorded.capacity_bytes, (16 * MIB) as i64, "recorded");
    use std::os::unix::fs::FileExt;
    held.write_all_at(&data, 12 * MIB)
        .expect("write past the old end");
    held.sync_all().unwrap();
    assert!(read_at(&target, 0, data.len()) == data, "the data kept");
    assert!(
        read_at(&target, 12 * MIB, data.len()) == data,
        "the data written"
    );
    let (usage, _) = stats_total(&mut csi, &id, &target).await;
    assert_eq!(usage[0].total, (16 * MIB) as i64);
    drop(held);
    csi.detach_block(&id, &staging, &target).await;
    server.stop().await;
}

#[ignore = "needs root: real loop devices and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_in_use_is_neither_deleted_nor_detached_and_foreign_devices_are_left_alone() {
    let (node, server, mut csi) = start_block_node(Kind::Ext4).await;
    let (state, sandbox) = (node.state.clone(), &node.sandbox);
    let id = csi.create_block("pvc-busy", 4 * MIB).await.volume_id;
    let (staging, target) = (sandbox.dir("staging"), sandbox.dir("pods").join("dev"));
    csi.attach_block(&id, &staging, &target, false).await;
    let reply = csi.controller.delete_volume(delete_request(&id)).await;
    assert_eq!(code(reply), Code::FailedPrecondition, "delete while staged");
    let reply = csi
        .node
        .node_unstage_volume(unstage_request(&id, &staging))
        .await;
    assert_eq!(
        code(reply),
        Code::FailedPrecondition,
        "unstage while published"
    );
    assert_eq!(mounts_at(&target), 1);
    let unpublished = csi
        .node
        .node_unpublish_volume(unpublish_request(&id, &target));
    unpublished.await.unwrap();
    let (rw, _) = devices(&state, &id);
    let open = std::fs::File::open(rw[0].path()).unwrap();
    let reply = csi
        .node
        .node_unstage_volume(unstage_request(&id, &staging))
        .await;
    assert_eq!(
        code(reply),
        Code::Aborted,
        "a device still open is retried, not pulled"
    );
    assert_eq!(devices(&state, &id).0, rw, "still attached");
    drop(open);
    let unstaged = csi.node.node_unstage_volume(unstage_request(&id, &staging));
    unstaged.await.expect("unstage once closed");

    // An administrator's writable device on our file: staging refuses to add a second writer.
    let admin = std::process::Command::new("losetup")
        .args(["--find", "--show"])
        .arg(image(&state, &id))
        .output()
        .unwrap();
    assert!(
        admin.status.success(),
        "{}",
        String::from_utf8_lossy(&admin.stderr)
    );
    let admin = String::from_utf8(admin.stdout).unwrap().trim().to_owned();
    let reply = csi.node.node_stage_volume(block_stage(&id, &staging)).await;
    let refused = code(reply);
    let still = std::fs::metadata(&admin).is_ok()
        && loopdev::find(&image(&state, &id)).unwrap().foreign.len() == 1;
    let reply = csi.controller.delete_volume(delete_request(&id)).await;
    let delete_refused = code(reply);
    std::process::Command::new("losetup")
        .args(["-d", &admin])
        .status()
        .unwrap();
    assert_eq!(
        refused,
        Code::FailedPrecondition,
        "another's writable device"
    );
    assert!(still, "and it was left alone");
    assert_eq!(
        delete_refused,
        Code::FailedPrecondition,
        "its file is not deleted"
    );
    csi.controller
        .delete_volume(delete_request(&id))
        .await
        .unwrap();
    server.stop().await;
}

#[ignore = "needs root: real loop devices and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_io_is_switched_on_the_attached_device_at_once_and_kept_for_the_next_attach() {
    let (node, server, mut csi) = start_block_node(Kind::Ext4).await;
    let (state, sandbox) = (node.state.clone(), &node.sandbox);
    let id = csi.create_block("pvc-dio", 4 * MIB).await.volume_id;
    let (staging, target) = (sandbox.dir("staging"), sandbox.dir("pods").join("dev"));
    csi.attach_block(&id, &staging, &target, false).await;
    let direct_io = |id: &str| {
        let (rw, _) = devices(&state, id);
        loopdev::status(rw[0]).unwrap().unwrap().direct_io
    };
    assert!(direct_io(&id), "on by default");
    let modify = |on: &str| ControllerModifyVolumeRequest {
        volume_id: id.clone(),
        mutable_parameters: [("directIO".to_owned(), on.to_owned())].into(),
        ..Default::default()
    };
    let data = pattern(4, 4096);
    write_at(&target, 0, &data).unwrap();
    csi.controller
        .controller_modify_volume(modify("false"))
        .await
        .unwrap();
    assert!(!direct_io(&id), "switched off while published");
    assert!(read_at(&target, 0, data.len()) == data, "the data written");
    // The next attach (after a reboot, say) keeps the recorded choice.
    csi.detach_block(&id, &staging, &target).await;
    csi.attach_block(&id, &staging, &target, false).await;
    assert!(!direct_io(&id), "still off after a new attach");
    csi.controller
        .controller_modify_volume(modify("true"))
        .await
        .unwrap();
    assert!(direct_io(&id), "and on again");
    let refused = csi
        .controller
        .controller_modify_volume(modify("maybe"))
        .await;
    assert_eq!(code(refused), Code::InvalidArgument);
    let mount = create(&mut csi, "pvc-dir", MIB as i64).await;
    let on_a_directory = ControllerModifyVolumeRequest {
        volume_id: mount,
        ..modify("true")
    };
    let refused = csi
        .controller
        .controller_modify_volume(on_a_directory)
        .await;
    assert_eq!(
        code(refused),
        Code::InvalidArgument,
        "directIO is a block volume's"
    );
    csi.detach_block(&id, &staging, &target).await;
    server.stop().await;
}
