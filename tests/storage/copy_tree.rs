//! The copy engine on real filesystems, mounted in the test's private mount namespace: tmpfs,
//! and on a loop device ext4 (no reflinks: a sparse copy), XFS and btrfs (reflinks).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use csi_nodekit::linux::copy::{self, CopyError, Options, SkipReason};

use crate::common::scratch_fs::{Kind, ScratchFs, run};
use crate::common::tree_fixture::{self, SPARSE_LEN};

fn copies_everything_on(kind: Kind) {
    let fs = ScratchFs::new(kind);
    let src = fs.path().join("src");
    let left_out = tree_fixture::build(&src);
    let dst = fs.path().join("dst");
    let report = copy::copy_tree(&src, &dst, Options::default()).expect("copy");

    tree_fixture::assert_same(&src, &dst, &left_out);
    // file.txt (three names), empty, big, sparse.img, the odd name, bottom.
    assert_eq!(report.files, 6, "{report:?}");
    assert_eq!(
        report.hard_links, 3,
        "two more names of file.txt, one of link-rel"
    );
    assert_eq!(report.symlinks, 3);
    assert_eq!(report.special_files, 3, "fifo, char and block device");
    // root, a, a/sticky, a/sgid, deep and its 20 levels.
    assert_eq!(report.directories, 25);
    assert_eq!(
        report.skipped,
        vec![copy::Skipped {
            path: "sock".into(),
            reason: SkipReason::Socket
        }]
    );
    let data = (1u64 << 20) * 2;
    assert_eq!(report.bytes, 14 + (3 << 20) + SPARSE_LEN + 3 + 6);
    if kind.reflinks() {
        assert!(report.used_reflinks());
        assert_eq!(report.bytes_reflinked, report.bytes);
        assert_eq!(report.bytes_written, 0);
    } else {
        assert!(!report.used_reflinks());
        assert_eq!(report.bytes_reflinked, 0);
        // Only the data: the sparse file's 62 MiB of holes are not written.
        assert_eq!(report.bytes_written, 14 + (3 << 20) + data + 3 + 6);
    }
    let sparse = fs::metadata(dst.join("sparse.img")).expect("stat");
    assert_eq!(sparse.len(), SPARSE_LEN);
    assert!(
        sparse.blocks() * 512 < 4 << 20,
        "holes filled: {} blocks",
        sparse.blocks()
    );
    // The symlink to /etc was copied as a link, not followed.
    assert_eq!(
        fs::read_link(dst.join("link-out")).expect("readlink"),
        Path::new("/etc")
    );
}

#[test]
#[ignore = "needs root: mounts tmpfs, ext4, XFS and btrfs scratch filesystems"]
fn every_kind_of_entry_survives_a_copy_on_tmpfs() {
    copies_everything_on(Kind::Tmpfs);
}

#[test]
#[ignore = "needs root: mounts tmpfs, ext4, XFS and btrfs scratch filesystems"]
fn every_kind_of_entry_survives_a_copy_on_ext4() {
    copies_everything_on(Kind::Ext4);
}

#[test]
#[ignore = "needs root: mounts tmpfs, ext4, XFS and btrfs scratch filesystems"]
fn every_kind_of_entry_survives_a_reflink_copy_on_xfs() {
    copies_everything_on(Kind::Xfs);
}

#[test]
#[ignore = "needs root: mounts tmpfs, ext4, XFS and btrfs scratch filesystems"]
fn every_kind_of_entry_survives_a_reflink_copy_on_btrfs() {
    copies_everything_on(Kind::Btrfs);
}

/// Whether `filefrag -v` shows every extent of `path` as shared.
fn all_extents_shared(path: &Path) -> bool {
    let out = Command::new("filefrag")
        .arg("-v")
        .arg(path)
        .output()
        .expect("run filefrag");
    let text = String::from_utf8_lossy(&out.stdout);
    let extents: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.trim_start()
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
                && l.contains(':')
        })
        .collect();
    !extents.is_empty() && extents.iter().all(|l| l.contains("shared"))
}

fn reflinks_share_space_on(kind: Kind) {
    let fs = ScratchFs::new(kind);
    let src = fs.path().join("src");
    let bytes = tree_fixture::data_tree(&src);
    let before = fs.free_bytes();
    let report = copy::copy_tree(&src, &fs.path().join("dst"), Options::default()).expect("copy");
    let used = before.saturating_sub(fs.free_bytes());
    assert_eq!(report.bytes_reflinked, bytes);
    assert_eq!(report.files_reflinked, 32);
    assert!(
        used < bytes / 8,
        "a reflink copy of {bytes} bytes used {used}"
    );
    assert!(
        all_extents_shared(&fs.path().join("dst/f7")),
        "FIEMAP does not show shared extents"
    );

    let before = fs.free_bytes();
    let report =
        copy::copy_tree(&src, &fs.path().join("plain"), Options { reflink: false }).expect("copy");
    let used = before.saturating_sub(fs.free_bytes());
    assert!(!report.used_reflinks());
    assert_eq!(report.bytes_written, bytes);
    assert!(
        used >= bytes,
        "a plain copy of {bytes} bytes used only {used}"
    );
    assert!(
        !all_extents_shared(&fs.path().join("plain/f7")),
        "reflink: false still shared extents"
    );
}

