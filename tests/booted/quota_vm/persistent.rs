//! Inside the VM: pods that keep escaping, through the real node-server. One moves each new
//! file out of its volume's project before writing it, and, once it can make no new file,
//! moves its old ones out again: fenced after its second escape, it ends near its size. One
//! takes a file out a thousand directories down, where the walk once stopped at 512.

use std::os::unix::fs::{MetadataExt, chown};
use std::time::{Duration, Instant};

use csi_nodekit::linux::quota::{self, FsKind, escape::QUARANTINE_UID};

use super::cases::{MIB, figure, open};
use super::escapes::{assert_escaped, condition, until_condition};
use super::fixtures::{
    AttrChange, POD_UID, PodUser, Prep, TestFs, create_until_error, du, keep_escaping,
    keep_flooding, keep_flooding_hidden, pod_write,
};
use super::served::{Served, create_and_publish, remove, runtime};

/// How long the escaper and the flood keep at it: nine check intervals of 5 s.
const ESCAPING: Duration = Duration::from_secs(45);

pub fn a_pod_that_keeps_escaping_is_fenced_and_ends_within_twice_its_size(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    // A 5 s interval: the first episode (before any fence) lasts up to an interval, and the
    // VM's 128 MiB filesystem must not fill before the fence is what stops the pod.
    let served = Served::start(&fs, "state", &["--quota=on", "--quota-check-interval=5s"]);
    runtime().block_on(async {
        let mut csi = served.client().await;
        let pod = served.pod("a");
        let limit = 32 * MIB;
        let id = create_and_publish(&mut csi, "pvc-a", limit, &pod).await;
        let project = served.recorded_project(&id).expect("recorded project");
        let target = pod.target.clone();
        let started = Instant::now();
        let escaper =
            std::thread::spawn(move || keep_escaping(&target, ESCAPING.as_millis() as u64));
        let (fenced, message) = until_condition(&mut csi, &id, &pod.target, true, started, |m| {
            m.contains("fenced")
        })
        .await;
        let w = escaper.join().expect("escaper");
        assert_eq!(w.cap_eff, 0, "the pod has no capabilities: {w:?}");
        // What the volume holds once the escaper stopped, all of it charged back: a walk
        // after its last write (the interval, and the pass's own time).
        std::thread::sleep(Duration::from_secs(10));
        let dir = served.volume_dir(&id);
        let (held, inodes) = du(&dir);
        fs.sync();
        let charged = q.usage(project).unwrap();
        let entries: Vec<_> = std::iter::once(std::fs::symlink_metadata(&dir).unwrap())
            .chain((std::fs::read_dir(&dir).unwrap()).filter_map(|e| e.ok()?.metadata().ok()))
            .collect();
        let handed = entries.iter().filter(|m| m.uid() == QUARANTINE_UID).count();
        let created = create_until_error(&pod.target, 1, POD_UID);
        let (_, still, _) = condition(&mut csi, &id, &pod.target).await;
        let logs = served.logs();
        figure(
            kind,
            format_args!(
                "a pod that keeps escaping (uid 1000, a new file moved to project 0 before each \
                 write, then its old ones again, at 2 MiB/s; {} s, 5s interval) into a {} MiB volume: \
                 wrote {} bytes in {} moves; fenced after {:.1} s; the volume holds {} bytes \
                 ({:.2}x its size) in {inodes} inodes, {} charged; {handed} of {} entries of \
                 its top directory handed to the quarantine owner; a new file then: errno {}",
                ESCAPING.as_secs(),
                limit / MIB,
                w.bytes,
                w.attr_errno,
                fenced.as_secs_f64(),
                held,
                held as f64 / limit as f64,
                charged.bytes,
                entries.len(),
                created.errno
            ),
        );
        assert!(message.contains("fenced"), "{message}");
        assert!(logs.contains("fenced"), "the fence is logged:\n{logs}");
        assert_eq!(
            handed,
            entries.len(),
            "everything was handed over: {message}"
        );
        assert!(still.contains("fenced"), "it stays fenced: {still}");
        assert_eq!(
            (created.bytes, created.errno),
            (0, fs.limit_errno()),
            "a fenced volume makes no new file"
        );
        assert!(
            held <= 2 * limit,
            "a persistent escaper ends within twice its size: {held} bytes in a {limit}-byte volume"
        );
        assert!(
            charged.bytes >= held.saturating_sub(MIB),
            "all charged back: {charged:?}"
        );
        assert!(
            charged.limits.inodes <= charged.inodes.max(1),
            "its inode limit is what it holds: {charged:?}"
        );
        remove(&mut csi, &id, &pod).await;
    });
}

