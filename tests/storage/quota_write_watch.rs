//! The write watch the quota check sets escaped files back with as they are written, on a real
//! XFS (which keeps project IDs without quota enforcement) and the kernel's own fanotify.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};

use csi_nodekit::linux::quota::escape_walk;
use csi_nodekit::linux::quota::sys;
use csi_nodekit::linux::quota::write_watch::WriteWatch;

use super::quota_remake::set_project;
use crate::common::scratch_fs::{Kind, ScratchFs};

const WANT: u32 = 7;

fn project_of(path: &Path) -> u32 {
    let file = std::fs::File::open(path).unwrap();
    sys::get_fsxattr(file.as_fd()).unwrap().projid
}

/// What the watch reports after a pause: each inode's path, and the inodes themselves (opened
/// again here, `O_PATH` through `/proc`, as they are only lent).
fn written_paths(watch: &mut WriteWatch) -> (Vec<std::os::fd::OwnedFd>, Vec<PathBuf>) {
    std::thread::sleep(std::time::Duration::from_millis(50));
    let (mut inodes, mut paths) = (Vec::new(), Vec::new());
    let overflowed = watch
        .written(&mut |fd| {
            let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
            paths.push(std::fs::read_link(&link).unwrap());
            inodes.push(fd.try_clone_to_owned().unwrap());
        })
        .expect("read the watch");
    assert!(!overflowed);
    (inodes, paths)
}

#[test]
#[ignore = "needs root: mounts an XFS on a loop device and watches it with fanotify"]
fn a_file_moved_out_of_its_project_is_reported_when_written_and_set_back_by_its_descriptor() {
    let fs = ScratchFs::new(Kind::Xfs);
    let vol = fs.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    set_project(&vol, WANT, true);
    let file = vol.join("f");
    let mut out = std::fs::File::create(&file).unwrap();
    let other = fs.path().join("elsewhere");
    let mut watch = WriteWatch::new(fs.path()).expect("watch the filesystem");

    // Moving it out notifies nothing: the walks stay for what is never written.
    set_project(&file, 0, false);
    let (_, paths) = written_paths(&mut watch);
    assert!(paths.is_empty(), "{paths:?}");

    // Written, many times: reported, about once.
    for _ in 0..1_000 {
        out.write_all(&[7; 4096]).unwrap();
    }
    std::fs::write(&other, b"x").unwrap();
    let (written, paths) = written_paths(&mut watch);
    assert!(paths.contains(&file), "{paths:?}");
    assert!(paths.contains(&other), "the whole filesystem: {paths:?}");
    assert!(paths.len() <= 4, "a thousand writes merge: {paths:?}");
    let at = paths.iter().position(|p| p == &file).unwrap();

    let tally = escape_walk::check_file(written[at].as_fd(), WANT, None).expect("check");

    assert_eq!((tally.other_project, tally.repaired), (1, 1), "{tally:?}");
    assert!(tally.bytes >= 4096 * 1_000, "its blocks: {tally:?}");
    assert_eq!(project_of(&file), WANT, "set back");
    // Unlinked while the pod still writes: still reported, and still set back.
    set_project(&file, 0, false);
    std::fs::remove_file(&file).unwrap();
    out.write_all(b"more").unwrap();
    let (written, paths) = written_paths(&mut watch);
    let at = paths
        .iter()
        .position(|p| p.to_string_lossy().ends_with("/vol/f (deleted)"))
        .unwrap_or_else(|| panic!("{paths:?}"));
    let tally = escape_walk::check_file(written[at].as_fd(), WANT, None).expect("check");
    assert_eq!(tally.repaired, 1, "{tally:?}");
    assert_eq!(
        sys::get_fsxattr(out.as_fd()).unwrap().projid,
        WANT,
        "the open file is back in the project"
    );
}
