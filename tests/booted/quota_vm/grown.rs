//! Inside the VM: an image volume's ext4 grown online from the template by the kernel
//! (`EXT4_IOC_RESIZE_FS` needs CAP_SYS_RESOURCE, which the build machines' root lacks). The
//! image lies on the case's filesystem (XFS or ext4) as a volume's image would on the state
//! directory's; every size is checked by `e2fsck -fn`.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::time::Instant;

use csi_nodekit::linux::ext4_image::{self, BLOCK_BYTES};
use csi_nodekit::linux::loopdev::{self, AttachOptions};
use csi_nodekit::linux::quota::FsKind;
use nix::mount::{MsFlags, mount, umount};

use super::cases::{MIB, figure};
use super::fixtures::{Prep, TestFs};
use crate::common::scratch_fs::fsck;

const GIB: u64 = 1 << 30;

pub fn an_image_volumes_ext4_grows_online_from_the_template_and_checks_clean(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Plain);
    let image = fs.mnt.join("volume.img");
    ext4_image::write_template(&File::create_new(&image).unwrap()).unwrap();
    let options = AttachOptions {
        read_only: false,
        direct_io: true,
        block_size: 0,
    };
    let device = loopdev::attach(&image, options).expect("attach").device;
    let mnt = tempfile::tempdir().unwrap();
    for size in [GIB, 100 * GIB] {
        mount(
            Some(&device.path()),
            mnt.path(),
            Some("ext4"),
            MsFlags::empty(),
            None::<&str>,
        )
        .expect("mount");
        let started = Instant::now();
        loopdev::grow_backing_file(&image, size).expect("grow the image");
        loopdev::refresh_capacity(device, &image).expect("LOOP_SET_CAPACITY");
        let root = File::open(mnt.path()).unwrap();
        ext4_image::grow(&root, size).expect("EXT4_IOC_RESIZE_FS");
        let took = started.elapsed();
        let df = nix::sys::statvfs::statvfs(mnt.path()).unwrap();
        let total = df.blocks() as u64 * df.fragment_size() as u64;
        let inodes = df.files();
        drop(root);
        umount(mnt.path()).unwrap();
        let (code, text) = fsck(&device.path());
        assert_eq!(code, 0, "{size} bytes:\n{text}");
        assert!(
            total > size / 100 * 97 && total <= size,
            "{total} bytes usable of {size}"
        );
        assert_eq!(inodes, size / (16 << 10), "one inode per 16 KiB");
        let held = std::fs::metadata(&image).unwrap().blocks() * 512;
        figure(
            kind,
            format_args!(
                "an image volume's ext4 grown online from the 16 MiB template to {} GiB in \
                 {} ms (TCG): {:.1} % usable, {inodes} inodes, {} KiB of the image allocated; \
                 e2fsck -fn clean",
                size / GIB,
                took.as_millis(),
                total as f64 * 100.0 / size as f64,
                held / 1024
            ),
        );
        assert!(
            held < 4 * MIB + size / GIB * 64 * 1024,
            "{held} bytes allocated"
        );
        assert_eq!(size % BLOCK_BYTES, 0);
    }
    loopdev::detach(device, &image).expect("detach");
}

