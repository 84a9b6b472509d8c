//! Inside the VM: a quota'd volume's limit never silently left behind — an expansion while
//! sizes are not enforced is refused, and applied once they are; a deleted volume whose
//! project is still charged elsewhere keeps a one-block limit on it until that is gone; one a
//! crash cut short keeps its project until its set-aside data is removed.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use csi_nodekit::linux::privilege;
use csi_nodekit::linux::quota::{self, FsKind, Limits};
use csi_nodekit::proto::csi::*;

use super::cases::{MIB, figure, open};
use super::fixtures::{NOBODY, Prep, TestFs, write_until_error};
use super::lifecycle::record_gone;
use super::served::{Served, create_and_publish, expand, remove, runtime};
use crate::common::csi_node;

fn expand_request(id: &str, bytes: u64) -> ControllerExpandVolumeRequest {
    ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        ..Default::default()
    }
}

pub fn expanding_a_quotad_volume_under_quota_off_is_refused_and_applied_once_enforced(
    kind: FsKind,
) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let rt = runtime();
    let mut served = Served::start(&fs, "state", &["--quota=on"]);
    let pod = served.pod("a");
    let id = rt.block_on(async {
        let mut csi = served.client().await;
        create_and_publish(&mut csi, "pvc-a", 8 * MIB, &pod).await
    });
    let project = served.recorded_project(&id).expect("project");
    // Stopped, not dropped: its scratch directory holds the pod's mounts.
    assert_eq!(served.stop(), 0);
    let off = Served::start(&fs, "state", &["--quota=off"]);
    rt.block_on(async {
        let mut csi = off.client().await;
        let refused = csi
            .controller
            .controller_expand_volume(expand_request(&id, 16 * MIB))
            .await
            .expect_err("the limit would stay at 8 MiB");
        assert_eq!(
            refused.code(),
            tonic::Code::FailedPrecondition,
            "{refused:?}"
        );
        assert!(
            refused
                .message()
                .contains(&format!("project quota {project}")),
            "{}",
            refused.message()
        );
    });
    assert_eq!(
        q.usage(project).unwrap().limits.bytes,
        8 * MIB,
        "the limit in force"
    );
    drop(off);
    let mut on = Served::start(&fs, "state", &["--quota=on"]);
    rt.block_on(async {
        let mut csi = on.client().await;
        // Applied once sizes are enforced again.
        expand(&mut csi, &id, 16 * MIB, &pod.target).await;
        assert_eq!(q.usage(project).unwrap().limits.bytes, 16 * MIB);
        csi.unpublish_and_unstage(&id, &pod.target, &pod.staging)
            .await;
        csi.controller
            .delete_volume(csi_node::delete_request(&id))
            .await
            .expect("delete volume");
    });
    assert_eq!(on.stop(), 0);
}

/// Gives a file another project ID (`chattr -p`), as its owner may.
fn retag(file: &std::path::Path, id: u32) {
    use std::os::fd::AsFd;
    let file = std::fs::File::open(file).expect("open");
    let mut attr = quota::sys::get_fsxattr(file.as_fd()).expect("FS_IOC_FSGETXATTR");
    attr.projid = id;
    quota::sys::set_fsxattr(file.as_fd(), &attr).expect("FS_IOC_FSSETXATTR");
}

/// Appends to an open file on this thread without CAP_SYS_RESOURCE, as the pod that holds it
/// would: bytes written and the errno that stopped it.
fn append_unprivileged(file: &mut std::fs::File, cap: u64) -> (u64, i32) {
    privilege::without_quota_override(|| {
        let chunk = vec![0x3cu8; 64 << 10];
        let mut wrote = 0;
        while wrote < cap {
            match file
                .write(&chunk)
                .and_then(|n| file.sync_data().map(|()| n))
            {
                Ok(n) => wrote += n as u64,
                Err(e) => return (wrote, e.raw_os_error().unwrap_or(-1)),
            }
        }
        (wrote, 0)
    })
    .expect("drop CAP_SYS_RESOURCE")
}

