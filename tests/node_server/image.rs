//! Image volumes (`layout: image`) through the real binary: a thick file holding an ext4 of
//! its own, on a loop device and mounted at stage, bound at publish, unmounted and detached at
//! unstage, and clean by `e2fsck -fn` after; and the parameter's checks and what is refused
//! for them yet.

use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::csi_block::*;
use crate::common::csi_node::*;
use crate::common::scratch_fs::Kind;
use csi_nodekit::linux::ext4_image;
use csi_nodekit::proto::csi::volume_capability::AccessType;
use csi_nodekit::proto::csi::volume_capability::access_mode::Mode;
use csi_nodekit::proto::csi::*;
use tonic::Code;

pub(super) fn image_create(name: &str, bytes: u64, extra: &[(&str, &str)]) -> CreateVolumeRequest {
    let mut parameters: HashMap<String, String> = [("layout".into(), "image".into())].into();
    parameters.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    CreateVolumeRequest {
        parameters,
        ..create_request(name, bytes as i64)
    }
}

/// A mount capability with `fsGroup`.
fn with_group(mode: Mode, gid: &str) -> VolumeCapability {
    let mut cap = capability(mode, &[]);
    if let Some(AccessType::Mount(mount)) = &mut cap.access_type {
        mount.volume_mount_group = gid.into();
    }
    cap
}

/// The real binary on `state`, and a client.
pub(super) async fn spawn(dir: &Path, state: &Path) -> (common::KillOnDrop, Csi) {
    let socket = dir.join("image.sock");
    // A killed server's socket stays behind; the next must not be taken for it.
    let _ = std::fs::remove_file(&socket);
    let child = common::spawn_node_server(&socket, state, &["--node-id=n"]);
    assert!(
        common::wait_until(Duration::from_secs(20), || common::is_socket(&socket)).await,
        "node-server did not start:\n{}",
        child.stderr()
    );
    (child, connect(&socket).await)
}

/// `e2fsck -fn` of an image: exit 0 and its summary line.
pub(super) fn e2fsck(image: &Path) -> String {
    let (code, text) = common::scratch_fs::fsck(image);
    assert_eq!(code, 0, "e2fsck -fn {}:\n{text}", image.display());
    let summary = text.lines().find(|l| l.contains(" files ("));
    summary.unwrap_or_default().to_owned()
}

