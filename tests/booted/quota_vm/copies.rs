//! Inside the VM: restores and clones held to the new volume's size as a pod's writes are —
//! the copy runs without CAP_SYS_RESOURCE, a source holding more than the size is refused
//! before anything is copied, and a full source fits at its own size.

use std::io::Write;

use csi_nodekit::linux::privilege;
use csi_nodekit::linux::quota::{self, FsKind};
use csi_nodekit::proto::csi::*;

use super::cases::{CAP_SYS_RESOURCE, FIRST, MIB, figure, open};
use super::enforce::writable_volume;
use super::fixtures::{NOBODY, Prep, TestFs, du, write_until_error};
use super::served::{Served, create_and_publish, remove, runtime};
use crate::common::csi_node::Csi;
use crate::common::csi_snapshots::{from_snapshot, from_volume, snapshot_request};

/// Appends to `file` in this process, on this thread, until an error or `cap` bytes: bytes
/// written and the errno (0: the cap).
fn write_here(file: &std::path::Path, cap: u64) -> (u64, i32) {
    let mut out = std::fs::File::create(file).expect("create");
    let chunk = vec![0x5au8; 64 << 10];
    let mut wrote = 0;
    while wrote < cap {
        match out.write(&chunk) {
            Ok(n) => wrote += n as u64,
            Err(e) => return (wrote, e.raw_os_error().unwrap_or(-1)),
        }
    }
    match out.sync_all() {
        Ok(()) => (wrote, 0),
        Err(e) => (wrote, e.raw_os_error().unwrap_or(-1)),
    }
}

pub fn root_without_cap_sys_resource_on_its_thread_stops_at_the_limit(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let limit = 4 * MIB;
    let vol = writable_volume(&fs, &q, FIRST, limit);
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    assert_ne!(
        eff & (1 << CAP_SYS_RESOURCE),
        0,
        "the case runs as root with it"
    );
    let (wrote, errno) =
        privilege::without_quota_override(|| write_here(&vol.join("copy"), 3 * limit))
            .expect("drop the capability");
    assert_eq!(
        errno,
        fs.limit_errno(),
        "root without CAP_SYS_RESOURCE stopped after {wrote} bytes"
    );
    fs.sync();
    let usage = q.usage(FIRST).unwrap().bytes;
    assert!(usage <= limit, "{usage} bytes charged, over {limit}");
    assert!(
        privilege::holds_quota_override(),
        "the case's thread kept it"
    );
    figure(
        kind,
        format_args!(
            "root without CAP_SYS_RESOURCE on its thread stopped at {usage} of {limit} bytes"
        ),
    );
}

async fn created(csi: &mut Csi, request: CreateVolumeRequest) -> Result<String, tonic::Status> {
    Ok(csi
        .controller
        .create_volume(request)
        .await?
        .into_inner()
        .volume
        .expect("volume")
        .volume_id)
}

async fn snapshot(csi: &mut Csi, name: &str, source: &str) -> String {
    csi.controller
        .create_snapshot(snapshot_request(name, source))
        .await
        .expect("create snapshot")
        .into_inner()
        .snapshot
        .expect("snapshot")
        .snapshot_id
}

pub fn restores_and_clones_hold_to_the_size_asked_for_and_a_full_source_fits_at_its_own(
    kind: FsKind,
) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let size = 8 * MIB;
    let served = Served::start(&fs, "state", &["--quota=on"]);
    runtime().block_on(async {
        let mut csi = served.client().await;
        let pod = served.pod("source");
        let source = create_and_publish(&mut csi, "pvc-source", size, &pod).await;
        let source_project = served.recorded_project(&source).expect("project");
        // Full, as a pod fills it.
        let w = write_until_error(&pod.target.join("fill"), 4 * size, NOBODY);
        assert_eq!(w.errno, fs.limit_errno(), "filled: {w:?}");
        fs.sync();
        let full = q.usage(source_project).unwrap().bytes;
        let snap_full = snapshot(&mut csi, "snap-full", &source).await;
        for (what, request) in [
            ("clone", from_volume("pvc-clone-full", size as i64, &source)),
            (
                "restore",
                from_snapshot("pvc-restore-full", size as i64, &snap_full),
            ),
        ] {
            let id = created(&mut csi, request)
                .await
                .unwrap_or_else(|e| panic!("{what} of a full volume at its own size: {e}"));
            fs.sync();
            let project = served.recorded_project(&id).expect("project");
            let usage = q.usage(project).unwrap();
            assert!(usage.bytes <= size, "{what}: {usage:?} over {size}");
            assert_eq!(usage.limits.bytes, size, "{what}: the headroom is gone");
            figure(
                kind,
                format_args!(
                    "{what} of a full volume ({full} bytes) at its own size: holds {} bytes",
                    usage.bytes
                ),
            );
        }
        // An escape: a directory moved out of the project (as the file's owner may), and
        // written past the size. Room is made first: XFS refuses a new directory in a full
        // project.
        std::fs::File::create(pod.target.join("fill")).unwrap();
        let escaped = pod.target.join("escaped");
        std::fs::create_dir(&escaped).unwrap();
        quota::clear_project(&escaped).unwrap();
        // Written outside every volume and moved in, not written there: node-server's write
        // watch sets a file written in a volume and out of its project back at once.
        let outside = fs.mnt.join("past");
        let (more, errno) = write_here(&outside, 4 * MIB);
        assert_eq!((more, errno), (4 * MIB, 0), "unlimited outside the project");
        // Moved once the watch has read those writes (every 50 ms): one it reads after the
        // move names the file where it is then, in the volume.
        std::thread::sleep(std::time::Duration::from_secs(1));
        let inside = served.volume_dir(&source).join("escaped/past");
        std::fs::rename(&outside, inside).expect("moved in on the filesystem's own mount");
        let w = write_until_error(&pod.target.join("fill"), 4 * size, NOBODY);
        assert_eq!(w.errno, fs.limit_errno(), "filled again: {w:?}");
        fs.sync();
        let (holds, _) = du(&served.volume_dir(&source));
        assert!(holds > size + 3 * MIB, "the source holds {holds}");
        let snap_over = snapshot(&mut csi, "snap-over", &source).await;
        for (what, request) in [
            ("clone", from_volume("pvc-clone-over", size as i64, &source)),
            (
                "restore",
                from_snapshot("pvc-restore-over", size as i64, &snap_over),
            ),
        ] {
            let refused = created(&mut csi, request)
                .await
                .expect_err("a source holding more than the size");
            assert_eq!(
                refused.code(),
                tonic::Code::OutOfRange,
                "{what}: {refused:?}"
            );
            assert!(
                refused.message().contains("holds"),
                "{what}: {}",
                refused.message()
            );
        }
        // At a size that holds it, the same restore is made, all of it charged.
        let id = created(
            &mut csi,
            from_snapshot("pvc-restore-bigger", (2 * size) as i64, &snap_over),
        )
        .await
        .expect("restore at a size that holds the source");
        fs.sync();
        let project = served.recorded_project(&id).expect("project");
        let usage = q.usage(project).unwrap();
        assert!(
            usage.bytes >= holds - MIB && usage.bytes <= 2 * size,
            "{usage:?}"
        );
        remove(&mut csi, &source, &pod).await;
    });
}
