//! The loop device layer with real loop devices: attach, find, detach, capacity, read-only,
//! direct I/O, concurrency, and the devices that are not ours. Every device a test makes is
//! detached by a guard, even when the test fails.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use csi_nodekit::linux::loopdev::{
    self, AttachOptions, LoopDevice, LoopError, create_backing_file, grow_backing_file,
};

use crate::common::scratch_fs::{Kind, ScratchFs};

pub const MIB: u64 = 1 << 20;

/// Detaches, on drop, every device it was told about: ours through the layer, others (made by
/// `losetup` to play the administrator) with `losetup -d`.
#[derive(Default)]
pub struct Devices {
    pub ours: Vec<(LoopDevice, PathBuf)>,
    foreign: Vec<String>,
}

impl Devices {
    pub fn attach(&mut self, file: &Path, options: AttachOptions) -> loopdev::Status {
        let status = loopdev::attach(file, options).expect("attach");
        self.ours.push((status.device, file.to_owned()));
        status
    }

    /// A device someone else attached (`losetup`, as an administrator would).
    pub fn losetup(&mut self, file: &Path) -> LoopDevice {
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(file)
            .output()
            .expect("run losetup");
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = String::from_utf8(out.stdout)
            .expect("UTF-8")
            .trim()
            .to_owned();
        self.foreign.push(path.clone());
        LoopDevice(
            path.trim_start_matches("/dev/loop")
                .parse()
                .expect("a loop device"),
        )
    }
}

impl Drop for Devices {
    fn drop(&mut self) {
        for (device, file) in &self.ours {
            // Never `losetup -d` by number after a refusal: a device no longer ours may be
            // another test's by now (that fallback once detached a neighbour test's device).
            if let Err(e) = loopdev::detach(*device, file) {
                eprintln!("cleanup: {e}");
            }
        }
        for path in &self.foreign {
            let _ = Command::new("losetup").args(["-d", path]).status();
        }
    }
}

pub fn backing(fs: &ScratchFs, name: &str, size: u64) -> PathBuf {
    let path = fs.path().join(name);
    assert!(create_backing_file(&path, size).expect("create backing file"));
    path
}

pub fn write_device(device: LoopDevice, at: u64, data: &[u8]) -> std::io::Result<()> {
    let dev = OpenOptions::new().write(true).open(device.path())?;
    dev.write_all_at(data, at)?;
    dev.sync_all()
}

pub fn read_file(path: &Path, at: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    fs::File::open(path)
        .expect("open")
        .read_exact_at(&mut buf, at)
        .expect("read");
    buf
}

#[test]
#[ignore = "needs root: real loop devices and scratch filesystems"]
fn an_attached_file_shows_its_size_and_writes_through_the_device_land_in_the_file() {
    let fs = ScratchFs::new(Kind::Ext4);
    let file = backing(&fs, "vol", 64 * MIB);
    let mut devices = Devices::default();
    let status = devices.attach(&file, AttachOptions::default());
    assert!(
        !status.read_only && !status.autoclear && !status.partscan,
        "{status:?}"
    );
    assert_eq!(
        status.backing,
        loopdev::Identity::of(&file).expect("identity")
    );
    assert!(status.file_name.starts_with(loopdev::TAG), "{status:?}");
    assert_eq!(loopdev::size(status.device).expect("size"), 64 * MIB);
    let data = crate::common::tree_fixture::noise(4096, 9);
    write_device(status.device, 3 * MIB, &data).expect("write through the device");
    assert_eq!(read_file(&file, 3 * MIB, 4096), data);
    loopdev::detach(status.device, &file).expect("detach");
    assert_eq!(
        loopdev::status(status.device).expect("status"),
        None,
        "still bound"
    );
}

#[test]
#[ignore = "needs root: real loop devices and scratch filesystems"]
fn a_file_attached_once_is_found_again_and_not_attached_twice() {
    let fs = ScratchFs::new(Kind::Tmpfs);
    let file = backing(&fs, "vol", 16 * MIB);
    let mut devices = Devices::default();
    let (first, attached) =
        loopdev::find_or_attach(&file, AttachOptions::default()).expect("attach");
    devices.ours.push((first.device, file.clone()));
    assert!(attached);
    let (again, attached) = loopdev::find_or_attach(&file, AttachOptions::default()).expect("find");
    assert!(!attached, "attached a second device");
    assert_eq!(again, first);
    let found = loopdev::find(&file).expect("find");
    assert_eq!((found.ours, found.foreign), (vec![first], vec![]));
}

