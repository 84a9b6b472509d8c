//! Inside the VM: what a workload meets — inheritance, the hard limits (bytes and inodes)
//! for a process without CAP_SYS_RESOURCE, raising a limit online, and root's exception.

use std::os::unix::fs::chown;

use csi_nodekit::linux::quota::{self, Access, Decision, FsKind, Limits, Mode, QuotaFs, Support};

use super::cases::{CAP_SYS_RESOURCE, FIRST, MIB, figure, open, prepared_volume};
use super::fixtures::{NOBODY, Prep, TestFs, Written, create_until_error, write_until_error};

pub fn a_prepared_filesystem_is_detected_as_enforcing(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    assert_eq!(q.kind(), Some(kind));
    assert_eq!(q.access(), Access::Fd, "Linux 6.1 has quotactl_fd");
    assert_eq!(q.support().expect("support"), Support::Enforcing);
    assert_eq!(quota::decide(Mode::On, || q.support()), Decision::Enforce);
}

pub fn new_files_and_directories_inherit_the_project(kind: FsKind) {
    let (fs, _q, vol) = prepared_volume(kind, 16 * MIB, 0);
    let attr = quota::project_of(&vol).expect("project of vol");
    assert_eq!((attr.id, attr.inherit), (FIRST, true));
    std::fs::write(vol.join("file"), b"x").unwrap();
    std::fs::create_dir_all(vol.join("a/b")).unwrap();
    std::fs::write(vol.join("a/b/deep"), b"y").unwrap();
    for entry in ["file", "a", "a/b", "a/b/deep"] {
        let attr = quota::project_of(&vol.join(entry)).expect("project of entry");
        assert_eq!(attr.id, FIRST, "{entry} did not inherit the project");
    }
    assert!(
        quota::project_of(&vol.join("a/b")).unwrap().inherit,
        "subdirectories inherit PROJINHERIT"
    );
    // A file from outside cannot be renamed in: the kernel answers EXDEV (mv then copies,
    // and the copy is charged to the project).
    std::fs::write(fs.mnt.join("outside"), b"z").unwrap();
    let err = std::fs::rename(fs.mnt.join("outside"), vol.join("moved"))
        .expect_err("rename into a project");
    assert_eq!(err.raw_os_error(), Some(libc::EXDEV), "{err}");
}

/// A volume directory owned by the unprivileged writer, with a limit.
pub fn writable_volume(fs: &TestFs, q: &QuotaFs, id: u32, limit: u64) -> std::path::PathBuf {
    let vol = fs.dir(&format!("vol-{id}"));
    chown(&vol, Some(NOBODY), Some(NOBODY)).expect("chown");
    q.assign(
        &vol,
        id,
        Limits {
            bytes: limit,
            inodes: 0,
        },
    )
    .expect("assign");
    vol
}

/// Checks that a writer stopped at `limit` with the filesystem's errno; returns how far
/// past the room left it got (negative: it stopped short).
pub fn assert_stopped_at(
    fs: &TestFs,
    q: &QuotaFs,
    id: u32,
    limit: u64,
    before: u64,
    w: &Written,
) -> i64 {
    assert_eq!(w.cap_eff, 0, "the writer must have no capabilities");
    assert_eq!(
        w.errno,
        fs.limit_errno(),
        "writer stopped with errno {} after {} bytes",
        w.errno,
        w.bytes
    );
    fs.sync();
    let usage = q.usage(id).expect("usage");
    assert!(
        usage.bytes <= limit,
        "usage {} exceeds the limit {limit}",
        usage.bytes
    );
    let overshoot = (before + w.bytes) as i64 - limit as i64;
    assert!(
        overshoot.abs() <= MIB as i64,
        "stopped {overshoot} bytes from the limit"
    );
    overshoot
}

pub fn an_unprivileged_writer_stops_at_the_hard_limit(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let limit = 8 * MIB;
    let vol = writable_volume(&fs, &q, FIRST, limit);
    let before = q.usage(FIRST).unwrap().bytes;
    let w = write_until_error(&vol.join("fill"), 4 * limit, NOBODY);
    let overshoot = assert_stopped_at(&fs, &q, FIRST, limit, before, &w);
    figure(
        kind,
        format_args!(
            "writer stopped at {} of {limit} bytes: overshoot={overshoot} bytes",
            before + w.bytes
        ),
    );
}

