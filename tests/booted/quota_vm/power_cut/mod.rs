//! Power cuts: the state directory on a disk of its own, the VM cut with sysrq-b (no sync, no
//! unmount; QEMU exits rather than reboot) and booted again on the same disk, several times
//! per filesystem. After each cut node-server must list every acknowledged volume and
//! snapshot with its content, project and limit, retry the call the cut caught into a whole
//! object (or a whole deletion), and hold nothing else.
//!
//! What this does not cut: the disk's own write cache. QEMU hands every write the guest made
//! to the host's page cache, which survives the guest, so a write the guest never flushed is
//! kept as if the disk had no volatile cache. A disk that loses unflushed writes is what
//! dm-log-writes (replaying the log to each flush) or dm-flakey (dropping writes after a
//! point) would add; see `docs/testing.md`.

mod inside;
mod journal;

use std::path::{Path, PathBuf};
use std::time::Instant;

use csi_nodekit::linux::quota::FsKind;

use super::ROLE;
use super::cases::{self, MIB};
use super::fixtures::{mkfs_ext4, mkfs_xfs, run};
use super::served::Served;
use super::vm::{self, say};
use inside::{Boot, Kind};
use journal::{Journal, Model};

/// Each volume's size.
pub const VOLUME_BYTES: u64 = 32 * MIB;
/// The case's name: [`cases::ONLY`] picks it by a word of it, as it picks the others.
const NAME: &str = "power_cuts_lose_nothing_acknowledged_and_leave_no_half_state";
/// The boot this VM is (`0` makes the filesystems), set by the host.
const ROUND: &str = "CSI_NODEKIT_POWER_CUT_ROUND";

