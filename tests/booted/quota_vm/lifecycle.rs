//! Inside the VM: the bookkeeping — stats against `du`, the allocator against IDs already
//! in use, release, the device-path fallback, unprepared filesystems, and the cost figures.

use std::time::{Duration, Instant};

use csi_nodekit::linux::quota::{
    self, Access, Decision, FsKind, Limits, Mode, Order, PROJECT_IDS, ProjectIds, QuotaFs, Support,
};

use super::cases::{FIRST, MIB, figure, open, prepared_volume};
use super::fixtures::{Prep, TestFs, du};

pub fn usage_and_inodes_match_the_blocks_of_the_tree(kind: FsKind) {
    let (fs, q, vol) = prepared_volume(kind, 64 * MIB, 1000);
    for (name, size) in [
        ("empty", 0),
        ("byte", 1),
        ("page", 4096),
        ("odd", 12_345),
        ("big", 3 * MIB as usize),
    ] {
        std::fs::write(vol.join(name), vec![7u8; size]).unwrap();
    }
    std::fs::create_dir_all(vol.join("d1/d2/d3")).unwrap();
    for i in 0..40 {
        std::fs::write(vol.join(format!("d1/d2/f{i}")), vec![1u8; 1000 * i]).unwrap();
    }
    let sparse = std::fs::File::create(vol.join("sparse")).unwrap();
    sparse.set_len(32 * MIB).unwrap();
    std::os::unix::fs::FileExt::write_at(&sparse, b"tail", 32 * MIB - 4).unwrap();
    drop(sparse);
    fs.sync();
    let usage = q.usage(FIRST).expect("usage");
    let (bytes, inodes) = du(&vol);
    assert_eq!(usage.inodes, inodes, "quota inodes vs the tree");
    assert_eq!(usage.bytes, bytes, "quota bytes vs the sum of st_blocks");
    assert_eq!(
        usage.limits,
        Limits {
            bytes: 64 * MIB,
            inodes: 1000
        }
    );
    figure(
        kind,
        format_args!(
            "stats: {} bytes in {} inodes, equal to du",
            usage.bytes, usage.inodes
        ),
    );
}

pub fn df_on_the_directory_shows_the_project_limit_not_the_filesystem(kind: FsKind) {
    let (fs, q, vol) = prepared_volume(kind, 24 * MIB, 500);
    std::fs::write(vol.join("data"), vec![3u8; 5 * MIB as usize]).unwrap();
    fs.sync();
    let used = q.usage(FIRST).unwrap();
    // What `df` inside a pod sees: statfs on the volume's mount reports the project's limit
    // as the size, and the limit less the usage as free, on XFS and ext4 alike.
    let st = nix::sys::statvfs::statvfs(&vol).expect("statvfs");
    let unit = st.fragment_size() as u64;
    assert_eq!(st.blocks() as u64 * unit, 24 * MIB, "size");
    assert_eq!(
        st.blocks_available() as u64 * unit,
        24 * MIB - used.bytes,
        "available"
    );
    assert_eq!(st.files() as u64, 500, "inodes");
    assert_eq!(st.files_free() as u64, 500 - used.inodes, "free inodes");
    let whole = nix::sys::statvfs::statvfs(&fs.mnt).expect("statvfs of the filesystem");
    assert!(
        whole.blocks() as u64 * whole.fragment_size() as u64 > 100 * MIB,
        "the filesystem's own size"
    );
}

pub fn the_allocator_skips_ids_already_in_use_and_survives_a_restart(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    // An administrator's project with limits but no directory, one tagged on a directory
    // by hand (as the kubelet does for emptyDir), and one only listed in /etc/projid.
    q.set_limits(
        FIRST,
        Limits {
            bytes: MIB,
            inodes: 0,
        },
    )
    .expect("admin limit");
    let admin_dir = fs.dir("admin");
    quota::set_project(&admin_dir, FIRST + 1).expect("admin project");
    let listed: std::collections::BTreeSet<u32> =
        quota::ids::parse_listed("backups:1073741826\n").collect();
    let mut ids = ProjectIds::new(PROJECT_IDS, [])
        .avoiding(listed.clone())
        .in_order(Order::LowestFirst);
    let id = ids.allocate(&q).expect("allocate");
    assert_eq!(id, FIRST + 3, "IDs in use: {FIRST}..={}", FIRST + 2);
    let vol = fs.dir("vol");
    q.assign(
        &vol,
        id,
        Limits {
            bytes: MIB,
            inodes: 0,
        },
    )
    .expect("assign");
    // A restart: a new allocator that knows the recorded ID, and one that does not (a lost
    // record) — the filesystem scan still sees the tagged directory.
    let mut restarted = ProjectIds::new(PROJECT_IDS, [id])
        .avoiding(listed)
        .in_order(Order::LowestFirst);
    let mut forgetful = ProjectIds::new(PROJECT_IDS, []).in_order(Order::LowestFirst);
    let next = restarted.allocate(&q).expect("allocate after restart");
    assert_eq!(next, FIRST + 4);
    assert_ne!(forgetful.allocate(&q).expect("allocate"), id);
}

