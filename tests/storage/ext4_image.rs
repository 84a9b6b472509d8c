//! Ext4 filesystems made without mkfs (`linux::ext4_image`): the template written into an
//! image on a real XFS, attached to a real loop device and mounted. `e2fsck -fn` judges every
//! filesystem. Growing needs CAP_SYS_RESOURCE, which this machine's root lacks: the quota VM
//! grows them (`quota_vm::grown`).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use csi_nodekit::linux::ext4_image::{self, TEMPLATE_BYTES};
use csi_nodekit::linux::loopdev::AttachOptions;
use nix::mount::{MsFlags, mount, umount};

use super::loop_devices::Devices;
use crate::common::scratch_fs::{Kind, ScratchFs, fsck};

/// The superblock's UUID (`s_uuid`, 16 bytes at 0x68 of the superblock at byte 1024).
fn uuid_of(image: &Path) -> [u8; 16] {
    use std::os::unix::fs::FileExt;
    let mut uuid = [0; 16];
    File::open(image)
        .unwrap()
        .read_exact_at(&mut uuid, 1024 + 0x68)
        .unwrap();
    uuid
}

fn mount_ext4(device: &Path, at: &Path) {
    mount(
        Some(device),
        at,
        Some("ext4"),
        MsFlags::empty(),
        None::<&str>,
    )
    .unwrap_or_else(|e| panic!("mount {} on {}: {e}", device.display(), at.display()));
}

/// The template written into an image on `host`, attached to a loop device (direct I/O):
/// the devices' guard, the image and the device node.
fn template_on_a_loop_device(host: &ScratchFs) -> (Devices, PathBuf, PathBuf) {
    let image = host.path().join("volume.img");
    ext4_image::write_template(&File::create_new(&image).unwrap()).unwrap();
    let mut devices = Devices::default();
    let options = AttachOptions {
        read_only: false,
        direct_io: true,
        block_size: 0,
    };
    let device = devices.attach(&image, options).device.path();
    (devices, image, device)
}

#[ignore = "needs root: loop devices, mounts and e2fsck (e2fsprogs)"]
#[test]
fn an_image_from_the_template_checks_clean_mounts_keeps_files_and_takes_a_uuid_of_its_own() {
    let host = ScratchFs::new(Kind::Xfs);
    let (_devices, image, device) = template_on_a_loop_device(&host);
    let (code, text) = fsck(&image);
    assert_eq!(code, 0, "the template as written:\n{text}");
    assert!(text.contains("11/8192 files"), "{text}");
    let mnt = tempfile::tempdir().unwrap();
    mount_ext4(&device, mnt.path());
    let df = nix::sys::statvfs::statvfs(mnt.path()).unwrap();
    let total = df.blocks() as u64 * df.fragment_size() as u64;
    // What the pod sees of the smallest volume: 16 MiB less the 4 MiB journal and the
    // 2 MiB inode table (8,192 inodes of 256 bytes), less the bitmaps and descriptors.
    let overhead = (4 << 20) + 8192 * 256;
    assert!(
        total <= TEMPLATE_BYTES - overhead && total > TEMPLATE_BYTES - overhead - (256 << 10),
        "{total} bytes for the pod of {TEMPLATE_BYTES}"
    );
    std::fs::write(mnt.path().join("kept"), b"written before the unmount").unwrap();
    let root = File::open(mnt.path()).unwrap();
    let uuid = *b"volume-uuid-0001";
    ext4_image::set_uuid(&root, uuid).expect("EXT4_IOC_SETFSUUID");
    drop(root);
    umount(mnt.path()).unwrap();
    let (code, text) = fsck(&device);
    assert_eq!(code, 0, "after a mount, a file and a new UUID:\n{text}");
    assert_eq!(uuid_of(&image), uuid);
    mount_ext4(&device, mnt.path());
    assert_eq!(
        std::fs::read(mnt.path().join("kept")).unwrap(),
        b"written before the unmount"
    );
    umount(mnt.path()).unwrap();
}

#[ignore = "needs root: loop devices and mounts"]
#[test]
fn a_frozen_image_filesystem_holds_its_writers_until_thawed() {
    let host = ScratchFs::new(Kind::Xfs);
    let (_devices, _image, device) = template_on_a_loop_device(&host);
    let mnt = tempfile::tempdir().unwrap();
    mount_ext4(&device, mnt.path());
    let root = File::open(mnt.path()).unwrap();
    ext4_image::freeze(&root).expect("FIFREEZE");
    let file = mnt.path().join("written while frozen");
    let writer = std::thread::spawn(move || std::fs::write(file, b"after the thaw"));
    std::thread::sleep(Duration::from_millis(500));
    let held = !writer.is_finished();
    ext4_image::thaw(&root).expect("FITHAW");
    writer
        .join()
        .unwrap()
        .expect("the write goes on after the thaw");
    assert!(held, "the write finished while the filesystem was frozen");
    drop(root);
    umount(mnt.path()).unwrap();
    assert_eq!(fsck(&device).0, 0);
}

#[test]
fn the_committed_template_is_what_the_script_makes_with_e2fsprogs_1_47_0() {
    let version = Command::new("mke2fs")
        .arg("-V")
        .output()
        .expect("run mke2fs (e2fsprogs)");
    let version = String::from_utf8_lossy(&version.stderr).into_owned();
    assert!(
        version.starts_with("mke2fs 1.47.0"),
        "the template was made with e2fsprogs 1.47.0 (Debian 12); this machine has {version:?}: \
         run scripts/make-ext4-template.sh and review the difference"
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile::tempdir().unwrap();
    let made = out.path().join("template.bin");
    let status = Command::new("bash")
        .arg(root.join("scripts/make-ext4-template.sh"))
        .arg(&made)
        .output()
        .expect("run the script");
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let committed = std::fs::read(root.join("src/linux/ext4_image/template.bin")).unwrap();
    assert!(
        std::fs::read(&made).unwrap() == committed,
        "the committed template differs"
    );
}
