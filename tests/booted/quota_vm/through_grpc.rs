//! Inside the VM: node-server itself (the real binary) holding volumes to their sizes, driven
//! through gRPC as the external-provisioner, the external-resizer and the kubelet drive it,
//! with a pod's writer (no capabilities) in the published path.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use csi_nodekit::linux::quota::{self, FsKind, Limits};
use csi_nodekit::proto::csi::*;

use super::cases::{FIRST, MIB, figure, open};
use super::enforce::assert_stopped_at;
use super::fixtures::{NOBODY, Prep, TestFs, du, write_until_error};
use super::lifecycle::record_gone;
use super::served::{Served, create_and_publish, expand, remove, runtime, stats};
use crate::common::csi_node::{self, rwo, unpublish_request};

pub fn node_server_holds_a_published_volume_to_its_size_and_expansion_raises_it(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let served = Served::start(&fs, "state", &["--quota=on"]);
    runtime().block_on(async {
        let mut csi = served.client().await;
        let pod = served.pod("a");
        let id = create_and_publish(&mut csi, "pvc-a", 8 * MIB, &pod).await;
        let project = served.recorded_project(&id).expect("a recorded project ID");
        let dir = served.volume_dir(&id);
        assert_eq!(quota::project_of(&dir).unwrap().id, project);
        let file = pod.target.join("fill");
        for (limit, step) in [(8 * MIB, "at the size"), (16 * MIB, "after expansion")] {
            let before = q.usage(project).unwrap().bytes;
            let w = write_until_error(&file, 64 * MIB, NOBODY);
            let overshoot = assert_stopped_at(&fs, &q, project, limit, before, &w);
            figure(
                kind,
                format_args!(
                    "node-server volume, a pod's writer {step}: stopped at {} of {limit} bytes: \
                     overshoot={overshoot} bytes",
                    before + w.bytes
                ),
            );
            fs.sync();
            let (bytes, inodes, message) = stats(&mut csi, &id, &pod.target).await;
            let (du_bytes, du_inodes) = du(&dir);
            assert_eq!(
                (
                    bytes.used as u64,
                    bytes.total as u64,
                    bytes.available as u64
                ),
                (du_bytes, limit, limit - du_bytes),
                "stats bytes (used, total, available) against du and the limit"
            );
            assert_eq!(inodes.used as u64, du_inodes, "stats inodes against du");
            assert!(
                message.contains(&format!("project quota {project}")),
                "{message}"
            );
            // What df in the pod shows: the volume, not the host's filesystem.
            let df = nix::sys::statvfs::statvfs(&pod.target).expect("statvfs");
            assert_eq!(df.blocks() as u64 * df.fragment_size() as u64, limit);
            if limit == 8 * MIB {
                expand(&mut csi, &id, 16 * MIB, &pod.target).await;
                assert_eq!(q.usage(project).unwrap().limits.bytes, 16 * MIB);
            }
        }
        remove(&mut csi, &id, &pod).await;
    });
}