/// Where each boot's cut is aimed, by filesystem: between them every kind of call that
/// changes the state is cut part-way at least once, and each filesystem has a cut at random.
const AIMS: [(&str, [Aim; 4]); 2] = [
    (
        "xfs",
        [
            Aim::Call(Kind::Snapshot),
            Aim::Call(Kind::Restore),
            Aim::Call(Kind::DeleteVolume),
            Aim::Random,
        ],
    ),
    (
        "ext4",
        [
            Aim::Call(Kind::Clone),
            Aim::Call(Kind::DeleteSnapshot),
            Aim::Call(Kind::Snapshot),
            Aim::Random,
        ],
    ),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aim {
    /// Part-way through a call of this kind.
    Call(Kind),
    /// At a random moment of the work, between calls or in one, or in a fill.
    Random,
}

impl Aim {
    pub fn kind(self) -> Option<Kind> {
        match self {
            Self::Call(kind) => Some(kind),
            Self::Random => None,
        }
    }
}

fn aims(fs: &str) -> [Aim; 4] {
    AIMS.iter()
        .find(|(name, _)| *name == fs)
        .expect("a filesystem with aims")
        .1
}

/// Whether this run has the power cuts (every run does, unless [`cases::ONLY`] leaves them out).
pub fn selected() -> bool {
    let only = std::env::var(cases::ONLY).unwrap_or_default();
    only.is_empty() || only.split(',').any(|w| !w.is_empty() && NAME.contains(w))
}

/// The name each boot's check reports under.
fn boot_name(fs: &str, round: usize) -> String {
    format!("{fs}::{NAME}::boot_{round}")
}

/// On the host: a fresh state disk and journal disk, then one boot per cut and a last one
/// that only checks.
pub fn cut_and_check(fs: &str) {
    let scratch = tempfile::Builder::new()
        .prefix("power-cut-")
        .tempdir()
        .expect("scratch dir");
    // vng names each disk by its path: no '=' or ',' in it.
    let disks: Vec<String> = [("state", 1024 * MIB), ("journal", 64 * MIB)]
        .iter()
        .map(|(name, bytes)| {
            let path = scratch.path().join(format!("{name}.img"));
            std::fs::File::create(&path)
                .and_then(|f| f.set_len(*bytes))
                .expect("disk image");
            path.display().to_string()
        })
        .collect();
    let cuts = aims(fs).len();
    let started = Instant::now();
    for round in 0..=cuts {
        let label = format!("power cuts ({fs}, boot {round} of {})", cuts + 1);
        let round_text = round.to_string();
        let run = vm::boot(
            &label,
            &[(cases::FS, fs), (ROLE, "power-cut"), (ROUND, &round_text)],
            &disks,
        );
        for figure in &run.report.figures {
            say(&format!("quota VM figure: {figure}"));
        }
        let checked = run
            .report
            .results
            .iter()
            .any(|(name, ok)| *name == boot_name(fs, round) && *ok);
        let last = round == cuts;
        let ended_right = if last {
            run.report.done && run.succeeded()
        } else {
            !run.report.done && !run.timed_out
        };
        assert!(
            checked && ended_right,
            "{label}: {}\n{}",
            if !checked {
                "the check after the cut failed"
            } else if last {
                "the last boot did not finish"
            } else {
                "the boot was not cut"
            },
            run.explain()
        );
    }
    say(&format!(
        "quota VM figure: {fs}: {cuts} power cuts, each checked after the next boot: nothing \
         acknowledged lost, no half state, in {:.0} s",
        started.elapsed().as_secs_f64()
    ));
}

/// The `n`th disk the host attached (virtio-blk, in the order given: vda, vdb, …).
fn disk(n: u8) -> PathBuf {
    let device = PathBuf::from(format!("/dev/vd{}", (b'a' + n) as char));
    let up =
        crate::common::wait_until_blocking(std::time::Duration::from_secs(10), || device.exists());
    assert!(
        up,
        "no {}: the host attaches the state and journal disks",
        device.display()
    );
    device
}

fn mount(device: &Path, at: &Path, fstype: &str, options: &str) {
    std::fs::create_dir_all(at).expect("mount point");
    let mut mount = std::process::Command::new("mount");
    mount
        .args(["-t", fstype, "-o", options])
        .arg(device)
        .arg(at);
    run(mount);
}

/// Inside the VM: one boot (role `power-cut`).
pub fn one_boot_inside() {
    let fs = std::env::var(cases::FS).expect("filesystem");
    let round: usize = std::env::var(ROUND)
        .expect("round")
        .parse()
        .expect("round number");
    let kind = if fs == "xfs" {
        FsKind::Xfs
    } else {
        FsKind::Ext4
    };
    let uptime = std::fs::read_to_string("/proc/uptime").unwrap_or_default();
    println!("quota-vm: boot {}", uptime.split(' ').next().unwrap_or("?"));
    let modprobe = std::process::Command::new("modprobe")
        .args(["-a", "xfs", "ext4", "quota_v2"])
        .status();
    assert!(
        modprobe.is_ok_and(|s| s.success()),
        "modprobe xfs ext4 quota_v2"
    );
    let (state_disk, journal_disk) = (disk(0), disk(1));
    if round == 0 {
        run(match kind {
            FsKind::Xfs => mkfs_xfs(&state_disk),
            FsKind::Ext4 => mkfs_ext4(&state_disk, Some("quota,project")),
        });
        run(mkfs_ext4(&journal_disk, None));
    }
    let root = Path::new("/tmp/power-cut");
    let (mnt, journal_mnt) = (root.join("state-fs"), root.join("journal-fs"));
    let started = Instant::now();
    mount(&state_disk, &mnt, &fs, "prjquota");
    mount(&journal_disk, &journal_mnt, "ext4", "defaults");
    let journal_path = journal_mnt.join("journal");
    let model = Model::replay(&std::fs::read_to_string(&journal_path).unwrap_or_default());
    let served = Served::start_on(&mnt, "state", &["--quota=on"]);
    let up = started.elapsed();
    let label = format!("{fs}: boot {round}");
    let name = boot_name(&fs, round);
    let mut boot = Boot::new(
        label.clone(),
        mnt,
        served,
        Journal::open(&journal_path),
        model,
    );
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| boot.check()));
    match &checked {
        Ok(summary) => {
            println!("quota-vm: test {name} ok {}", started.elapsed().as_millis());
            println!(
                "quota-vm: figure {label}: mounted and serving in {:.1} s; {summary}",
                up.as_secs_f64()
            );
        }
        Err(_) => {
            println!(
                "quota-vm: test {name} FAILED {}",
                started.elapsed().as_millis()
            );
            println!("quota-vm: | node-server's log:");
            for line in boot.served.logs().lines() {
                println!("quota-vm: | {line}");
            }
            std::panic::resume_unwind(checked.err().unwrap());
        }
    }
    let aims = aims(&fs);
    if round == aims.len() {
        println!("quota-vm: done");
        return;
    }
    boot.aim = Some(aims[round]);
    println!(
        "quota-vm: figure {label}: working until the cut, aimed at {:?}",
        aims[round]
    );
    boot.work_until_cut(round);
}