/// Three volumes deleted: one whose pod's file was re-tagged into another pod's project (as
/// a file's owner may), one whose pod held a file open while an operator unmounted it with
/// `umount -l`, and a plain one. The first two keep a one-block limit (the file and the fd
/// write no further) and their IDs; the plain one is released at once; a start after the
/// leftovers are gone releases the other two.
pub fn a_deleted_volume_still_charged_elsewhere_keeps_a_one_block_limit_and_a_plain_delete_releases(
    kind: FsKind,
) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let rt = runtime();
    // The re-tagged file lives in the neighbour's volume, so the quota check's walk would set it
    // back into the neighbour's project (the escape repair, `escapes.rs`) and the deleted
    // volume's project would be left with nothing: its next pass is kept an hour away.
    let no_walk = ["--quota=on", "--quota-check-interval=1h"];
    let mut served = Served::start(&fs, "state", &no_walk);
    let (pod_a, neighbour) = (served.pod("a"), served.pod("n"));
    let (held, plain) = (served.pod("h"), served.pod("p"));
    let (a, b, c) = rt.block_on(async {
        let mut csi = served.client().await;
        let a = create_and_publish(&mut csi, "pvc-a", 8 * MIB, &pod_a).await;
        let b = create_and_publish(&mut csi, "pvc-b", 8 * MIB, &neighbour).await;
        let c = create_and_publish(&mut csi, "pvc-c", 8 * MIB, &held).await;
        (a, b, c)
    });
    let project = |id: &str| served.recorded_project(id).expect("project");
    let (pa, pc) = (project(&a), project(&c));
    // B's pod writes 1 MiB and re-tags the file into A's project.
    let moved = neighbour.target.join("moved");
    let w = write_until_error(&moved, MIB, NOBODY);
    assert_eq!((w.bytes, w.errno), (MIB, 0), "{w:?}");
    // Re-tagged once node-server's write watch has looked at those writes (every 50 ms): it
    // would set a file written in B back into B's project.
    std::thread::sleep(Duration::from_secs(1));
    retag(&moved, pa);
    // C's pod writes 1 MiB and keeps it open; the operator unmounts lazily.
    let open_file = held.target.join("open");
    assert_eq!(write_until_error(&open_file, MIB, NOBODY).errno, 0);
    let mut fd = std::fs::OpenOptions::new()
        .append(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&open_file)
        .expect("hold the file open");
    for path in [&held.target, &held.staging] {
        nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH).expect("umount -l");
    }
    let delete_took = rt.block_on(async {
        let mut csi = served.client().await;
        remove(&mut csi, &a, &pod_a).await;
        remove(&mut csi, &c, &held).await;
        let pod = &plain;
        let d = create_and_publish(&mut csi, "pvc-d", 8 * MIB, pod).await;
        let pd = project(&d);
        let w = write_until_error(&pod.target.join("fill"), 2 * MIB, NOBODY);
        assert_eq!(w.errno, 0, "{w:?}");
        csi.unpublish_and_unstage(&d, &pod.target, &pod.staging)
            .await;
        let started = Instant::now();
        let delete = csi.controller.delete_volume(csi_node::delete_request(&d));
        delete.await.expect("delete volume");
        let took = started.elapsed();
        // At once, with nothing polled here: usage 0, limits 0.
        let left = q.usage(pd).unwrap();
        assert_eq!(
            (left.bytes, left.inodes, left.limits),
            (0, 0, Limits::default()),
            "a plain delete releases its project"
        );
        assert!(record_gone(&q, pd), "project {pd} still in use");
        took
    });
    // Inodes at what is left: the re-tagged file; the held file and the volume's root, which
    // the detached mount still holds.
    for (what, id, p, inodes) in [("re-tagged", &a, pa, 1), ("held open", &c, pc, 2)] {
        let usage = q.usage(p).unwrap();
        assert!(usage.bytes >= MIB, "{what}: {usage:?}");
        let kept = Limits {
            bytes: 4096,
            inodes,
        };
        assert_eq!(usage.inodes, inodes, "{what}: {usage:?}");
        assert_eq!(usage.limits, kept, "{what}: a one-block limit kept");
        assert_eq!(q.next_in_use(p).unwrap(), Some(p), "{what}: its ID taken");
        assert_eq!(
            served.recorded_project(id),
            Some(p),
            "{what}: its record stays"
        );
        assert!(!served.volume_dir(id).exists(), "{what}: its data is gone");
    }
    let logs = served.logs();
    for p in [pa, pc] {
        let line = format!("still charged to its project quota {p}:");
        assert_eq!(logs.matches(&line).count(), 1, "said once: {logs}");
    }
    // What is left writes no further.
    let w = write_until_error(&moved, 8 * MIB, NOBODY);
    assert_eq!(w.errno, fs.limit_errno(), "the re-tagged file: {w:?}");
    assert!(w.bytes <= 64 << 10, "{w:?}");
    let (fd_bytes, fd_errno) = append_unprivileged(&mut fd, 8 * MIB);
    assert_eq!(
        fd_errno,
        fs.limit_errno(),
        "the held fd after {fd_bytes} bytes"
    );
    assert!(fd_bytes <= 64 << 10, "{fd_bytes}");
    figure(
        kind,
        format_args!(
            "deleted volume still charged elsewhere: kept at one block; the re-tagged file then \
             wrote {} bytes, the fd held past umount -l {fd_bytes} bytes; a plain DeleteVolume \
             (2 MiB written) took {:.0} ms with its project released at once",
            w.bytes,
            delete_took.as_secs_f64() * 1e3
        ),
    );
    // Gone: the next start releases both.
    drop(fd);
    std::fs::remove_file(&moved).unwrap();
    served.restart();
    for (id, p) in [(&a, pa), (&c, pc)] {
        assert!(record_gone(&q, p), "project {p} still in use");
        let record = served.state.join("meta").join(format!("{id}.json"));
        assert!(!record.exists(), "{} stays", record.display());
    }
    rt.block_on(async {
        let mut csi = served.client().await;
        remove(&mut csi, &b, &neighbour).await;
    });
    assert_eq!(served.stop(), 0);
}