pub fn node_server_finds_its_project_ids_after_a_restart_avoids_others_and_frees_them(
    kind: FsKind,
) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    // An administrator's project from before node-server ever ran.
    let admin = fs.dir("admin");
    let admin_limits = Limits {
        bytes: MIB,
        inodes: 0,
    };
    q.assign(&admin, FIRST, admin_limits)
        .expect("admin project");
    let mut served = Served::start(&fs, "state", &["--quota=auto"]);
    let rt = runtime();
    let pod = served.pod("a");
    let a = rt.block_on(async {
        let mut csi = served.client().await;
        create_and_publish(&mut csi, "pvc-a", 4 * MIB, &pod).await
    });
    let a_project = served.recorded_project(&a).expect("recorded");
    // Random, so a pod cannot guess its neighbour's; never the administrator's.
    assert!(
        quota::PROJECT_IDS.contains(&a_project) && a_project != FIRST,
        "{a_project}"
    );
    // A crash between the record and the tagging, played by undoing the tagging while
    // node-server is down: the next start finishes it.
    assert_eq!(served.stop(), 0);
    q.release(Some(&served.volume_dir(&a)), a_project).unwrap();
    served.restart();
    assert_eq!(
        quota::project_of(&served.volume_dir(&a)).unwrap().id,
        a_project
    );
    assert_eq!(q.usage(a_project).unwrap().limits.bytes, 4 * MIB);
    let before = q.usage(a_project).unwrap().bytes;
    let w = write_until_error(&pod.target.join("fill"), 16 * MIB, NOBODY);
    assert_stopped_at(&fs, &q, a_project, 4 * MIB, before, &w);
    rt.block_on(async {
        let mut csi = served.client().await;
        let (bytes, _, message) = stats(&mut csi, &a, &pod.target).await;
        assert_eq!(bytes.total as u64, 4 * MIB);
        assert!(
            message.contains(&format!("project quota {a_project}")),
            "{message}"
        );
        let b = csi_node::create(&mut csi, "pvc-b", MIB as i64).await;
        let b_project = served.recorded_project(&b).expect("recorded");
        assert!(
            b_project != FIRST && b_project.abs_diff(a_project) > 1,
            "not the next after a's {a_project}: {b_project}"
        );
        // Deletion frees the ID (handed out again once the kernel has dropped its record:
        // the allocator's unit tests).
        remove(&mut csi, &a, &pod).await;
        assert!(!served.volume_dir(&a).exists());
        assert!(
            record_gone(&q, a_project),
            "project {a_project} still in use"
        );
        let c = csi_node::create(&mut csi, "pvc-c", MIB as i64).await;
        let c_project = served.recorded_project(&c).expect("recorded");
        assert!(![FIRST, b_project].contains(&c_project), "{c_project}");
    });
    assert_eq!(quota::project_of(&admin).unwrap().id, FIRST, "untouched");
    assert_eq!(q.usage(FIRST).unwrap().limits, admin_limits, "untouched");
}

pub fn an_ephemeral_inline_volume_with_a_size_is_held_to_it(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let served = Served::start(&fs, "state", &["--quota=auto"]);
    let pod = served.pod("inline");
    let id = "csi-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    runtime().block_on(async {
        let mut csi = served.client().await;
        let publish = NodePublishVolumeRequest {
            volume_id: id.into(),
            target_path: pod.target.display().to_string(),
            volume_capability: Some(rwo()),
            volume_context: HashMap::from([
                ("csi.storage.k8s.io/ephemeral".into(), "true".into()),
                ("size".into(), "4Mi".into()),
            ]),
            ..Default::default()
        };
        csi.node
            .node_publish_volume(publish)
            .await
            .expect("publish");
        let project = served.recorded_project(id).expect("recorded");
        let before = q.usage(project).unwrap().bytes;
        let w = write_until_error(&pod.target.join("fill"), 16 * MIB, NOBODY);
        assert_stopped_at(&fs, &q, project, 4 * MIB, before, &w);
        let (bytes, _, _) = stats(&mut csi, id, &pod.target).await;
        assert_eq!(bytes.total as u64, 4 * MIB);
        csi.node
            .node_unpublish_volume(unpublish_request(id, &pod.target))
            .await
            .expect("unpublish");
        assert!(!served.volume_dir(id).exists(), "removed at unpublish");
        assert!(record_gone(&q, project), "project {project} still in use");
    });
}

