//! Real filesystems for storage tests: tmpfs, ramfs, and ext4, XFS (with reflink) and btrfs made on
//! a sparse image and mounted through a loop device. Needs root and a private mount namespace
//! (the README's test command gives both). Mounted `noatime`, so that the tests' own reads do
//! not move the atimes they compare; the copy sets atimes explicitly, which `noatime` allows.

use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Tmpfs,
    /// No `O_DIRECT`, no `SEEK_DATA`: the plainest filesystem there is.
    Ramfs,
    Ext4,
    Xfs,
    Btrfs,
}

impl Kind {
    /// Whether the filesystem shares extents (`FICLONE`).
    pub fn reflinks(self) -> bool {
        matches!(self, Kind::Xfs | Kind::Btrfs)
    }
}

/// A mounted scratch filesystem; unmounted on drop (the loop device goes with it: mount sets
/// autoclear on the loop devices it creates).
pub struct ScratchFs {
    pub kind: Kind,
    root: PathBuf,
    _dir: tempfile::TempDir,
}

/// Runs a command, panicking with its output if it fails.
/// `e2fsck -fn` (forced, read-only) of an ext4 device or image: its exit code and output.
pub fn fsck(device_or_image: &Path) -> (i32, String) {
    let out = Command::new("e2fsck")
        .arg("-fn")
        .arg(device_or_image)
        .output()
        .expect("run e2fsck (e2fsprogs)");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

pub fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e} (is it installed? .ci/run installs it)"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl ScratchFs {
    pub fn new(kind: Kind) -> Self {
        Self::with_options(kind, "noatime")
    }

    /// `options` are mount options (for tmpfs e.g. `size=1m`).
    pub fn with_options(kind: Kind, options: &str) -> Self {
        Self::sized(kind, options, 512 << 20)
    }

    /// A filesystem on an image of `bytes` (sparse; tmpfs and ramfs ignore it).
    pub fn sized(kind: Kind, options: &str, bytes: u64) -> Self {
        assert!(
            nix::unistd::geteuid().is_root(),
            "storage tests need root: run the README's test command as root"
        );
        let dir = tempfile::tempdir().expect("create scratch directory");
        let root = dir.path().join("mnt");
        std::fs::create_dir(&root).expect("create mount point");
        let mnt = root.to_str().expect("UTF-8 temp path");
        if let Kind::Tmpfs | Kind::Ramfs = kind {
            let fstype = if kind == Kind::Tmpfs {
                "tmpfs"
            } else {
                "ramfs"
            };
            run("mount", &["-t", fstype, "-o", options, "scratch", mnt]);
        } else {
            let image = dir.path().join("image");
            let file = std::fs::File::create(&image).expect("create image");
            // XFS wants at least 300 MiB; sparse, so it costs only what mkfs writes.
            file.set_len(bytes).expect("size image");
            let image = image.to_str().expect("UTF-8 temp path");
            match kind {
                Kind::Ext4 => run("mkfs.ext4", &["-q", "-F", image]),
                Kind::Xfs => run("mkfs.xfs", &["-q", "-f", "-m", "reflink=1", image]),
                Kind::Btrfs => run("mkfs.btrfs", &["-q", "-f", image]),
                Kind::Tmpfs | Kind::Ramfs => unreachable!(),
            }
            run("mount", &["-o", &format!("loop,{options}"), image, mnt]);
        }
        Self {
            kind,
            root,
            _dir: dir,
        }
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Free bytes as the filesystem counts them, after flushing it (so delayed allocation and
    /// btrfs's transaction commit have happened).
    pub fn free_bytes(&self) -> u64 {
        let dir = std::fs::File::open(&self.root).expect("open scratch root");
        nix::unistd::syncfs(&dir).expect("syncfs");
        if self.kind == Kind::Btrfs {
            // btrfs frees and accounts space at transaction commit.
            run(
                "btrfs",
                &["filesystem", "sync", self.root.to_str().expect("UTF-8")],
            );
        }
        let stat = nix::sys::statvfs::fstatvfs(&dir).expect("statvfs");
        stat.blocks_free() * stat.fragment_size()
    }
}

impl Drop for ScratchFs {
    fn drop(&mut self) {
        if let Err(e) = nix::mount::umount2(&self.root, nix::mount::MntFlags::MNT_DETACH) {
            eprintln!("unmount {}: {e}", self.root.display());
        }
    }
}