/// A deletion that a crash cut short after its mark, its data still there: the next start
/// sets the data aside before serving, keeps the volume's project (its ID not reused) while
/// the set-aside files still charge it (the CO's retried DeleteVolume answered at once), and
/// releases the project and the record once they are removed in the background, never
/// calling its own files "elsewhere".
pub fn a_deletion_cut_short_ends_once_its_set_aside_data_is_removed(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let rt = runtime();
    let mut served = Served::start(&fs, "state", &["--quota=on"]);
    let pod = served.pod("a");
    let id = rt.block_on(async {
        let mut csi = served.client().await;
        let id = create_and_publish(&mut csi, "pvc-cut", 16 * MIB, &pod).await;
        // Written by root, charged to the project all the same (4 MiB of its 16).
        for i in 0..256 {
            std::fs::write(pod.target.join(format!("f{i}")), [7u8; 16 << 10]).unwrap();
        }
        csi.unpublish_and_unstage(&id, &pod.target, &pod.staging)
            .await;
        id
    });
    let p = served.recorded_project(&id).expect("project");
    assert_eq!(served.stop(), 0);
    // The mark, as a crash just after it leaves it.
    let record = served.state.join("meta").join(format!("{id}.json"));
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    json["deleting"] = serde_json::Value::Bool(true);
    std::fs::write(&record, serde_json::to_vec(&json).unwrap()).unwrap();
    let charged = q.usage(p).unwrap();
    assert!(charged.inodes > 256, "{charged:?}");

    let started = Instant::now();
    served.restart();
    assert!(!served.volume_dir(&id).exists(), "set aside before serving");
    let listed = rt.block_on(async {
        let mut csi = served.client().await;
        let listed = csi.list().await;
        // The CO's retry of the DeleteVolume the crash cut short, likely while the removal
        // runs: answered OK at once.
        let retry = csi.controller.delete_volume(csi_node::delete_request(&id));
        retry.await.expect("the retried DeleteVolume");
        listed
    });
    assert!(listed.iter().all(|v| v.volume_id != id), "{listed:?}");
    let finished = format!("finished deleting volume {id}");
    let ended = crate::common::wait_until_blocking(std::time::Duration::from_secs(60), || {
        !record.exists() && record_gone(&q, p) && served.logs().contains(&finished)
    });
    let took = started.elapsed();
    let logs = served.logs();
    assert!(ended, "record or project {p} kept, or not said:\n{logs}");
    assert!(
        !logs.contains("still charged"),
        "its own files called elsewhere:\n{logs}"
    );
    figure(
        kind,
        format_args!(
            "a deletion cut short ({} inodes, {} bytes left): ended {:.0} ms after the restart, \
             its project released once the set-aside data was removed",
            charged.inodes,
            charged.bytes,
            took.as_secs_f64() * 1e3
        ),
    );
    assert_eq!(served.stop(), 0);
}