pub fn node_server_on_an_unprepared_filesystem_refuses_quota_on_and_auto_says_why(kind: FsKind) {
    let prep = match kind {
        FsKind::Xfs => Prep::Plain,
        FsKind::Ext4 => Prep::FeaturesOnly,
    };
    let fs = TestFs::new(kind, prep);
    let scratch = tempfile::tempdir().unwrap();
    let socket = scratch.path().join("on.sock");
    let flags = ["--node-id=vm", "--quota=on"];
    let out = crate::common::node_server_output(&socket, &fs.mnt.join("on"), &flags);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.contains("--quota=on") && stderr.contains("prjquota"),
        "{stderr}"
    );
    println!("--quota=on refuses: {stderr}");

    let served = Served::start(&fs, "auto", &["--quota=auto"]);
    let logs = served.logs();
    assert_eq!(
        logs.matches("accounted, not enforced").count(),
        1,
        "said once: {logs}"
    );
    runtime().block_on(async {
        let mut csi = served.client().await;
        // Under auto no directory volume is made whose size would not hold.
        let request = crate::common::csi_node::create_request("pvc-a", (4 * MIB) as i64);
        let refused = csi.controller.create_volume(request).await.unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::FailedPrecondition,
            "{refused:?}"
        );
        assert!(
            refused.message().contains("--quota=off"),
            "{}",
            refused.message()
        );
    });
    // With --quota=off such sizes are meant: accounted only.
    let served = Served::start(&fs, "off", &["--quota=off"]);
    runtime().block_on(async {
        let mut csi = served.client().await;
        let pod = served.pod("a");
        let id = create_and_publish(&mut csi, "pvc-a", 4 * MIB, &pod).await;
        assert_eq!(served.recorded_project(&id), None);
        // Today's accounting: the writer is not stopped at the size.
        let w = write_until_error(&pod.target.join("fill"), 8 * MIB, NOBODY);
        assert_eq!((w.errno, w.bytes), (0, 8 * MIB), "{w:?}");
        let (bytes, _, message) = stats(&mut csi, &id, &pod.target).await;
        assert!(bytes.total as u64 > 4 * MIB, "the filesystem's figures");
        assert!(
            message.contains("shared filesystem") && message.contains("--quota=off"),
            "{message}"
        );
        remove(&mut csi, &id, &pod).await;
    });
}

pub fn measure_create_and_delete_through_grpc_quotad_against_plain(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Prepared);
    // Both on the same filesystem, so only the quota calls differ.
    let quotad = Served::start(&fs, "quota", &["--quota=on"]);
    let plain = Served::start(&fs, "plain", &["--quota=off"]);
    const N: usize = 30;
    let (first, times) = runtime().block_on(async {
        let mut clients = [quotad.client().await, plain.client().await];
        // The first call of this process pays for the client's and each server's first use
        // of their code (pages read over the VM's 9p root under TCG): about 1 s, once, which
        // would add 30-40 ms to a mean of 30. Timed on its own, not in the mean.
        let mut first = [Duration::ZERO; 2];
        for (i, (csi, first)) in clients.iter_mut().zip(first.iter_mut()).enumerate() {
            *first = create_then_delete(csi, &format!("warm-{i}")).await[0];
        }
        // [server][create, delete] per round; the servers alternate and take turns going
        // first, so host load and whatever one call leaves behind weigh on both.
        let mut times = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
        for round in 0..N {
            for server in [round % 2, 1 - round % 2] {
                let took = create_then_delete(&mut clients[server], &format!("pvc-{round}")).await;
                times[server][0].push(took[0]);
                times[server][1].push(took[1]);
            }
        }
        (first, times)
    });
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mean = |v: &[Duration]| ms(v.iter().sum::<Duration>()) / v.len() as f64;
    let median = |v: &[Duration]| {
        let mut v = v.to_vec();
        v.sort();
        ms(v[v.len() / 2])
    };
    let [quota_d, plain_d] = &times;
    figure(
        kind,
        format_args!(
            "CreateVolume / DeleteVolume through gRPC, mean (median) of {N} after a first call \
             (TCG, not native speed): plain {:.1} ({:.1}) / {:.1} ({:.1}) ms, quota'd {:.1} \
             ({:.1}) / {:.1} ({:.1}) ms, CreateVolume quota'd/plain {:.2}x; the first \
             CreateVolume: plain {:.0} ms, quota'd {:.0} ms",
            mean(&plain_d[0]),
            median(&plain_d[0]),
            mean(&plain_d[1]),
            median(&plain_d[1]),
            mean(&quota_d[0]),
            median(&quota_d[0]),
            mean(&quota_d[1]),
            median(&quota_d[1]),
            mean(&quota_d[0]) / mean(&plain_d[0]),
            ms(first[1]),
            ms(first[0]),
        ),
    );
}