pub fn a_file_escaped_a_thousand_directories_down_is_found_and_charged_back(kind: FsKind) {
    const DEPTH: usize = 1_000;
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let served = Served::start(&fs, "state", &["--quota=on", "--quota-check-interval=5s"]);
    runtime().block_on(async {
        let mut csi = served.client().await;
        let pod = served.pod("a");
        let limit = 16 * MIB;
        let id = create_and_publish(&mut csi, "pvc-a", limit, &pod).await;
        let project = served.recorded_project(&id).expect("recorded project");
        let mut deep = pod.target.clone();
        for _ in 0..DEPTH {
            deep.push("d");
        }
        std::fs::create_dir_all(&deep).expect("the pod's deep tree");
        chown(&deep, Some(POD_UID), Some(POD_UID)).expect("chown");
        let file = deep.join("deep");
        let escaped_at = Instant::now();
        let w = pod_write(
            PodUser::Uid1000,
            &file,
            AttrChange::Project(0),
            &file,
            2 * limit,
            0,
        );
        assert_escaped(&w);
        let (detected, message) =
            until_condition(&mut csi, &id, &pod.target, true, escaped_at, |m| {
                m.contains("bytes")
            })
            .await;
        let dir_file = served
            .volume_dir(&id)
            .join(file.strip_prefix(&pod.target).unwrap());
        assert_eq!(
            quota::project_of(&dir_file).unwrap().id,
            project,
            "{message}"
        );
        fs.sync();
        let usage = q.usage(project).unwrap().bytes;
        assert!(
            usage >= w.bytes,
            "charged back: usage {usage}, file {}",
            w.bytes
        );
        figure(
            kind,
            format_args!(
                "a file {DEPTH} directories down moved to project 0 (uid 1000, 5s interval): \
                 {} bytes written into a {} MiB volume, found and charged back after {:.1} s \
                 (before: never, the walk stopped at 512 levels)",
                w.bytes,
                limit / MIB,
                detected.as_secs_f64()
            ),
        );
        remove(&mut csi, &id, &pod).await;
    });
}

pub fn what_the_check_cannot_reach_makes_the_volume_abnormal_naming_it(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let served = Served::start(&fs, "state", &["--quota=on", "--quota-check-interval=5s"]);
    runtime().block_on(async {
        let mut csi = served.client().await;
        let pod = served.pod("a");
        let id = create_and_publish(&mut csi, "pvc-a", 16 * MIB, &pod).await;
        // Something mounted inside the volume: the check cannot look under it.
        let inner = served.volume_dir(&id).join("mounted");
        std::fs::create_dir(&inner).unwrap();
        let mounted = nix::mount::mount(
            Some("inner"),
            &inner,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        );
        mounted.expect("mount a tmpfs inside the volume");
        let since = Instant::now();
        let (found, message) = until_condition(&mut csi, &id, &pod.target, true, since, |m| {
            m.contains("could not be checked")
        })
        .await;
        assert!(message.contains("mounted is a mount point"), "{message}");
        nix::mount::umount(&inner).expect("umount");
        let (normal, _) =
            until_condition(&mut csi, &id, &pod.target, false, Instant::now(), |_| true).await;
        figure(
            kind,
            format_args!(
                "a mount inside a volume (5s interval): abnormal after {:.1} s (\"{message}\"), \
                 normal {:.1} s after it went (before: skipped without a word)",
                found.as_secs_f64(),
                normal.as_secs_f64()
            ),
        );
        remove(&mut csi, &id, &pod).await;
    });
}

pub fn a_flood_of_symlinks_and_fifos_in_an_escaped_directory_is_fenced_and_made_again_in_the_project(
    kind: FsKind,
) {
    flood_case(kind);
}

