//! Figures for the storage building blocks behind snapshots and block volumes, printed (not
//! asserted):
//! - a snapshot (`copy_tree`) and a restore of a 1 GiB volume of 10,000 files, with reflinks
//!   and without, on XFS, btrfs and ext4 made on loop devices: time and extra disk space;
//! - a 1 GiB block-volume image (256 MiB of data, the rest holes) copied with `copy_file`;
//! - loop devices: attach + detach pairs, and finding a file's device among N bound ones.
//!
//! Needs root in a private mount namespace; `scripts/bench-storage.sh` sets that up. Scratch
//! images go under `BENCH_DIR` (default the system temp directory; 4 GiB sparse each, one at
//! a time); `BENCH_FS=xfs,btrfs,ext4` picks filesystems. The page cache is warm (the source
//! was just written, then flushed), as for a snapshot of a volume in use.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi_nodekit::linux::copy::{self, Options, Report};
use csi_nodekit::linux::loopdev::{self, AttachOptions};

#[allow(dead_code)]
#[path = "support/bench.rs"]
mod bench;
use bench::scratch_fs::{Kind, ScratchFs};
use bench::selected;
use bench::{GIB, MIB, fill, mib};

const FILES: u64 = 10_000;

/// 10,000 files in 100 directories, 1 GiB in all.
fn volume(root: &Path) {
    bench::volume(root, FILES, GIB);
}

fn timed<T>(work: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let out = work();
    (out, start.elapsed())
}

/// Copies and reports time and the space it took.
fn measure(fs: &ScratchFs, what: &str, work: impl FnOnce() -> Report) {
    let before = fs.free_bytes();
    let (report, took) = timed(work);
    let used = before.saturating_sub(fs.free_bytes());
    println!(
        "  {what:<34} {:>8.2} s  {:>8.1} MiB extra  ({} files, {:.0} MiB reflinked, {:.0} MiB written)",
        took.as_secs_f64(),
        mib(used),
        report.files,
        mib(report.bytes_reflinked),
        mib(report.bytes_written)
    );
}

fn trees(kind: Kind) {
    println!("{kind:?}: snapshot and restore of 1 GiB in {FILES} files");
    let fs = ScratchFs::sized(kind, "noatime", 4 * GIB);
    let src = fs.path().join("volume");
    volume(&src);
    let p = fs.path();
    let reflink = Options::default();
    let plain = Options { reflink: false };
    measure(&fs, "snapshot", || {
        copy::copy_tree(&src, &p.join("snap"), reflink).expect("copy")
    });
    measure(&fs, "restore from it", || {
        copy::copy_tree(&p.join("snap"), &p.join("restored"), reflink).expect("copy")
    });
    if kind.reflinks() {
        measure(&fs, "snapshot, reflink: false", || {
            copy::copy_tree(&src, &p.join("plain"), plain).expect("copy")
        });
    }
    let (_, took) = timed(|| copy::remove_tree(&p.join("snap")).expect("remove"));
    println!(
        "  {:<34} {:>8.2} s",
        "delete the snapshot",
        took.as_secs_f64()
    );
}

fn image(kind: Kind) {
    println!("{kind:?}: copy_file of a 1 GiB block image with 256 MiB of data");
    let fs = ScratchFs::sized(kind, "noatime", 4 * GIB);
    let src = fs.path().join("volume.img");
    loopdev::create_backing_file(&src, GIB).expect("create");
    let file = fs::OpenOptions::new().write(true).open(&src).expect("open");
    let mut buf = vec![0u8; MIB as usize];
    for i in 0..256u64 {
        fill(&mut buf, i);
        // Every fourth MiB: data and holes interleaved.
        std::os::unix::fs::FileExt::write_all_at(&file, &buf, i * 4 * MIB).expect("write");
    }
    drop(file);
    let p = fs.path();
    measure(&fs, "copy_file", || {
        copy::copy_file(&src, &p.join("snap.img"), Options::default()).expect("copy")
    });
    if kind.reflinks() {
        measure(&fs, "copy_file, reflink: false", || {
            copy::copy_file(&src, &p.join("plain.img"), Options { reflink: false }).expect("copy")
        });
    }
}

fn loops() {
    println!("loop devices (backing files on ext4)");
    let fs = ScratchFs::sized(Kind::Ext4, "noatime", GIB);
    let files: Vec<PathBuf> = (0..8)
        .map(|i| {
            let path = fs.path().join(format!("vol{i}"));
            loopdev::create_backing_file(&path, 64 * MIB).expect("create");
            path
        })
        .collect();
    let rounds = 200;
    let (mut attach, mut detach) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..rounds {
        let (status, took) = timed(|| {
            loopdev::attach(
                &files[0],
                AttachOptions {
                    direct_io: true,
                    ..Default::default()
                },
            )
            .expect("attach")
        });
        attach += took;
        let ((), took) = timed(|| loopdev::detach(status.device, &files[0]).expect("detach"));
        detach += took;
    }
    let per = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(rounds);
    println!(
        "  attach {:>8.0} µs, detach {:>8.0} µs, pairs/s {:>6.0}",
        per(attach),
        per(detach),
        f64::from(rounds) / (attach + detach).as_secs_f64()
    );
    let attached: Vec<_> = files
        .iter()
        .map(|f| {
            (
                loopdev::attach(f, AttachOptions::default()).expect("attach"),
                f,
            )
        })
        .collect();
    let bound = fs::read_dir("/sys/block")
        .expect("sysfs")
        .filter(|e| e.as_ref().is_ok_and(|e| e.path().join("loop").exists()))
        .count();
    let (found, took) = timed(|| {
        (0..rounds)
            .map(|_| loopdev::find(&files[7]).expect("find").ours.len())
            .sum::<usize>()
    });
    assert_eq!(found, rounds as usize);
    println!(
        "  find among {bound} bound devices {:>8.0} µs",
        took.as_secs_f64() * 1e6 / f64::from(rounds)
    );
    let (again, took) =
        timed(|| loopdev::find_or_attach(&files[3], AttachOptions::default()).expect("find"));
    assert!(!again.1);
    println!(
        "  find_or_attach of an attached file {:>8.0} µs",
        took.as_secs_f64() * 1e6
    );
    for (status, file) in attached {
        loopdev::detach(status.device, file).expect("detach");
    }
}

fn main() {
    bench::prepare("");
    let only = std::env::args().nth(1).unwrap_or_default();
    if only.is_empty() || only == "trees" {
        for kind in [Kind::Xfs, Kind::Btrfs, Kind::Ext4] {
            if selected(kind) {
                trees(kind);
            }
        }
    }
    if only.is_empty() || only == "images" {
        for kind in [Kind::Xfs, Kind::Ext4] {
            if selected(kind) {
                image(kind);
            }
        }
    }
    if only.is_empty() || only == "loops" {
        loops();
    }
}