/// Through the real node-server: a 32 MiB image volume (the template's 16 MiB ext4 in a thick
/// 32 MiB file) grown to its size at NodeStageVolume, writes held to that size by the
/// filesystem itself; expanded online when full, again while unstaged (grown at its next
/// stage), and by NodeExpandVolume alone (the node-only path); clean by `e2fsck -fn` after
/// each unstage.
pub fn node_server_stages_an_image_volume_growing_its_ext4_to_the_size_it_holds(kind: FsKind) {
    use super::served::{Served, runtime, stats};
    use crate::common::csi_node::{create_request, delete_request};
    let fs = TestFs::new(kind, Prep::Plain);
    let served = Served::start(&fs, "state", &[]);
    runtime().block_on(async {
        let mut csi = served.client().await;
        let pod = served.pod("img");
        let request = csi_nodekit::proto::csi::CreateVolumeRequest {
            parameters: [("layout".into(), "image".into())].into(),
            ..create_request("pvc-image", (32 * MIB) as i64)
        };
        let created = Instant::now();
        let volume = csi.controller.create_volume(request).await.expect("create");
        let id = volume.into_inner().volume.expect("volume").volume_id;
        let create_took = created.elapsed();
        let image = served.volume_dir(&id).join("volume.img");
        let held = std::fs::metadata(&image).unwrap().blocks() * 512;
        assert!(held >= 32 * MIB, "thick: {held} bytes allocated");
        let staged = Instant::now();
        csi.stage_and_publish(&id, &pod.staging, &pod.target, false)
            .await;
        let stage_took = staged.elapsed();
        let (bytes, inodes, _) = stats(&mut csi, &id, &pod.target).await;
        assert!(
            bytes.total as u64 > 25 * MIB && bytes.total as u64 <= 32 * MIB,
            "grown to the size: {bytes:?}"
        );
        // 8,192 inodes per block group of 128 MiB: the template's one group.
        assert_eq!(inodes.total, 8192, "one block group's inodes");
        // A writer stops at the filesystem's end: the volume's size, by construction.
        let mut file = File::create(pod.target.join("fill")).unwrap();
        let chunk = vec![1u8; MIB as usize];
        let mut written = 0u64;
        let stopped = loop {
            match std::io::Write::write_all(&mut file, &chunk) {
                Ok(()) => written += MIB,
                Err(e) => break e,
            }
            assert!(written <= 32 * MIB, "wrote past the size");
        };
        assert_eq!(stopped.raw_os_error(), Some(nix::libc::ENOSPC), "{stopped}");
        // Expanded while published and full: the file, the device and the filesystem grow
        // online, and the writer goes on to the new size.
        let expanded = Instant::now();
        super::served::expand(&mut csi, &id, 48 * MIB, &pod.target).await;
        let expand_took = expanded.elapsed();
        let (grown, _, _) = stats(&mut csi, &id, &pod.target).await;
        assert!(grown.total as u64 > 41 * MIB, "grown online: {grown:?}");
        let more = loop {
            match std::io::Write::write_all(&mut file, &chunk) {
                Ok(()) => written += MIB,
                Err(e) => break e,
            }
            assert!(written <= 48 * MIB, "wrote past the new size");
        };
        assert_eq!(more.raw_os_error(), Some(nix::libc::ENOSPC), "{more}");
        assert!(written > 36 * MIB, "{written} bytes written in all");
        drop(file);
        csi.unpublish_and_unstage(&id, &pod.target, &pod.staging)
            .await;
        let (code, text) = fsck(&image);
        assert_eq!(code, 0, "{text}");
        let superblock = ext4_image::superblock(&File::open(&image).unwrap()).unwrap();
        assert_eq!(superblock.bytes, 48 * MIB, "the filesystem's own size");
        let held = std::fs::metadata(&image).unwrap().blocks() * 512;
        assert!(
            held >= 48 * MIB,
            "thick after the growth: {held} bytes allocated"
        );
        // Expanded while not staged: its next stage grows the filesystem.
        let request = csi_nodekit::proto::csi::ControllerExpandVolumeRequest {
            volume_id: id.clone(),
            capacity_range: Some(csi_nodekit::proto::csi::CapacityRange {
                required_bytes: (64 * MIB) as i64,
                limit_bytes: 0,
            }),
            ..Default::default()
        };
        let answer = csi.controller.controller_expand_volume(request).await;
        let answer = answer.expect("expand while unstaged").into_inner();
        assert_eq!(answer.capacity_bytes, (64 * MIB) as i64);
        assert!(answer.node_expansion_required);
        csi.stage_and_publish(&id, &pod.staging, &pod.target, false)
            .await;
        let (restaged, _, _) = stats(&mut csi, &id, &pod.target).await;
        assert!(
            restaged.total as u64 > 57 * MIB,
            "grown at the stage: {restaged:?}"
        );
        // The node-only path (the external-resizer's trivial resizer records the size in the
        // PV, no ControllerExpandVolume): NodeExpandVolume alone grows the record, the file,
        // the device and the filesystem, online, to the size it asks.
        let node_only = Instant::now();
        let request = csi_nodekit::proto::csi::NodeExpandVolumeRequest {
            volume_id: id.clone(),
            volume_path: pod.target.display().to_string(),
            capacity_range: Some(csi_nodekit::proto::csi::CapacityRange {
                required_bytes: (80 * MIB) as i64,
                limit_bytes: 0,
            }),
            ..Default::default()
        };
        let answer = csi.node.node_expand_volume(request).await;
        let answer = answer.expect("node-only expansion").into_inner();
        let node_only_took = node_only.elapsed();
        assert_eq!(answer.capacity_bytes, (80 * MIB) as i64);
        let (node_grown, _, _) = stats(&mut csi, &id, &pod.target).await;
        assert!(
            node_grown.total as u64 > 73 * MIB,
            "grown online by NodeExpandVolume alone: {node_grown:?}"
        );
        let listed = csi.list().await;
        let recorded = listed.iter().find(|v| v.volume_id == id).expect("listed");
        assert_eq!(recorded.capacity_bytes, (80 * MIB) as i64, "the record too");
        assert!(
            std::fs::metadata(&image).unwrap().blocks() * 512 >= 80 * MIB,
            "the file grown thick"
        );
        csi.unpublish_and_unstage(&id, &pod.target, &pod.staging)
            .await;
        let (code, text) = fsck(&image);
        assert_eq!(code, 0, "after the growth at stage: {text}");
        figure(
            kind,
            format_args!(
                "an image volume of 32 MiB through node-server: CreateVolume {} ms (thick), \
                 stage and publish {} ms (its ext4 grown from 16 MiB), {} bytes usable, {} \
                 inodes; full, then expanded online to 48 MiB in {} ms (Controller and Node \
                 ExpandVolume), {} bytes usable, a writer stopped by ENOSPC after {} MiB in \
                 all; expanded unstaged to 64 MiB and grown at its stage ({} bytes); to \
                 80 MiB by NodeExpandVolume alone (the node-only path) in {} ms, {} bytes \
                 usable; e2fsck -fn clean after each",
                create_took.as_millis(),
                stage_took.as_millis(),
                bytes.total,
                inodes.total,
                expand_took.as_millis(),
                grown.total,
                written / MIB,
                restaged.total,
                node_only_took.as_millis(),
                node_grown.total
            ),
        );
        csi.controller
            .delete_volume(delete_request(&id))
            .await
            .expect("delete");
    });
}