/// CreateVolume of 1 MiB named `name`, then its DeleteVolume: how long each took.
async fn create_then_delete(csi: &mut csi_node::Csi, name: &str) -> [Duration; 2] {
    let started = Instant::now();
    let id = csi_node::create(csi, name, MIB as i64).await;
    let created = started.elapsed();
    let started = Instant::now();
    let delete = csi_node::delete_request(&id);
    csi.controller.delete_volume(delete).await.expect("delete");
    [created, started.elapsed()]
}

/// A restore and a clone are volumes like any other: a project of their own, created before
/// the copy so the copied data is charged to it, and a writer in them stops at their size.
pub fn restores_and_clones_get_a_project_of_their_own_and_are_held_to_their_size(kind: FsKind) {
    use crate::common::csi_snapshots::{from_snapshot, from_volume, snapshot_request};
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let served = Served::start(&fs, "state", &["--quota=on"]);
    runtime().block_on(async {
        let mut csi = served.client().await;
        let pod = served.pod("source");
        let source = create_and_publish(&mut csi, "pvc-source", 8 * MIB, &pod).await;
        let source_project = served.recorded_project(&source).expect("source project");
        std::fs::write(pod.target.join("data"), vec![7u8; 4 * MIB as usize]).unwrap();
        let snapshot = csi
            .controller
            .create_snapshot(snapshot_request("snap-a", &source))
            .await
            .expect("create snapshot")
            .into_inner()
            .snapshot
            .expect("snapshot")
            .snapshot_id;
        let requests = [
            (
                "restore",
                from_snapshot("pvc-restored", 8 * MIB as i64, &snapshot),
            ),
            ("clone", from_volume("pvc-cloned", 8 * MIB as i64, &source)),
        ];
        for (what, request) in requests {
            let id = (csi.controller.create_volume(request).await)
                .unwrap_or_else(|e| panic!("{what}: {e}"))
                .into_inner()
                .volume
                .expect("volume")
                .volume_id;
            let project = served.recorded_project(&id).expect("a recorded project ID");
            assert_ne!(project, source_project, "{what}: a project of its own");
            let dir = served.volume_dir(&id);
            assert_eq!(
                quota::project_of(&dir).unwrap().id,
                project,
                "{what}: directory"
            );
            assert_eq!(
                quota::project_of(&dir.join("data")).unwrap().id,
                project,
                "{what}: the copied file is charged to the new volume"
            );
            fs.sync();
            let charged = q.usage(project).unwrap();
            assert!(charged.bytes >= 4 * MIB, "{what}: {charged:?}");
            assert_eq!(charged.limits.bytes, 8 * MIB, "{what}: limit of its size");
            let pod = served.pod(what);
            csi.stage_and_publish(&id, &pod.staging, &pod.target, false)
                .await;
            let before = q.usage(project).unwrap().bytes;
            let w = write_until_error(&pod.target.join("fill"), 64 * MIB, NOBODY);
            let overshoot = assert_stopped_at(&fs, &q, project, 8 * MIB, before, &w);
            figure(
                kind,
                format_args!("{what} of a 4 MiB volume, its writer: overshoot={overshoot} bytes"),
            );
            remove(&mut csi, &id, &pod).await;
        }
        remove(&mut csi, &source, &pod).await;
    });
}