/// The pod makes its entries in bursts with the directory out and puts the directory back
/// after each, and stops before the first walk: no walk ever meets the directory out, and
/// each entry is found by its own project alone — read by its number on XFS, asked by a hard
/// link on ext4 (which tells it no other way), once per new entry: an entry that was always
/// in the project keeps its inode, and its ctime from one walk to the next.
pub fn a_flood_hidden_by_moving_its_directory_back_is_found_by_each_entrys_own_project(
    kind: FsKind,
) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let served = Served::start(&fs, "state", &["--quota=on", "--quota-check-interval=5s"]);
    runtime().block_on(async {
        let mut csi = served.client().await;
        let pod = served.pod("a");
        let id = create_and_publish(&mut csi, "pvc-a", 64 * MIB, &pod).await;
        let project = served.recorded_project(&id).expect("recorded project");
        let kept = pod.target.join("kept");
        std::os::unix::fs::symlink("/in/the/project", &kept).expect("a symlink of the pod's");
        let kept_ino = std::fs::symlink_metadata(&kept).unwrap().ino();
        let started = Instant::now();
        let hidden = pod.target.join("hidden");
        let made = keep_flooding_hidden(&hidden, 300);
        let made_in = started.elapsed();
        fs.sync();
        let outside = entries(&served.volume_dir(&id))
            .saturating_sub(q.usage(project).unwrap().inodes);
        let (found, message) = until_condition(&mut csi, &id, &pod.target, true, started, |m| {
            m.contains("another project")
        })
        .await;
        let (inodes, charged) =
            until_all_charged(&fs, &q, &served.volume_dir(&id), project, started, 90);
        // Two passes and more later, nothing asks the pod's own symlink again.
        let ctime = |path: &std::path::Path| {
            let meta = std::fs::symlink_metadata(path).unwrap();
            (meta.ctime(), meta.ctime_nsec())
        };
        let settled = ctime(&kept);
        tokio::time::sleep(Duration::from_secs(12)).await;
        figure(
            kind,
            format_args!(
                "entries made in bursts of 50 with their directory out of the project and the \
                 directory moved back after each (uid 1000, {:.1} s): {} made in {} moves, {outside} \
                 outside any limit once it stopped; found after {:.1} s by their own project; \
                 then {inodes} held, {charged} charged ({} outside)",
                made_in.as_secs_f64(),
                made.bytes,
                made.attr_errno,
                found.as_secs_f64(),
                inodes.saturating_sub(charged),
            ),
        );
        assert!(made.bytes > 0, "the pod made entries: {made:?}");
        assert!(outside > 0, "the flood left entries outside any limit first");
        assert_eq!(
            inodes.saturating_sub(charged),
            0,
            "every entry is charged to the volume: {message}"
        );
        let now = std::fs::symlink_metadata(&kept).unwrap();
        assert_eq!(now.ino(), kept_ino, "the pod's own symlink is left in place");
        assert_eq!(ctime(&kept), settled, "and asked no more once known");
        remove(&mut csi, &id, &pod).await;
    });
}

/// A pod flooding its volume with symlinks and FIFOs made while their directory is out of the
/// project, fenced, and every entry in the end charged to the volume.
fn flood_case(kind: FsKind) {
    let keep = keep_flooding;
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    // A 5 s interval, as for the escaper: what the flood makes before the fence is made again
    // entry by entry, which QEMU's emulation slows to tens a second.
    let served = Served::start(&fs, "state", &["--quota=on", "--quota-check-interval=5s"]);
    runtime().block_on(async {
        let mut csi = served.client().await;
        let pod = served.pod("a");
        let limit = 64 * MIB;
        let id = create_and_publish(&mut csi, "pvc-a", limit, &pod).await;
        let project = served.recorded_project(&id).expect("recorded project");
        let inode_limit = q.usage(project).unwrap().limits.inodes;
        let flooded = pod.target.join("flood");
        let started = Instant::now();
        let flooding = flooded.clone();
        let flood = std::thread::spawn(move || keep(&flooding, ESCAPING.as_millis() as u64));
        let (found, _) = until_condition(&mut csi, &id, &pod.target, true, started, |_| true).await;
        let (fenced, _) = until_condition(&mut csi, &id, &pod.target, true, started, |m| {
            m.contains("fenced")
        })
        .await;
        let first = flood.join().expect("flood");
        // Once fenced, the pod makes nothing more, anywhere in its volume.
        let again = keep(&flooded, 5_000);
        let fresh = keep(&pod.target.join("fresh"), 5_000);
        // What the flood made while its directory was out of the project is made again in
        // it by the walks: every entry the volume holds ends charged to it.
        let stopped = Instant::now();
        let (inodes, charged) =
            until_all_charged(&fs, &q, &served.volume_dir(&id), project, stopped, 120);
        let (_, message, _) = condition(&mut csi, &id, &pod.target).await;
        figure(
            kind,
            format_args!(
                "a flood of symlinks and FIFOs in a directory moved to project 0 before each \
                 batch of {}, 1,000 a second (uid 1000, {} s, 5s interval), inode limit \
                 {inode_limit}: \
                 {} made in {} moves, found after {:.1} s, fenced after {:.1} s; after the fence: \
                 {} more made there, {} in a new directory (errno {}); {:.1} s after the flood \
                 the volume holds {inodes} inodes, {charged} charged to it ({} outside any \
                 limit)",
                500,
                ESCAPING.as_secs(),
                first.bytes,
                first.attr_errno,
                found.as_secs_f64(),
                fenced.as_secs_f64(),
                again.bytes,
                fresh.bytes,
                fresh.errno,
                stopped.elapsed().as_secs_f64(),
                inodes.saturating_sub(charged),
            ),
        );
        assert!(first.bytes > 0, "the flood made something: {first:?}");
        assert_eq!(
            inodes.saturating_sub(charged),
            0,
            "every entry of the volume is charged to it ({inodes} held, {charged} charged): \
             {message}\n{}",
            served.logs()
        );
        assert_eq!(
            (again.bytes, fresh.bytes),
            (0, 0),
            "a fenced volume's pod makes nothing more: {again:?} {fresh:?}"
        );
        remove(&mut csi, &id, &pod).await;
    });
}

