//! What the loop device layer must never do: detach a device in use (mounted or open), or
//! depend on `/dev` having the node, as in a container's own `/dev`.

use std::path::Path;
use std::process::Command;

use csi_nodekit::linux::loopdev::{self, AttachOptions, LoopError};

use super::loop_devices::{Devices, MIB, backing};
use crate::common::scratch_fs::{Kind, ScratchFs, run};

#[test]
#[ignore = "needs root: real loop devices and scratch filesystems"]
fn a_mounted_or_open_device_is_not_detached_and_not_left_to_autoclear() {
    let fs = ScratchFs::new(Kind::Tmpfs);
    let file = backing(&fs, "vol", 64 * MIB);
    let mut devices = Devices::default();
    let status = devices.attach(&file, AttachOptions::default());
    let dev = status.device.path();
    let dev = dev.to_str().expect("UTF-8");
    run("mkfs.ext4", &["-q", "-F", dev]);
    let mnt = fs.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    run("mount", &[dev, mnt.to_str().expect("UTF-8")]);
    let err = loopdev::detach(status.device, &file).expect_err("detach a mounted device");
    nix::mount::umount(&mnt).expect("unmount");
    assert!(matches!(err, LoopError::Busy { .. }), "{err}");
    let after = loopdev::status(status.device)
        .expect("status")
        .expect("still bound");
    assert!(!after.autoclear, "left to vanish at its last close");

    // Held open by a process (a pod's): LOOP_CLR_FD would only set autoclear.
    let holder = std::fs::File::open(status.device.path()).expect("open the device");
    let err = loopdev::detach(status.device, &file).expect_err("detach an open device");
    assert!(matches!(err, LoopError::Busy { .. }), "{err}");
    let after = loopdev::status(status.device)
        .expect("status")
        .expect("still bound");
    assert!(!after.autoclear, "left to vanish when the holder closes it");
    drop(holder);
    assert!(
        loopdev::status(status.device).expect("status").is_some(),
        "vanished at the last close"
    );
    loopdev::detach(status.device, &file).expect("detach once free");
    assert_eq!(loopdev::status(status.device).expect("status"), None);
}

/// Set in the child of the test below: the backing file to attach in a `/dev` of its own.
const CHILD: &str = "CSI_NODEKIT_TEST_LOOP_CHILD";

#[test]
#[ignore = "needs root: real loop devices and scratch filesystems"]
fn a_missing_device_node_is_made_as_in_a_container_with_its_own_dev() {
    if let Ok(file) = std::env::var(CHILD) {
        // The child, in a mount namespace of its own (unshare, below): an empty /dev.
        run("mount", &["-t", "tmpfs", "dev", "/dev"]);
        let file = Path::new(&file);
        let status = loopdev::attach(file, AttachOptions::default()).expect("attach");
        let node = std::fs::symlink_metadata(status.device.path());
        let size = loopdev::size(status.device);
        loopdev::detach(status.device, file).expect("detach");
        let node = node.expect("the node was made");
        assert!(std::os::unix::fs::FileTypeExt::is_block_device(
            &node.file_type()
        ));
        assert_eq!(size.expect("size"), 16 * MIB);
        return;
    }
    let fs = ScratchFs::new(Kind::Tmpfs);
    let file = backing(&fs, "vol", 16 * MIB);
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private"])
        .arg(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "storage::loop_device_safety::a_missing_device_node_is_made_as_in_a_container_with_its_own_dev",
        ])
        .args(["--include-ignored", "--test-threads=1", "--nocapture"])
        .env(CHILD, &file)
        .output()
        .expect("run the child");
    let left = loopdev::find(&file).expect("find");
    // Whatever the child left, the guard detaches.
    let mut devices = Devices::default();
    devices
        .ours
        .extend(left.ours.iter().map(|s| (s.device, file.clone())));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "child failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(left, loopdev::Found::default(), "the child left a device");
}