#[test]
#[ignore = "needs root: mounts tmpfs, ext4, XFS and btrfs scratch filesystems"]
fn on_xfs_a_copy_shares_extents_and_costs_no_space_unless_told_not_to() {
    reflinks_share_space_on(Kind::Xfs);
}

#[test]
#[ignore = "needs root: mounts tmpfs, ext4, XFS and btrfs scratch filesystems"]
fn on_btrfs_a_copy_shares_extents_and_costs_no_space_unless_told_not_to() {
    reflinks_share_space_on(Kind::Btrfs);
}

#[test]
#[ignore = "needs root: mounts tmpfs, ext4, XFS and btrfs scratch filesystems"]
fn on_ext4_a_copy_costs_the_data_and_not_the_holes() {
    let fs = ScratchFs::new(Kind::Ext4);
    let src = fs.path().join("src");
    let bytes = tree_fixture::data_tree(&src);
    let sparse = fs::File::create(src.join("sparse")).expect("create");
    sparse.set_len(1 << 30).expect("size");
    let before = fs.free_bytes();
    let report = copy::copy_tree(&src, &fs.path().join("dst"), Options::default()).expect("copy");
    let used = before.saturating_sub(fs.free_bytes());
    assert!(!report.used_reflinks());
    assert_eq!(report.bytes, bytes + (1 << 30));
    assert_eq!(report.bytes_written, bytes);
    assert!(
        used >= bytes && used < bytes + (4 << 20),
        "copying {bytes} bytes of data used {used}"
    );
}

#[test]
#[ignore = "needs root: mounts tmpfs, ext4, XFS and btrfs scratch filesystems"]
fn mount_points_inside_the_tree_are_reported_and_not_copied_through() {
    let fs = ScratchFs::new(Kind::Tmpfs);
    let src = fs.path().join("src");
    fs::create_dir_all(src.join("other-fs")).expect("mkdir");
    fs::create_dir_all(src.join("bind")).expect("mkdir");
    fs::create_dir_all(fs.path().join("elsewhere")).expect("mkdir");
    fs::write(fs.path().join("elsewhere/secret"), b"not in the volume").expect("write");
    fs::write(src.join("kept"), b"kept").expect("write");
    let other = src.join("other-fs");
    run(
        "mount",
        &["-t", "tmpfs", "inner", other.to_str().expect("UTF-8")],
    );
    fs::write(other.join("inner-file"), b"on another fs").expect("write");
    // A bind mount of the same filesystem: same st_dev, another mount.
    let (elsewhere, bind) = (fs.path().join("elsewhere"), src.join("bind"));
    run(
        "mount",
        &[
            "--bind",
            elsewhere.to_str().expect("UTF-8"),
            bind.to_str().expect("UTF-8"),
        ],
    );
    let dst = fs.path().join("dst");
    let report = copy::copy_tree(&src, &dst, Options::default());
    for point in [&bind, &other] {
        nix::mount::umount(point.as_path()).expect("unmount");
    }
    let report = report.expect("copy");
    let mut skipped: Vec<_> = report
        .skipped
        .iter()
        .map(|s| (s.path.clone(), s.reason.clone()))
        .collect();
    skipped.sort();
    assert_eq!(
        skipped,
        vec![
            (PathBuf::from("bind"), SkipReason::MountPoint),
            (PathBuf::from("other-fs"), SkipReason::MountPoint)
        ]
    );
    assert_eq!(fs::read(dst.join("kept")).expect("read"), b"kept");
    assert!(!dst.join("bind").exists() && !dst.join("other-fs").exists());
}

#[test]
#[ignore = "needs root: mounts tmpfs, ext4, XFS and btrfs scratch filesystems"]
fn copying_does_not_move_the_sources_atimes() {
    let fs = ScratchFs::with_options(Kind::Ext4, "strictatime");
    let src = fs.path().join("src");
    fs::create_dir_all(src.join("dir")).expect("mkdir");
    fs::write(src.join("dir/file"), b"data").expect("write");
    let old = nix::sys::time::TimeSpec::new(1_000_000_000, 0);
    for path in [src.join("dir/file"), src.join("dir"), src.clone()] {
        nix::sys::stat::utimensat(
            nix::fcntl::AT_FDCWD,
            &path,
            &old,
            &old,
            nix::sys::stat::UtimensatFlags::NoFollowSymlink,
        )
        .expect("set times");
    }
    copy::copy_tree(&src, &fs.path().join("dst"), Options::default()).expect("copy");
    for path in [src.join("dir/file"), src.join("dir"), src.clone()] {
        assert_eq!(
            fs::symlink_metadata(&path).expect("stat").atime(),
            1_000_000_000,
            "{} atime moved",
            path.display()
        );
    }
}

