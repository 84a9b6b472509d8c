//! Inside the VM: an image volume's ext4 grown online from the template by the kernel
//! (`EXT4_IOC_RESIZE_FS` needs CAP_SYS_RESOURCE, which the build machines' root lacks). The
//! image lies on the case's filesystem (XFS or ext4) as a volume's image would on the state
//! directory's; every size is checked by `e2fsck -fn`.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use csi_nodekit::linux::ext4_image::{self, BLOCK_BYTES};
use csi_nodekit::linux::loopdev::{self, AttachOptions};
use csi_nodekit::linux::quota::FsKind;
use nix::mount::{MsFlags, mount, umount};

use super::cases::{MIB, figure};
use super::fixtures::{Prep, TestFs};

const GIB: u64 = 1 << 30;

fn fsck(device: &Path) -> (i32, String) {
    let out = Command::new("e2fsck")
        .arg("-fn")
        .arg(device)
        .output()
        .expect("run e2fsck");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

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