pub fn release_clears_the_limit_and_deletion_frees_the_id(kind: FsKind) {
    let (fs, q, vol) = prepared_volume(kind, 8 * MIB, 50);
    std::fs::write(vol.join("data"), vec![0u8; 100_000]).unwrap();
    fs.sync();
    assert_eq!(q.next_in_use(FIRST).unwrap(), Some(FIRST));
    q.release(Some(&vol), FIRST).expect("release");
    assert_eq!(
        q.usage(FIRST).unwrap().limits,
        Limits::default(),
        "limits cleared"
    );
    let attr = quota::project_of(&vol).unwrap();
    assert_eq!(
        (attr.id, attr.inherit),
        (0, false),
        "directory back in project 0"
    );
    std::fs::remove_dir_all(&vol).unwrap();
    fs.sync();
    assert!(record_gone(&q, FIRST), "a quota record is left for {FIRST}");
    let mut ids = ProjectIds::new(PROJECT_IDS, []).in_order(Order::LowestFirst);
    assert_eq!(
        ids.allocate(&q).unwrap(),
        FIRST,
        "the freed ID is free on the filesystem"
    );
    // Releasing a volume whose directory is already gone only clears the limits.
    q.set_limits(
        FIRST + 5,
        Limits {
            bytes: MIB,
            inodes: 0,
        },
    )
    .unwrap();
    q.release(Some(&fs.mnt.join("gone")), FIRST + 5)
        .expect("release without a directory");
    assert_eq!(q.usage(FIRST + 5).unwrap().limits, Limits::default());
}

pub fn the_device_path_fallback_sees_the_same_quota(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let by_fd = open(&fs);
    let by_dev = QuotaFs::open_via_device(&fs.mnt).expect("open via the device");
    assert_eq!(by_dev.access(), Access::Device);
    assert_eq!(by_dev.support().unwrap(), Support::Enforcing);
    let vol = fs.dir("vol");
    by_dev
        .assign(
            &vol,
            FIRST,
            Limits {
                bytes: 2 * MIB,
                inodes: 9,
            },
        )
        .expect("assign via the device");
    std::fs::write(vol.join("f"), vec![1u8; 50_000]).unwrap();
    fs.sync();
    assert_eq!(by_fd.usage(FIRST).unwrap(), by_dev.usage(FIRST).unwrap());
    assert_eq!(
        by_fd.usage(FIRST).unwrap().limits,
        Limits {
            bytes: 2 * MIB,
            inodes: 9
        }
    );
    assert_eq!(by_dev.next_in_use(FIRST).unwrap(), Some(FIRST));
}

pub fn an_unprepared_filesystem_is_not_enforcing_and_on_refuses_it(kind: FsKind) {
    let prep = match kind {
        FsKind::Xfs => Prep::Plain,
        FsKind::Ext4 => Prep::FeaturesOnly,
    };
    let fs = TestFs::new(kind, prep);
    let q = open(&fs);
    let support = q.support().expect("support");
    match (kind, &support) {
        (FsKind::Xfs, Support::Unsupported { why }) => assert!(why.contains("prjquota"), "{why}"),
        (FsKind::Ext4, Support::AccountingOnly { why }) => {
            assert!(why.contains("prjquota"), "{why}")
        }
        _ => panic!("{kind:?} without prjquota: {support:?}"),
    }
    let refused = quota::decide(Mode::On, || q.support());
    assert!(matches!(refused, Decision::Refuse { .. }), "{refused:?}");
    println!("--quota=on refuses: {}", refused.reason().unwrap());
    assert!(matches!(
        quota::decide(Mode::Auto, || q.support()),
        Decision::AccountOnly { .. }
    ));
}

pub fn without_the_project_feature_directories_cannot_get_a_project() {
    let fs = TestFs::new(FsKind::Ext4, Prep::Plain);
    let q = open(&fs);
    assert!(matches!(q.support().unwrap(), Support::Unsupported { .. }));
    let vol = fs.dir("vol");
    let err = quota::set_project(&vol, FIRST).expect_err("no project feature");
    assert!(
        err.to_string()
            .starts_with(&format!("set project ID of {}", vol.display())),
        "{err}"
    );
}

pub fn measure_create_and_delete_cost_against_a_plain_directory(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    const N: u32 = 100;
    let mut ids = ProjectIds::new(PROJECT_IDS, []);
    let limits = Limits {
        bytes: 64 * MIB,
        inodes: 0,
    };
    // Plain and quota'd volumes alternate, so load on the host weighs on both alike; the
    // quota calls (allocate + assign, release) are also timed on their own.
    let (mut plain, mut quotad, mut calls) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for i in 0..N {
        let started = Instant::now();
        let dir = fs.mnt.join(format!("plain-{i}"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("f"), b"data").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        plain += started.elapsed();

        let started = Instant::now();
        let dir = fs.mnt.join(format!("quota-{i}"));
        std::fs::create_dir(&dir).unwrap();
        let call = Instant::now();
        let id = ids.allocate(&q).unwrap();
        q.assign(&dir, id, limits).unwrap();
        calls += call.elapsed();
        std::fs::write(dir.join("f"), b"data").unwrap();
        assert_eq!(quota::project_of(&dir.join("f")).unwrap().id, id);
        std::fs::remove_dir_all(&dir).unwrap();
        let call = Instant::now();
        q.release(None, id).unwrap();
        ids.free(id);
        calls += call.elapsed();
        quotad += started.elapsed();
    }
    let per = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(N);
    figure(
        kind,
        format_args!(
            "create+write+delete of a volume, mean of {N} (TCG, not native speed): plain {:.0} µs, \
             quota'd {:.0} µs, of which the quota calls {:.0} µs",
            per(plain),
            per(quotad),
            per(calls)
        ),
    );
}

/// Waits for `id`'s quota record to go (ext4 may drop an emptied record from the quota file
/// a moment after the last reference).
pub fn record_gone(q: &QuotaFs, id: u32) -> bool {
    for _ in 0..50 {
        if q.next_in_use(id).unwrap() != Some(id) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    false
}
