//! Inside the VM: pods taking their files out of their volume's project, as the kernel lets
//! them (the owner of an inode may change its project ID with no capability, in the host's
//! user namespace), found by node-server and charged back to the volume; and a pod in a user
//! namespace of its own, which cannot change a project ID at all.

use std::ops::ControlFlow;
use std::os::fd::AsFd;
use std::os::unix::fs::chown;
use std::path::Path;
use std::time::{Duration, Instant};

use csi_nodekit::linux::quota::{self, FsKind, Limits, escape_walk};

use super::cases::{FIRST, MIB, figure, open};
use super::fixtures::{AttrChange, POD_UID, PodUser, Prep, TestFs, Written, pod_write};
use super::served::{Served, create_and_publish, remove, runtime};
use crate::common::csi_node::{self, Csi};

/// The bound the issue sets, from an escape to its charge-back, with the default interval.
const BOUND: Duration = Duration::from_secs(60);
/// How long a case waits for what node-server should do within [`BOUND`].
const PATIENCE: Duration = Duration::from_secs(120);

/// NodeGetVolumeStats: whether the condition is abnormal, its message, and bytes used.
pub async fn condition(csi: &mut Csi, id: &str, path: &Path) -> (bool, String, u64) {
    let reply = csi
        .node
        .node_get_volume_stats(csi_node::stats_request(id, &path.display().to_string()))
        .await
        .expect("stats")
        .into_inner();
    let used = reply
        .usage
        .iter()
        .find(|u| u.unit == csi_nodekit::proto::csi::volume_usage::Unit::Bytes as i32)
        .map_or(0, |u| u.used as u64);
    let condition = reply.volume_condition.expect("condition");
    (condition.abnormal, condition.message, used)
}