#[test]
#[ignore = "needs root: real loop devices and scratch filesystems"]
fn after_a_detach_as_after_a_reboot_the_file_is_attached_again_with_its_data() {
    let fs = ScratchFs::new(Kind::Ext4);
    let file = backing(&fs, "vol", 16 * MIB);
    let mut devices = Devices::default();
    let (status, _) = loopdev::find_or_attach(&file, AttachOptions::default()).expect("attach");
    devices.ours.push((status.device, file.clone()));
    write_device(status.device, 0, b"persisted").expect("write");
    loopdev::detach(status.device, &file).expect("detach");
    devices.ours.clear();
    // Detaching it again does nothing: unbound, it answers OK; bound by now to another file
    // (another test's, attached in between), it is refused (and so left alone).
    match loopdev::detach(status.device, &file) {
        Ok(()) | Err(LoopError::NotOurs { .. }) => {}
        Err(e) => panic!("detaching a detached device: {e}"),
    }
    assert_eq!(
        loopdev::find(&file).expect("find"),
        loopdev::Found::default()
    );
    let (again, attached) =
        loopdev::find_or_attach(&file, AttachOptions::default()).expect("attach again");
    devices.ours.push((again.device, file.clone()));
    assert!(attached);
    let mut buf = [0u8; 9];
    fs::File::open(again.device.path())
        .expect("open device")
        .read_exact_at(&mut buf, 0)
        .expect("read");
    assert_eq!(&buf, b"persisted");
}

#[test]
#[ignore = "needs root: real loop devices and scratch filesystems"]
fn a_device_of_a_same_named_file_or_of_someone_else_is_never_ours_nor_detached() {
    let fs = ScratchFs::new(Kind::Tmpfs);
    let mut devices = Devices::default();
    // An old file attached by an administrator, deleted, and a new file under its name:
    // sysfs shows the same path (with " (deleted)"), but it is another inode.
    let file = backing(&fs, "vol", 16 * MIB);
    let stale = devices.losetup(&file);
    fs::remove_file(&file).expect("remove");
    create_backing_file(&file, 16 * MIB).expect("re-create");
    assert_eq!(
        loopdev::find(&file).expect("find"),
        loopdev::Found::default()
    );
    let err = loopdev::detach(stale, &file).expect_err("detach someone else's device");
    assert!(matches!(err, LoopError::NotOurs { .. }), "{err}");
    assert!(
        loopdev::status(stale).expect("status").is_some(),
        "the stale device was detached"
    );

    // Our very file, attached by someone else: reported, refused, left alone.
    let theirs = devices.losetup(&file);
    let found = loopdev::find(&file).expect("find");
    assert!(found.ours.is_empty());
    assert_eq!(
        found.foreign.iter().map(|s| s.device).collect::<Vec<_>>(),
        vec![theirs]
    );
    let err =
        loopdev::find_or_attach(&file, AttachOptions::default()).expect_err("a second writer");
    assert!(matches!(err, LoopError::ForeignDevice { .. }), "{err}");
    let err = loopdev::detach(theirs, &file).expect_err("detach someone else's device");
    assert!(matches!(err, LoopError::NotOurs { .. }), "{err}");
    let status = loopdev::status(theirs)
        .expect("status")
        .expect("still bound");
    assert!(
        !status.autoclear,
        "someone else's device was marked for detaching"
    );
}

fn direct_io_on(kind: Kind) -> bool {
    let fs = ScratchFs::new(kind);
    let file = backing(&fs, "vol", 16 * MIB);
    let mut devices = Devices::default();
    let options = AttachOptions {
        direct_io: true,
        ..AttachOptions::default()
    };
    let status = devices.attach(&file, options);
    write_device(status.device, MIB, b"direct").expect("write");
    assert_eq!(read_file(&file, MIB, 6), b"direct");
    status.direct_io
}