pub fn concurrent_writers_together_stop_at_the_hard_limit(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let limit = 8 * MIB;
    let vol = writable_volume(&fs, &q, FIRST, limit);
    let before = q.usage(FIRST).unwrap().bytes;
    let writers: Vec<_> = (0..4)
        .map(|i| {
            let file = vol.join(format!("fill-{i}"));
            std::thread::spawn(move || write_until_error(&file, 4 * limit, NOBODY))
        })
        .collect();
    let mut total = 0;
    for writer in writers {
        let w = writer.join().expect("writer thread");
        assert_eq!((w.cap_eff, w.errno), (0, fs.limit_errno()), "{w:?}");
        total += w.bytes;
    }
    fs.sync();
    let usage = q.usage(FIRST).unwrap().bytes;
    assert!(usage <= limit, "usage {usage} exceeds the limit {limit}");
    let overshoot = (before + total) as i64 - limit as i64;
    assert!(
        overshoot.abs() <= MIB as i64,
        "stopped {overshoot} bytes from the limit"
    );
    figure(
        kind,
        format_args!(
            "4 concurrent writers stopped at {} of {limit} bytes: overshoot={overshoot} bytes",
            before + total
        ),
    );
}

pub fn raising_the_limit_lets_the_writer_continue(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let vol = writable_volume(&fs, &q, FIRST, 4 * MIB);
    let file = vol.join("fill");
    let first = write_until_error(&file, 64 * MIB, NOBODY);
    assert_eq!(first.errno, fs.limit_errno());
    q.set_limits(
        FIRST,
        Limits {
            bytes: 12 * MIB,
            inodes: 0,
        },
    )
    .expect("raise");
    assert_eq!(q.usage(FIRST).unwrap().limits.bytes, 12 * MIB);
    fs.sync();
    let before = q.usage(FIRST).unwrap().bytes;
    let second = write_until_error(&file, 64 * MIB, NOBODY);
    assert!(
        second.bytes >= 7 * MIB,
        "after the raise it wrote only {} bytes",
        second.bytes
    );
    let overshoot = assert_stopped_at(&fs, &q, FIRST, 12 * MIB, before, &second);
    figure(
        kind,
        format_args!(
            "after raising 4 to 12 MiB the writer went on for {} bytes: overshoot={overshoot} bytes",
            second.bytes
        ),
    );
}

pub fn an_inode_limit_stops_file_creation(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let vol = fs.dir("vol");
    chown(&vol, Some(NOBODY), Some(NOBODY)).expect("chown");
    // The directory itself is one of the 20 inodes.
    q.assign(
        &vol,
        FIRST,
        Limits {
            bytes: 0,
            inodes: 20,
        },
    )
    .expect("assign");
    let w = create_until_error(&vol, 1000, NOBODY);
    assert_eq!(w.cap_eff, 0);
    assert_eq!(
        (w.bytes, w.errno),
        (19, fs.limit_errno()),
        "files created, errno"
    );
    let usage = q.usage(FIRST).unwrap();
    assert_eq!(
        (usage.inodes, usage.limits.inodes, usage.limits.bytes),
        (20, 20, 0)
    );
}

pub fn a_root_writer_with_cap_sys_resource_behaves_as_documented(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let limit = 4 * MIB;
    let vol = writable_volume(&fs, &q, FIRST, limit);
    let w = write_until_error(&vol.join("fill"), 3 * limit, 0);
    assert_ne!(
        w.cap_eff & (1 << CAP_SYS_RESOURCE),
        0,
        "root keeps CAP_SYS_RESOURCE"
    );
    match kind {
        // XFS enforces project limits on everyone.
        FsKind::Xfs => assert_eq!(w.errno, libc::ENOSPC, "root on XFS wrote {} bytes", w.bytes),
        // ext4 lets CAP_SYS_RESOURCE exceed quotas (pods do not have it by default).
        FsKind::Ext4 => assert_eq!((w.errno, w.bytes), (0, 3 * limit), "root on ext4"),
    }
}