/// Polls the stats every 200 ms until the condition is `abnormal` and its message passes
/// `also`; how long after `since` that was, and the message.
pub async fn until_condition(
    csi: &mut Csi,
    id: &str,
    path: &Path,
    abnormal: bool,
    since: Instant,
    also: impl Fn(&str) -> bool,
) -> (Duration, String) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (now_abnormal, message, _) = condition(csi, id, path).await;
        if now_abnormal == abnormal && also(&message) {
            return (since.elapsed(), message);
        }
        assert!(
            Instant::now() < deadline,
            "the condition was not abnormal={abnormal} within {PATIENCE:?}: {message}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A pod's write that escaped: its change worked and it has no capability (or, in its own
/// user namespace, only there).
pub fn assert_escaped(w: &Written) {
    assert_eq!(w.attr_errno, 0, "the kernel let the pod change it: {w:?}");
    assert_eq!(w.cap_eff, 0, "the pod has no capabilities: {w:?}");
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

pub fn a_pods_file_moved_out_of_its_project_is_found_and_charged_back_within_a_minute(
    kind: FsKind,
) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    // The default interval: the bound is the with the defaults.
    let served = Served::start(&fs, "state", &["--quota=on"]);
    // The write watch is there only while a directory volume needs it (it costs every writer).
    let watching = |want: usize| {
        let since = Instant::now();
        while served.fanotify_groups() != want {
            assert!(since.elapsed() < BOUND, "{want} fanotify groups");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    std::thread::sleep(Duration::from_secs(2));
    watching(0);
    runtime().block_on(async {
        let mut csi = served.client().await;
        let pod = served.pod("a");
        let limit = 8 * MIB;
        let id = create_and_publish(&mut csi, "pvc-a", limit, &pod).await;
        let project = served.recorded_project(&id).expect("recorded project");
        watching(1);
        let file = pod.target.join("escaped");
        // `chattr -p 0 escaped`, then appending at 1 MiB/s until the kernel says no.
        let escaped_at = Instant::now();
        let writer = std::thread::spawn(move || {
            pod_write(
                PodUser::Uid1000,
                &file,
                AttrChange::Project(0),
                &file,
                96 * MIB,
                MIB,
            )
        });
        let (detected, message) =
            until_condition(&mut csi, &id, &pod.target, true, escaped_at, |m| {
                m.contains("bytes")
            })
            .await;
        let w = writer.join().expect("writer");
        assert_escaped(&w);
        assert_eq!(
            w.errno,
            fs.limit_errno(),
            "once charged back the volume is over its size, and the pod stops: {w:?}"
        );
        let charged = Duration::from_millis(w.millis);
        assert!(
            detected <= BOUND && charged <= BOUND,
            "detected after {detected:?}, charged back after {charged:?}"
        );
        assert!(message.contains("(project 0)"), "{message}");
        let dir = served.volume_dir(&id);
        assert_eq!(quota::project_of(&dir.join("escaped")).unwrap().id, project);
        fs.sync();
        let usage = q.usage(project).unwrap().bytes;
        assert!(
            usage >= w.bytes,
            "the volume's project holds the escaped file again: usage {usage}, file {}",
            w.bytes
        );
        let (normal, _) =
            until_condition(&mut csi, &id, &pod.target, false, Instant::now(), |_| true).await;
        let episode = format!("volume {id}: its files escaped its size");
        assert_eq!(
            served.logs().matches(&episode).count(),
            1,
            "one log line for the episode:\n{}",
            served.logs()
        );
        figure(
            kind,
            format_args!(
                "escape by chattr -p 0 (uid 1000, appending 1 MiB/s, default 20s interval): \
                 abnormal after {:.1} s, charged back (the pod stopped) after {:.1} s; bytes past \
                 the limit before the charge-back: {}; back to normal {:.1} s later",
                secs(detected),
                secs(charged),
                w.bytes.saturating_sub(limit),
                secs(normal)
            ),
        );
        remove(&mut csi, &id, &pod).await;
        watching(0);
    });
}

pub fn a_subdirectory_with_projinherit_cleared_is_found_and_its_files_charged_back(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let served = Served::start(&fs, "state", &["--quota=on", "--quota-check-interval=5s"]);
    runtime().block_on(async {
        let mut csi = served.client().await;
        let pod = served.pod("a");
        let id = create_and_publish(&mut csi, "pvc-a", 8 * MIB, &pod).await;
        let project = served.recorded_project(&id).expect("recorded project");
        let sub = pod.target.join("sub");
        let file = sub.join("fill");
        let escaped_at = Instant::now();
        // `mkdir sub; chattr -P sub`, then 16 MiB into the 8 MiB volume.
        let w = pod_write(
            PodUser::Uid1000,
            &sub,
            AttrChange::NoInherit,
            &file,
            16 * MIB,
            0,
        );
        assert_escaped(&w);
        assert!(
            w.errno == 0 || w.errno == fs.limit_errno(),
            "stopped only by a charge-back: {w:?}"
        );
        let (detected, message) =
            until_condition(&mut csi, &id, &pod.target, true, escaped_at, |m| {
                m.contains("PROJINHERIT")
            })
            .await;
        assert!(detected <= BOUND, "detected after {detected:?}");
        assert!(
            message.contains("1 directories had PROJINHERIT cleared"),
            "{message}"
        );
        let dir = served.volume_dir(&id);
        let sub_attr = quota::project_of(&dir.join("sub")).unwrap();
        assert_eq!((sub_attr.id, sub_attr.inherit), (project, true));
        // The episode shows as soon as the walk finds the directory; the file below it is set
        // back a moment later, by the same walk.
        let back = Instant::now();
        while quota::project_of(&dir.join("sub/fill")).unwrap().id != project {
            assert!(back.elapsed() < BOUND, "sub/fill never set back");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        fs.sync();
        let usage = q.usage(project).unwrap().bytes;
        assert!(usage >= w.bytes, "usage {usage}, file {}", w.bytes);
        let (normal, _) =
            until_condition(&mut csi, &id, &pod.target, false, Instant::now(), |_| true).await;
        figure(
            kind,
            format_args!(
                "escape by chattr -P on a subdirectory (uid 1000, 5s interval): {} bytes written \
                 past nothing; abnormal after {:.1} s, back to normal {:.1} s later",
                w.bytes,
                secs(detected),
                secs(normal)
            ),
        );
        remove(&mut csi, &id, &pod).await;
    });
}

pub fn a_root_pod_without_capabilities_retagging_the_volume_root_is_set_back_and_charged(
    kind: FsKind,
) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let served = Served::start(&fs, "state", &["--quota=on"]);
    runtime().block_on(async {
        let mut csi = served.client().await;
        let pod = served.pod("a");
        let id = create_and_publish(&mut csi, "pvc-a", 8 * MIB, &pod).await;
        let project = served.recorded_project(&id).expect("recorded project");
        let dir = served.volume_dir(&id);
        let escaped_at = Instant::now();
        // uid 0 owns the volume's root: `chattr -p 0 .` needs no capability.
        let file = pod.target.join("fill");
        let w = pod_write(
            PodUser::RootWithoutCaps,
            &pod.target,
            AttrChange::Project(0),
            &file,
            16 * MIB,
            0,
        );
        assert_escaped(&w);
        // The next stats call sets the root back, unless the background pass (which may be
        // walking the volume right now) got there first; either way it is back at once.
        let (abnormal, first, _) = condition(&mut csi, &id, &pod.target).await;
        let root = quota::project_of(&dir).unwrap();
        assert_eq!((root.id, root.inherit), (project, true), "{root:?}");
        let root_checked = escaped_at.elapsed();
        let found_by = match abnormal && first.contains("escaped its size: 1 inodes") {
            true => "the stats call",
            false => "the background pass",
        };
        let (charged, message) =
            // More than the root alone: the walk has found the file too.
            until_condition(&mut csi, &id, &pod.target, true, escaped_at, |m| {
                m.contains("escaped its size: ") && !m.contains("escaped its size: 1 inodes")
            })
            .await;
        assert!(
            charged <= BOUND,
            "charged back after {charged:?}: {message}"
        );
        assert_eq!(quota::project_of(&dir.join("fill")).unwrap().id, project);
        fs.sync();
        let usage = q.usage(project).unwrap().bytes;
        assert!(usage >= w.bytes, "usage {usage}, file {}", w.bytes);
        figure(
            kind,
            format_args!(
                "escape by re-tagging the volume root (uid 0, no capabilities, default \
                 interval): root set back by {found_by} within {:.1} s; {} bytes written \
                 meanwhile, charged back after {:.1} s",
                secs(root_checked),
                w.bytes,
                secs(charged)
            ),
        );
        remove(&mut csi, &id, &pod).await;
    });
}

pub fn files_moved_into_a_neighbours_project_are_charged_back_to_their_own_volume(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let served = Served::start(&fs, "state", &["--quota=on", "--quota-check-interval=5s"]);
    runtime().block_on(async {
        let mut csi = served.client().await;
        let (pod_a, pod_b) = (served.pod("a"), served.pod("b"));
        let a = create_and_publish(&mut csi, "pvc-a", 8 * MIB, &pod_a).await;
        let b = create_and_publish(&mut csi, "pvc-b", 8 * MIB, &pod_b).await;
        let (project_a, project_b) = (
            served.recorded_project(&a).unwrap(),
            served.recorded_project(&b).unwrap(),
        );
        let file = pod_a.target.join("theirs");
        let escaped_at = Instant::now();
        // `chattr -p <neighbour> theirs`, then 6 MiB charged to the neighbour.
        let w = pod_write(
            PodUser::Uid1000,
            &file,
            AttrChange::Project(project_b),
            &file,
            6 * MIB,
            0,
        );
        assert_escaped(&w);
        let (detected, message) =
            until_condition(&mut csi, &a, &pod_a.target, true, escaped_at, |m| {
                m.contains(&format!("(project {project_b})"))
            })
            .await;
        assert!(detected <= BOUND, "detected after {detected:?}: {message}");
        fs.sync();
        let (usage_a, usage_b) = (
            q.usage(project_a).unwrap().bytes,
            q.usage(project_b).unwrap().bytes,
        );
        assert!(usage_a >= w.bytes, "its own volume holds it: {usage_a}");
        assert!(usage_b < MIB, "the neighbour is charged nothing: {usage_b}");
        let (b_abnormal, b_message, _) = condition(&mut csi, &b, &pod_b.target).await;
        assert!(!b_abnormal, "the neighbour did nothing: {b_message}");
        figure(
            kind,
            format_args!(
                "{} bytes moved into the neighbour's project (uid 1000, 5s interval): charged \
                 back to their own volume after {:.1} s",
                w.bytes,
                secs(detected)
            ),
        );
        remove(&mut csi, &a, &pod_a).await;
        remove(&mut csi, &b, &pod_b).await;
    });
}

pub fn a_pod_in_a_user_namespace_cannot_change_a_project_id(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let limit = 4 * MIB;
    let vol = fs.dir("vol");
    chown(&vol, Some(POD_UID), Some(POD_UID)).expect("chown");
    let limits = Limits {
        bytes: limit,
        inodes: 0,
    };
    q.assign(&vol, FIRST, limits).expect("assign");
    let sub = vol.join("sub");
    let d = pod_write(
        PodUser::UserNamespace,
        &sub,
        AttrChange::NoInherit,
        &sub.join("f"),
        MIB,
        0,
    );
    assert_eq!(
        d.attr_errno,
        libc::EINVAL,
        "PROJINHERIT from a user namespace: {d:?}"
    );
    assert!(quota::project_of(&sub).unwrap().inherit);
    let file = vol.join("fill");
    // Root of its own user namespace, owning the file (uid 1000 on the host).
    let w = pod_write(
        PodUser::UserNamespace,
        &file,
        AttrChange::Project(0),
        &file,
        4 * limit,
        0,
    );
    assert_ne!(
        w.cap_eff, 0,
        "root in its namespace has every capability there"
    );
    assert_eq!(
        w.attr_errno,
        libc::EINVAL,
        "a new project ID from a user namespace: {w:?}"
    );
    assert_eq!(w.errno, fs.limit_errno(), "it stays in the project: {w:?}");
    assert_eq!(quota::project_of(&file).unwrap().id, FIRST);
    figure(
        kind,
        format_args!(
            "a pod in its own user namespace (hostUsers: false): FS_IOC_FSSETXATTR to a new \
             project ID answers errno {} (EINVAL), clearing PROJINHERIT errno {}; its writer \
             stopped at the limit after {} bytes",
            w.attr_errno, d.attr_errno, w.bytes
        ),
    );
}

pub fn measure_the_quota_check_walk_per_10000_files(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let vol = fs.dir("vol");
    q.assign(
        &vol,
        FIRST,
        Limits {
            bytes: 64 * MIB,
            inodes: 0,
        },
    )
    .expect("assign");
    let (dirs, per_dir) = (100, 100);
    for d in 0..dirs {
        let dir = vol.join(format!("d{d}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..per_dir {
            std::fs::write(dir.join(format!("f{f}")), b"x").unwrap();
        }
    }
    // A hundred files taken out, as a pod would.
    for d in 0..dirs {
        let file = std::fs::File::open(vol.join(format!("d{d}/f0"))).unwrap();
        let mut attr = quota::sys::get_fsxattr(file.as_fd()).unwrap();
        attr.projid = 0;
        quota::sys::set_fsxattr(file.as_fd(), &attr).unwrap();
    }
    fs.sync();
    let mut walks = Vec::new();
    for cache in ["warm", "cold"] {
        if cache == "cold" {
            std::fs::write("/proc/sys/vm/drop_caches", b"3").expect("drop caches");
        }
        let walk = escape_walk::walk(&vol, FIRST, None, None, &mut |_| ControlFlow::Continue(()))
            .expect("walk");
        walks.push((cache, walk));
    }
    let (_, first) = &walks[0];
    assert_eq!(first.tally.inodes, 1 + dirs + dirs * per_dir);
    assert_eq!(
        (first.tally.other_project, first.tally.repaired),
        (dirs, dirs)
    );
    let (_, second) = &walks[1];
    assert!(!second.tally.found(), "all set back: {:?}", second.tally);
    for (cache, walk) in &walks {
        let per = 10_000.0 / walk.tally.inodes as f64;
        figure(
            kind,
            format_args!(
                "quota check walk, {cache} cache, {} inodes ({} escaped): {:.0} ms wall, {:.0} ms \
                 CPU; per 10,000 files {:.0} ms wall, {:.0} ms CPU",
                walk.tally.inodes,
                walk.tally.other_project,
                walk.wall.as_secs_f64() * 1e3,
                walk.cpu.as_secs_f64() * 1e3,
                walk.wall.as_secs_f64() * 1e3 * per,
                walk.cpu.as_secs_f64() * 1e3 * per,
            ),
        );
    }
}