#[test]
#[ignore = "needs root: real loop devices and scratch filesystems"]
fn direct_io_is_used_where_the_backing_filesystem_can_and_buffered_io_elsewhere() {
    assert!(direct_io_on(Kind::Ext4), "ext4");
    assert!(direct_io_on(Kind::Xfs), "XFS");
    // tmpfs takes O_DIRECT since Linux 6.6; attached either way.
    direct_io_on(Kind::Tmpfs);
    // ramfs cannot: LOOP_CONFIGURE says EINVAL, and the attach falls back to buffered I/O.
    assert!(!direct_io_on(Kind::Ramfs), "ramfs");
}

#[test]
#[ignore = "needs root: real loop devices and scratch filesystems"]
fn a_grown_file_shows_its_new_size_once_the_capacity_is_refreshed() {
    let fs = ScratchFs::new(Kind::Ext4);
    let file = backing(&fs, "vol", 32 * MIB);
    let mut devices = Devices::default();
    let status = devices.attach(&file, AttachOptions::default());
    assert_eq!(grow_backing_file(&file, 96 * MIB).expect("grow"), 32 * MIB);
    assert_eq!(
        loopdev::size(status.device).expect("size"),
        32 * MIB,
        "the kernel does not look by itself"
    );
    assert_eq!(
        loopdev::refresh_capacity(status.device, &file).expect("refresh"),
        96 * MIB
    );
    assert_eq!(loopdev::size(status.device).expect("size"), 96 * MIB);
    write_device(status.device, 95 * MIB, b"tail").expect("write in the new part");
    assert_eq!(read_file(&file, 95 * MIB, 4), b"tail");
    let err = grow_backing_file(&file, 64 * MIB).expect_err("shrink");
    assert!(matches!(err, LoopError::Shrink { .. }), "{err}");
}

#[test]
#[ignore = "needs root: real loop devices and scratch filesystems"]
fn a_read_only_attachment_refuses_writes() {
    let fs = ScratchFs::new(Kind::Tmpfs);
    let file = backing(&fs, "vol", 16 * MIB);
    let mut devices = Devices::default();
    let ro = AttachOptions {
        read_only: true,
        ..AttachOptions::default()
    };
    let status = devices.attach(&file, ro);
    assert!(status.read_only);
    assert!(
        write_device(status.device, 0, b"nope").is_err(),
        "a write went through"
    );
    assert_eq!(read_file(&file, 0, 4), [0; 4]);
    // A writable one for the same file is another device; the read-only one is found as such.
    let (rw, attached) = loopdev::find_or_attach(&file, AttachOptions::default()).expect("rw");
    devices.ours.push((rw.device, file.clone()));
    assert!(attached && !rw.read_only && rw.device != status.device);
    let (found, attached) = loopdev::find_or_attach(&file, ro).expect("ro");
    assert!(!attached);
    assert_eq!(found.device, status.device);
}

#[test]
#[ignore = "needs root: real loop devices and scratch filesystems"]
fn concurrent_attaches_of_different_files_get_different_devices() {
    let fs = ScratchFs::new(Kind::Tmpfs);
    let files: Vec<PathBuf> = (0..8)
        .map(|i| backing(&fs, &format!("vol{i}"), 8 * MIB))
        .collect();
    let mut devices = Devices::default();
    let statuses: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = files
            .iter()
            .map(|file| scope.spawn(move || loopdev::attach(file, AttachOptions::default())))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    for (status, file) in statuses.iter().zip(&files) {
        match status {
            Ok(status) => devices.ours.push((status.device, file.clone())),
            Err(e) => panic!("attach {}: {e}", file.display()),
        }
    }
    let mut numbers: Vec<_> = devices.ours.iter().map(|(d, _)| d.0).collect();
    numbers.sort_unstable();
    numbers.dedup();
    assert_eq!(numbers.len(), 8, "devices shared: {numbers:?}");
    for file in &files {
        assert_eq!(
            loopdev::find(file).expect("find").ours.len(),
            1,
            "{}",
            file.display()
        );
    }
}