fn copy_file_keeps_a_sparse_image_on(kind: Kind) {
    let fs = ScratchFs::new(kind);
    let src = fs.path().join("volume.img");
    let file = fs::File::create(&src).expect("create");
    file.set_len(1 << 30).expect("size");
    use std::os::unix::fs::FileExt;
    for (i, at) in [0u64, 300 << 20, (1 << 30) - (1 << 20)]
        .into_iter()
        .enumerate()
    {
        file.write_all_at(&tree_fixture::noise(1 << 20, i as u64), at)
            .expect("write");
    }
    drop(file);
    let dst = fs.path().join("snapshot.img");
    let report = copy::copy_file(&src, &dst, Options::default()).expect("copy");
    assert_eq!(report.bytes, 1 << 30);
    assert_eq!(report.used_reflinks(), kind.reflinks());
    if !kind.reflinks() {
        assert_eq!(report.bytes_written, 3 << 20);
    }
    let (a, b) = (
        fs::metadata(&src).expect("stat"),
        fs::metadata(&dst).expect("stat"),
    );
    assert_eq!(b.len(), 1 << 30);
    assert!(
        b.blocks() * 512 <= (3 << 20) + (1 << 20),
        "holes filled: {} blocks",
        b.blocks()
    );
    assert_eq!(
        (b.mode(), b.uid(), b.mtime(), b.mtime_nsec()),
        (a.mode(), a.uid(), a.mtime(), a.mtime_nsec())
    );
    assert!(
        fs::read(&src).expect("read") == fs::read(&dst).expect("read"),
        "content differs"
    );
    let err =
        copy::copy_file(&src, &dst, Options::default()).expect_err("copy onto an existing file");
    assert!(matches!(err, CopyError::DestinationExists(_)), "{err}");
}

#[test]
#[ignore = "needs root: mounts tmpfs, ext4, XFS and btrfs scratch filesystems"]
fn copy_file_keeps_holes_of_a_block_image_on_ext4() {
    copy_file_keeps_a_sparse_image_on(Kind::Ext4);
}

#[test]
#[ignore = "needs root: mounts tmpfs, ext4, XFS and btrfs scratch filesystems"]
fn copy_file_reflinks_a_block_image_on_xfs() {
    copy_file_keeps_a_sparse_image_on(Kind::Xfs);
}

/// A restore or clone copies into the volume directory the create path prepared: the copy
/// keeps everything the tree holds, and every entry it makes inherits what that directory
/// passes on (here an XFS project ID with PROJINHERIT, as a volume's quota gives it).
#[test]
#[ignore = "needs root: mounts tmpfs, ext4, XFS and btrfs scratch filesystems"]
fn a_copy_into_a_prepared_directory_keeps_the_tree_and_inherits_its_project() {
    use csi_nodekit::linux::quota::{project_of, set_project};
    let fs = ScratchFs::new(Kind::Xfs);
    let src = fs.path().join("src");
    let left_out = tree_fixture::build(&src);
    let dst = fs.path().join("volume");
    fs::create_dir(&dst).expect("prepare");
    set_project(&dst, 42).expect("set project");
    let report = copy::copy_tree_into(&src, &dst, Options::default()).expect("copy");
    assert!(report.used_reflinks(), "{report:?}");
    assert!(report.bytes_allocated > 0 && report.bytes_allocated < report.bytes);
    tree_fixture::assert_same(&src, &dst, &left_out);
    for rel in tree_fixture::walk(&dst) {
        let path = dst.join(&rel);
        let kind = fs::symlink_metadata(&path).expect("stat").file_type();
        if kind.is_dir() || kind.is_file() {
            let project = project_of(&path).expect("project").id;
            assert_eq!(project, 42, "{} is in project {project}", rel.display());
        }
    }
    let again = copy::copy_tree_into(&src, &dst, Options::default());
    assert!(
        matches!(again, Err(CopyError::DestinationNotEmpty(_))),
        "{again:?}"
    );
    let file = dst.join("big");
    let into_file = copy::copy_tree_into(&src, &file, Options::default());
    assert!(
        matches!(into_file, Err(CopyError::BadDestination(_))),
        "{into_file:?}"
    );
}