#[ignore = "needs root: real loop devices, ext4 and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_volume_is_a_thick_ext4_of_its_own_mounted_at_stage_and_clean_after_unstage() {
    let node = BlockNode::new(Kind::Ext4);
    let (state, sandbox) = (node.state.clone(), &node.sandbox);
    let (child, mut csi) = spawn(sandbox.path(), &state).await;
    let request = image_create("pvc-image", 16 * MIB, &[("rootMode", "0750")]);
    let volume = (csi.controller.create_volume(request.clone()).await)
        .expect("create")
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(volume.capacity_bytes, (16 * MIB) as i64);
    let id = volume.volume_id;
    let file = image(&state, &id);
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(meta.len(), 16 * MIB, "exactly the size");
    assert!(
        meta.blocks() * 512 >= 16 * MIB,
        "thick: {} blocks",
        meta.blocks()
    );
    let dir_mode = std::fs::metadata(file.parent().unwrap()).unwrap().mode();
    assert_eq!(dir_mode & 0o777, 0o700, "private: {dir_mode:o}");
    let record = std::fs::read_to_string(state.join("meta").join(format!("{id}.json"))).unwrap();
    assert!(record.contains(r#""layout":"image""#), "{record}");
    let again = csi.controller.create_volume(request).await.expect("again");
    assert_eq!(again.into_inner().volume.unwrap().volume_id, id);

    let staging = sandbox.dir("staging");
    let stage = NodeStageVolumeRequest {
        volume_capability: Some(with_group(Mode::SingleNodeWriter, "1234")),
        ..stage_request(&id, &staging)
    };
    let started = Instant::now();
    csi.node
        .node_stage_volume(stage.clone())
        .await
        .expect("stage");
    let staged_in = started.elapsed();
    csi.node
        .node_stage_volume(stage)
        .await
        .expect("stage again");
    let device = the_one_direct_io_device(&state, &id);
    let fs = nix::sys::statfs::statfs(&staging).unwrap();
    assert_eq!(fs.filesystem_type(), nix::sys::statfs::EXT4_SUPER_MAGIC);
    let root = std::fs::metadata(&staging).unwrap();
    assert_eq!(root.dev(), device.rdev(), "the device's filesystem");
    assert_eq!(root.gid(), 1234, "fsGroup at the root");
    assert_eq!(
        root.mode() & 0o7777,
        0o2770,
        "rootMode 0750 with the group's rwx, setgid"
    );

    let targets = sandbox.dir("pods");
    let (target, reader) = (targets.join("rw"), targets.join("ro"));
    let publish = |target: &Path, ro| NodePublishVolumeRequest {
        volume_capability: Some(with_group(Mode::SingleNodeWriter, "1234")),
        ..publish_request(&id, &staging, target, ro)
    };
    for _ in 0..2 {
        csi.node
            .node_publish_volume(publish(&target, false))
            .await
            .expect("publish");
    }
    csi.node
        .node_publish_volume(publish(&reader, true))
        .await
        .expect("publish ro");
    std::fs::write(target.join("data"), vec![7u8; MIB as usize]).unwrap();
    assert_eq!(
        std::fs::read(reader.join("data")).unwrap().len(),
        MIB as usize
    );
    let refused = std::fs::write(reader.join("other"), b"x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(nix::libc::EROFS), "{refused}");

    let stats = csi
        .node
        .node_get_volume_stats(stats_request(&id, &target.display().to_string()));
    let stats = stats.await.expect("stats").into_inner();
    let fs = nix::sys::statvfs::statvfs(&target).unwrap();
    let bytes = &stats.usage[0];
    assert_eq!(bytes.unit, volume_usage::Unit::Bytes as i32);
    assert_eq!(bytes.total as u64, fs.blocks() * fs.fragment_size());
    assert!(
        bytes.total > 10_000_000 && bytes.total <= (16 * MIB) as i64,
        "{bytes:?}"
    );
    assert!(
        bytes.used >= MIB as i64,
        "the file written counts: {bytes:?}"
    );
    let inodes = &stats.usage[1];
    assert_eq!(
        inodes.total as u64,
        fs.files(),
        "its own filesystem's inodes"
    );
    assert!(!stats.volume_condition.unwrap().abnormal);
    let deleting = csi.controller.delete_volume(delete_request(&id)).await;
    assert_eq!(
        code(deleting),
        Code::FailedPrecondition,
        "attached: never deleted"
    );
    let early = csi
        .node
        .node_unstage_volume(unstage_request(&id, &staging))
        .await;
    assert_eq!(code(early), Code::FailedPrecondition, "still published");

    for path in [&target, &reader, &target] {
        csi.node
            .node_unpublish_volume(unpublish_request(&id, path))
            .await
            .expect("unpublish");
    }
    assert!(!is_mounted(&target) && !is_mounted(&reader));
    let started = Instant::now();
    for _ in 0..2 {
        csi.node
            .node_unstage_volume(unstage_request(&id, &staging))
            .await
            .expect("unstage");
    }
    let unstaged_in = started.elapsed();
    assert!(!is_mounted(&staging));
    assert_eq!(devices(&state, &id), (vec![], vec![]), "detached");
    let summary = e2fsck(&file);
    let superblock = ext4_image::superblock(&std::fs::File::open(&file).unwrap()).unwrap();
    assert_eq!(
        superblock.uuid,
        ext4_image::volume_uuid(&id),
        "a UUID of its own"
    );
    eprintln!(
        "image volume: stage {staged_in:?}, two unstages {unstaged_in:?}; {} of {} bytes and {} \
         inodes free after 1 MiB written; e2fsck: {summary}",
        bytes.available, bytes.total, inodes.available
    );

    csi.controller
        .delete_volume(delete_request(&id))
        .await
        .expect("delete");
    assert!(!file.parent().unwrap().exists());
    drop(child);
}

#[ignore = "needs root: real loop devices, ext4 and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_finds_the_staged_filesystem_with_its_files_and_it_stays_clean() {
    let node = BlockNode::new(Kind::Ext4);
    let (state, sandbox) = (node.state.clone(), &node.sandbox);
    let (child, mut csi) = spawn(sandbox.path(), &state).await;
    let volume = csi
        .controller
        .create_volume(image_create("pvc-ro", 1, &[]))
        .await;
    let volume = volume.expect("create").into_inner().volume.unwrap();
    assert_eq!(volume.capacity_bytes, (16 * MIB) as i64, "the least size");
    let id = volume.volume_id;
    let (staging, target) = (sandbox.dir("staging"), sandbox.dir("pods").join("t"));
    csi.stage_and_publish(&id, &staging, &target, false).await;
    std::fs::write(target.join("kept"), b"before the restart").unwrap();
    drop(child);
    let (child, mut csi) = spawn(sandbox.path(), &state).await;
    csi.stage_and_publish(&id, &staging, &target, false).await;
    assert_eq!(
        devices(&state, &id).0.len(),
        1,
        "the same device found again"
    );
    assert_eq!(
        std::fs::read(target.join("kept")).unwrap(),
        b"before the restart"
    );
    csi.unpublish_and_unstage(&id, &target, &staging).await;
    assert_eq!(devices(&state, &id), (vec![], vec![]), "detached");
    e2fsck(&image(&state, &id));
    let mode = std::fs::metadata(image(&state, &id))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    drop(child);
}

#[ignore = "needs root: real loop devices, ext4 and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staging_path_or_target_inside_an_image_volumes_filesystem_is_refused() {
    let node = BlockNode::new(Kind::Ext4);
    let (state, sandbox) = (node.state.clone(), &node.sandbox);
    let (child, mut csi) = spawn(sandbox.path(), &state).await;
    let image_volume = (csi
        .controller
        .create_volume(image_create("pvc-host", 1, &[]))
        .await)
        .expect("create the image volume")
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let other = create(&mut csi, "pvc-guest", MIB as i64).await;
    let (staging, target) = (sandbox.dir("staging"), sandbox.dir("pods").join("t"));
    csi.stage_and_publish(&image_volume, &staging, &target, false)
        .await;
    let other_staging = sandbox.dir("other-staging");
    (csi.node
        .node_stage_volume(stage_request(&other, &other_staging))
        .await)
        .expect("stage the other volume elsewhere");
    // Paths inside the image volume's own ext4, as a pod (or a careless CO) could make them:
    // through its staging mount and through its published target.
    for inside in [&staging, &target] {
        std::fs::create_dir_all(inside.join("sub/staging")).unwrap();
        let stage = csi
            .node
            .node_stage_volume(stage_request(&other, &inside.join("sub/staging")))
            .await;
        assert_eq!(
            code(stage),
            Code::InvalidArgument,
            "staging inside {}",
            inside.display()
        );
        let publish = csi
            .node
            .node_publish_volume(publish_request(
                &other,
                &other_staging,
                &inside.join("sub/target"),
                false,
            ))
            .await;
        assert_eq!(
            code(publish),
            Code::InvalidArgument,
            "target inside {}",
            inside.display()
        );
        assert!(!is_mounted(&inside.join("sub/staging")) && !inside.join("sub/target").exists());
    }
    (csi.node
        .node_unstage_volume(unstage_request(&other, &other_staging))
        .await)
        .expect("unstage the other volume");
    csi.unpublish_and_unstage(&image_volume, &target, &staging)
        .await;
    e2fsck(&image(&state, &image_volume));
    drop(child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layout_parameter_is_checked_and_an_expansion_allocates_the_image_in_full() {
    let sandbox = MountSandbox::new();
    let (_child, mut csi) = spawn(sandbox.path(), &sandbox.path().join("state")).await;
    let bad = CreateVolumeRequest {
        parameters: [("layout".into(), "zfs".into())].into(),
        ..create_request("pvc-bad", MIB as i64)
    };
    let err = csi.controller.create_volume(bad).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("layout=\"zfs\""),
        "{}",
        err.message()
    );
    let block = CreateVolumeRequest {
        volume_capabilities: vec![block_cap()],
        ..image_create("pvc-block", MIB, &[])
    };
    let err = csi.controller.create_volume(block).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("raw block"), "{}", err.message());
    let small = CreateVolumeRequest {
        capacity_range: Some(CapacityRange {
            required_bytes: MIB as i64,
            limit_bytes: (8 * MIB) as i64,
        }),
        ..image_create("pvc-small", MIB, &[])
    };
    assert_eq!(
        code(csi.controller.create_volume(small).await),
        Code::OutOfRange
    );
    let inodes = image_create("pvc-inodes", 16 * MIB, &[("inodeLimit", "100")]);
    assert_eq!(
        code(csi.controller.create_volume(inodes).await),
        Code::InvalidArgument
    );

    let id = (csi
        .controller
        .create_volume(image_create("pvc", 20 * MIB, &[]))
        .await)
        .expect("create")
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let directory = create_request("pvc", (20 * MIB) as i64);
    let err = csi.controller.create_volume(directory).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    assert!(err.message().contains("layout image"), "{}", err.message());
    let listed = csi.list().await;
    assert_eq!(listed[0].capacity_bytes, (20 * MIB) as i64);
    // ValidateVolumeCapabilities: a request naming no layout asks nothing of it (csi-sanity
    // sends none); one naming the other layout is not confirmed, and says why.
    let validate = |parameters: &[(&str, &str)]| ValidateVolumeCapabilitiesRequest {
        volume_id: id.clone(),
        volume_capabilities: vec![rwo()],
        parameters: (parameters.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    for (parameters, confirmed) in [
        (&[][..], true),
        (&[("layout", "image")][..], true),
        (&[("layout", "directory")][..], false),
    ] {
        let reply = csi
            .controller
            .validate_volume_capabilities(validate(parameters));
        let reply = reply.await.expect("validate").into_inner();
        assert_eq!(
            reply.confirmed.is_some(),
            confirmed,
            "{parameters:?}: {reply:?}"
        );
        if !confirmed {
            assert!(reply.message.contains("layout image"), "{reply:?}");
        }
    }

    let expand = ControllerExpandVolumeRequest {
        volume_id: id.clone(),
        capacity_range: Some(CapacityRange {
            required_bytes: (40 * MIB) as i64,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    // The controller's part of an expansion: the record and the file, allocated in full
    // (the node's part grows the device and the filesystem: the quota VM, which can).
    let expanded = (csi.controller.controller_expand_volume(expand).await)
        .expect("expand")
        .into_inner();
    assert_eq!(expanded.capacity_bytes, (40 * MIB) as i64);
    assert!(expanded.node_expansion_required);
    let file = std::fs::metadata(image(&sandbox.path().join("state"), &id)).unwrap();
    assert_eq!(file.len(), 40 * MIB);
    assert!(
        file.blocks() * 512 >= 40 * MIB,
        "thick: {} blocks",
        file.blocks()
    );
    csi.controller
        .delete_volume(delete_request(&id))
        .await
        .expect("delete");
    assert!(csi.list().await.is_empty());
}
