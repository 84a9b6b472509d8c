//! What the copy engine refuses, and what a failed or killed copy leaves behind: never the
//! final name, never the source touched.

use std::fs;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::process::Command;

use csi_nodekit::linux::copy::{self, CopyError, Options};

use crate::common::scratch_fs::{Kind, ScratchFs};
use crate::common::tree_fixture;

#[test]
#[ignore = "needs root: mounts tmpfs, ext4, XFS and btrfs scratch filesystems"]
fn a_copy_never_replaces_its_destination_nor_starts_from_a_symlink() {
    let fs = ScratchFs::new(Kind::Tmpfs);
    let src = fs.path().join("src");
    fs::create_dir(&src).expect("mkdir");
    fs::write(src.join("new"), b"new").expect("write");
    let dst = fs.path().join("dst");
    fs::create_dir(&dst).expect("mkdir");
    fs::write(dst.join("old"), b"old").expect("write");
    let err =
        copy::copy_tree(&src, &dst, Options::default()).expect_err("copy onto an existing name");
    assert!(
        matches!(err, CopyError::DestinationExists(ref p) if p == &dst),
        "{err}"
    );
    assert_eq!(fs::read(dst.join("old")).expect("read"), b"old");
    assert!(!dst.join("new").exists());

    std::os::unix::fs::symlink(&src, fs.path().join("link")).expect("symlink");
    let err = copy::copy_tree(
        &fs.path().join("link"),
        &fs.path().join("via-link"),
        Options::default(),
    )
    .expect_err("copy a symlink");
    assert!(matches!(err, CopyError::SourceNotADirectory(_)), "{err}");
    let err = copy::copy_file(&src, &fs.path().join("file"), Options::default())
        .expect_err("copy_file of a directory");
    assert!(matches!(err, CopyError::SourceNotARegularFile(_)), "{err}");
    let names: Vec<_> = fs::read_dir(fs.path())
        .expect("read dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names.len(), 3, "nothing but src, dst and link: {names:?}");
}

#[test]
#[ignore = "needs root: mounts tmpfs, ext4, XFS and btrfs scratch filesystems"]
fn a_copy_that_fails_midway_leaves_neither_the_final_nor_a_temporary_name() {
    let big = ScratchFs::new(Kind::Tmpfs);
    let src = big.path().join("src");
    tree_fixture::data_tree(&src);
    // 32 MiB of data into 4 MiB: ENOSPC after a few files.
    let small = ScratchFs::with_options(Kind::Tmpfs, "size=4m");
    let dst = small.path().join("dst");
    let err =
        copy::copy_tree(&src, &dst, Options::default()).expect_err("copy into a full filesystem");
    let CopyError::Io { source, .. } = &err else {
        panic!("expected an I/O error, got {err}")
    };
    assert_eq!(source.raw_os_error(), Some(nix::libc::ENOSPC), "{err}");
    assert_eq!(
        fs::read_dir(small.path()).expect("read dir").count(),
        0,
        "something was left behind"
    );
}

#[test]
#[ignore = "needs root: mounts tmpfs, ext4, XFS and btrfs scratch filesystems"]
fn a_tree_deeper_than_any_path_is_copied_measured_and_removed_whole() {
    // Deeper than PATH_MAX can name and than the descriptors a walk could hold one per level.
    const DEPTH: usize = 20_000;
    let fs = ScratchFs::new(Kind::Tmpfs);
    let src = fs.path().join("src");
    fs::create_dir(&src).expect("mkdir");
    let bottom = tree_fixture::nest(&src, DEPTH);
    let file = format!("/proc/self/fd/{}/f", bottom.as_raw_fd());
    fs::write(&file, b"bottom").expect("write at the bottom");
    drop(bottom);
    let usage = copy::tree_usage(&src).expect("usage of a deep tree");
    assert_eq!(
        usage.inodes,
        DEPTH as u64 + 2,
        "the root, every level and the file"
    );
    let dst = fs.path().join("dst");
    let report = copy::copy_tree(&src, &dst, Options::default()).expect("copy a deep tree");
    assert_eq!(report.directories, DEPTH as u64 + 1, "{report:?}");
    assert_eq!(report.files, 1, "{report:?}");
    let copied = tree_fixture::reach(&dst, DEPTH).expect("the copy is as deep");
    assert_eq!(
        tree_fixture::read_at(copied.as_fd(), "f").as_deref(),
        Some(b"bottom".as_slice())
    );
    drop(copied);
    copy::remove_tree(&dst).expect("remove the copy");
    copy::remove_tree(&src).expect("remove the source");
    assert_eq!(
        fs::read_dir(fs.path()).expect("read dir").count(),
        0,
        "both trees are gone"
    );
}

/// Set in the child that `a_copy_killed_midway_…` starts: "<src>\n<dst>" to copy.
const CHILD: &str = "CSI_NODEKIT_TEST_COPY_CHILD";

#[test]
#[ignore = "needs root: mounts tmpfs, ext4, XFS and btrfs scratch filesystems"]
fn a_copy_killed_midway_leaves_only_a_temporary_name_that_cleanup_removes() {
    if let Ok(job) = std::env::var(CHILD) {
        // The child: this same test, run again by the parent below, copies and is killed.
        let (src, dst) = job.split_once('\n').expect("job");
        copy::copy_tree(Path::new(src), Path::new(dst), Options::default()).expect("copy");
        return;
    }
    let fs = ScratchFs::new(Kind::Tmpfs);
    let src = fs.path().join("src");
    fs::create_dir(&src).expect("mkdir");
    for i in 0..20_000 {
        fs::write(src.join(format!("f{i}")), [i as u8; 512]).expect("write");
    }
    let snapshots = fs.path().join("snapshots");
    fs::create_dir(&snapshots).expect("mkdir");
    let dst = snapshots.join("snap-1");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "storage::copy_safety::a_copy_killed_midway_leaves_only_a_temporary_name_that_cleanup_removes",
        ])
        .args(["--include-ignored", "--test-threads=1"])
        .env(CHILD, format!("{}\n{}", src.display(), dst.display()))
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start the copying child");
    let partial = || {
        fs::read_dir(&snapshots)
            .expect("read dir")
            .map(|e| e.expect("entry").file_name())
            .find(|name| name.to_string_lossy().starts_with(".partial-"))
    };
    // Killed once it has copied something: the temporary tree is there, half full.
    let started = || {
        partial().is_some_and(|name| {
            fs::read_dir(snapshots.join(name)).is_ok_and(|mut d| d.next().is_some())
        })
    };
    let seen = crate::common::wait_until_blocking(std::time::Duration::from_secs(30), started);
    child.kill().expect("kill the child");
    child.wait().expect("reap the child");
    assert!(seen, "the child never started copying");
    assert!(
        !dst.exists(),
        "the copy finished before it was killed, or a crash left the final name"
    );
    let name = partial().expect("the temporary name is left behind");
    let copied = fs::read_dir(snapshots.join(&name))
        .expect("read partial")
        .count();
    assert!(
        copied > 0 && copied < 20_000,
        "killed midway, yet {copied} files were copied"
    );

    let removed = copy::remove_partials(&snapshots).expect("remove partials");
    assert_eq!(removed, vec![name]);
    assert_eq!(fs::read_dir(&snapshots).expect("read dir").count(), 0);
    assert_eq!(
        fs::read_dir(&src).expect("read dir").count(),
        20_000,
        "the source was touched"
    );
}

#[test]
#[ignore = "needs root: mounts tmpfs, ext4, XFS and btrfs scratch filesystems"]
fn a_copy_made_inside_its_own_source_does_not_contain_itself() {
    let fs = ScratchFs::new(Kind::Tmpfs);
    let src = fs.path().join("src");
    fs::create_dir_all(src.join("sub")).expect("mkdir");
    fs::write(src.join("sub/file"), b"data").expect("write");
    let report = copy::copy_tree(&src, &src.join("sub/copy"), Options::default()).expect("copy");
    assert_eq!((report.files, report.directories), (1, 2), "{report:?}");
    let mut names: Vec<_> = tree_fixture::walk(&src.join("sub/copy"));
    names.sort();
    assert_eq!(names, ["", "sub", "sub/file"].map(PathBuf::from));
}