/// The inodes of the tree at `dir` and those charged to `project`, once every one is charged
/// or `secs` after `since`; looked at every 5 s, and by names alone: the VM has one CPU, which
/// the walks need.
fn until_all_charged(
    fs: &TestFs,
    q: &csi_nodekit::linux::quota::QuotaFs,
    dir: &std::path::Path,
    project: u32,
    since: Instant,
    secs: u64,
) -> (u64, u64) {
    loop {
        let inodes = entries(dir);
        fs.sync();
        let charged = q.usage(project).unwrap().inodes;
        if inodes <= charged || since.elapsed() > Duration::from_secs(secs) {
            return (inodes, charged);
        }
        std::thread::sleep(Duration::from_secs(5));
    }
}

/// The inodes of the tree at `dir` (itself included), by names and their directory entries'
/// types: no stat per entry.
fn entries(dir: &std::path::Path) -> u64 {
    let mut count = 1;
    for entry in std::fs::read_dir(dir)
        .expect("read dir")
        .map_while(Result::ok)
    {
        count += match entry.file_type().is_ok_and(|t| t.is_dir()) {
            true => entries(&entry.path()),
            false => 1,
        };
    }
    count
}

pub fn a_large_volume_does_not_hold_back_a_neighbours_check(kind: FsKind) {
    const FILES: usize = 3_000;
    const TRIES: usize = 3;
    let fs = TestFs::new(kind, Prep::Prepared);
    let served = Served::start(
        &fs,
        "state",
        &[
            "--quota=on",
            "--quota-check-interval=5s",
            "--quota-check-rate=200",
            "--v=2",
        ],
    );
    runtime().block_on(async {
        let mut csi = served.client().await;
        let big = csi_node_create(&mut csi, "pvc-big").await;
        let dir = served.volume_dir(&big);
        for i in 0..FILES {
            std::fs::File::create(dir.join(format!("f{i}"))).expect("a file of the large volume");
        }
        // The large volume's walk (15 s at the rate) is cut off and moved to its own thread.
        let moved = Instant::now();
        while !served.logs().contains("with the other large volumes") {
            assert!(
                moved.elapsed() < Duration::from_secs(90),
                "{}",
                served.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut found = Vec::new();
        for n in 0..TRIES {
            // A volume per try: a second escape in one volume fences it. Its file is moved out
            // and not written: the write watch would find a written one at once, and this is
            // about the walks.
            let pod = served.pod(&format!("a{n}"));
            let id = create_and_publish(&mut csi, &format!("pvc-a{n}"), 16 * MIB, &pod).await;
            let file = pod.target.join("escaped");
            let escaped_at = Instant::now();
            let w = pod_write(PodUser::Uid1000, &file, AttrChange::Project(0), &file, 0, 0);
            assert_escaped(&w);
            let (took, _) = until_condition(&mut csi, &id, &pod.target, true, escaped_at, |m| {
                m.contains("another project")
            })
            .await;
            found.push(took);
            remove(&mut csi, &id, &pod).await;
        }
        figure(
            kind,
            format_args!(
                "a volume of {FILES} files (a 15 s walk at --quota-check-rate=200) beside a \
                 small one whose pod escapes {TRIES} times (5s interval): found after {:?} \
                 (the large one walked by a thread of its own)",
                found
                    .iter()
                    .map(|d| format!("{:.1} s", d.as_secs_f64()))
                    .collect::<Vec<_>>()
            ),
        );
        assert!(
            found.iter().all(|took| *took <= Duration::from_secs(8)),
            "every escape found within 8 s, not held back by the large volume: {found:?}"
        );
    });
}

/// A volume made through gRPC and not published (its directory is filled from outside).
async fn csi_node_create(csi: &mut crate::common::csi_node::Csi, name: &str) -> String {
    crate::common::csi_node::create(csi, name, (64 * MIB) as i64).await
}
