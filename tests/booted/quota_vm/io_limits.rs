//! Inside the VM: per-volume IO limits on the real node-server binary under cgroup v2 (this
//! machine's host kernel is cgroup v1). Two pods' cgroups are laid out as the kubelet's systemd
//! driver names them; each pod writes without pause (direct IO, 64 KiB at a time) to an image
//! volume of its own. One volume has a write limit from its VolumeAttributesClass, raised and
//! lowered by ControllerModifyVolume while the pod writes; the other has none, and writes
//! beside it at full speed (then stops: the guest's one CPU would otherwise be the limit). Rates are read
//! from each pod's `io.stat` for the volume's loop device.

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi_nodekit::linux::quota::FsKind;
use csi_nodekit::proto::csi::*;

use super::cases::{MIB, figure};
use super::fixtures::{Prep, TestFs};
use super::served::{Pod, Served, runtime};
use crate::common::csi_node::{self, Csi};

const LIMITED_POD: &str = "0a1b2c3d-0000-4000-8000-00000000000a";
const NEIGHBOUR_POD: &str = "0a1b2c3d-0000-4000-8000-00000000000b";
/// How long each rate is measured, after [`SETTLE`] for a change to take hold.
const WINDOW: Duration = Duration::from_secs(4);
const SETTLE: Duration = Duration::from_secs(1);
/// A lowered limit takes hold later: Debian's 6.1 kernel carries the old rate's unspent
/// allowance over (a burst at the change), then pauses the writer until it is paid back at
/// the new rate — about 4 s from 4 MiB/s to 1 MiB/s in this test.
const SETTLE_LOWERED: Duration = Duration::from_secs(8);

/// A cgroup v2 hierarchy of its own (the one hierarchy, mounted again) with the io controller
/// enabled down to the pods' cgroups, laid out as the kubelet's systemd driver names them.
struct Cgroups {
    root: tempfile::TempDir,
}

impl Cgroups {
    fn lay_out(pods: &[&str]) -> Self {
        let root = tempfile::tempdir().unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "cgroup2", "none"])
            .arg(root.path())
            .status()
            .unwrap();
        assert!(mounted.success(), "mount -t cgroup2");
        let controllers = std::fs::read_to_string(root.path().join("cgroup.controllers")).unwrap();
        assert!(
            controllers.contains("io"),
            "no io controller: {controllers:?}"
        );
        let mut dir = root.path().to_owned();
        for level in ["kubepods.slice", "kubepods-burstable.slice"] {
            std::fs::write(dir.join("cgroup.subtree_control"), "+io").expect("+io");
            dir = dir.join(level);
            std::fs::create_dir(&dir).unwrap();
        }
        std::fs::write(dir.join("cgroup.subtree_control"), "+io").expect("+io");
        for pod in pods {
            std::fs::create_dir(dir.join(pod_slice(pod))).unwrap();
        }
        Self { root }
    }

    fn pod(&self, uid: &str) -> PathBuf {
        (self.root.path())
            .join("kubepods.slice/kubepods-burstable.slice")
            .join(pod_slice(uid))
    }

    /// Bytes the pod wrote to `device` (`major:minor`), as its `io.stat` counts them.
    fn written(&self, uid: &str, device: &str) -> u64 {
        let stat = std::fs::read_to_string(self.pod(uid).join("io.stat")).unwrap();
        let line = stat.lines().find(|l| l.starts_with(&format!("{device} ")));
        let field = line.and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("wbytes=")));
        field.map_or(0, |v| v.parse().unwrap())
    }

    fn io_max(&self, uid: &str) -> String {
        std::fs::read_to_string(self.pod(uid).join("io.max")).unwrap()
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.root.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

fn pod_slice(uid: &str) -> String {
    format!("kubepods-burstable-pod{}.slice", uid.replace('-', "_"))
}

/// A pod's writer: its process group killed on drop, waited for until the pod's cgroup is
/// empty (so nothing holds the volume when it is unpublished).
struct Writer {
    child: std::process::Child,
    procs: PathBuf,
}

impl Drop for Writer {
    fn drop(&mut self) {
        let group = nix::unistd::Pid::from_raw(-(self.child.id() as i32));
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline
            && !std::fs::read_to_string(&self.procs)
                .unwrap_or_default()
                .trim()
                .is_empty()
        {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A process in the pod's cgroup writing `file`, 64 KiB at a time, direct: `once` a single
/// `dd` that runs until the volume is full (no process start in the middle of a
/// measurement), or else 8 MiB over and over.
fn writer(cgroups: &Cgroups, uid: &str, file: &Path, once: bool) -> Writer {
    let procs = cgroups.pod(uid).join("cgroup.procs");
    let dd = format!(
        "dd if=/dev/zero of='{}' bs=64k oflag=direct conv=notrunc status=none",
        file.display()
    );
    let body = match once {
        true => format!("exec {dd}"),
        false => format!("while :; do {dd} count=128 || exit 1; done"),
    };
    let script = format!("echo $$ > '{}' && {body}", procs.display());
    let child = std::process::Command::new("sh")
        .args(["-c", &script])
        .process_group(0)
        .spawn()
        .unwrap();
    Writer { child, procs }
}

/// Bytes per second a pod writes to `device` over [`WINDOW`], after `settle`; and the KiB it
/// wrote in each quarter second from the start (the settling included), for the figures.
fn rate(cgroups: &Cgroups, uid: &str, device: &str, settle: Duration) -> (f64, Vec<u64>) {
    let started = Instant::now();
    let mut last = cgroups.written(uid, device);
    let (mut steps, mut window_start) = (Vec::new(), None);
    while started.elapsed() < settle + WINDOW {
        std::thread::sleep(Duration::from_millis(250));
        let now = cgroups.written(uid, device);
        steps.push((now - last) / 1024);
        last = now;
        if window_start.is_none() && started.elapsed() >= settle {
            window_start = Some((now, Instant::now()));
        }
    }
    let (first, at) = window_start.expect("the window started");
    ((last - first) as f64 / at.elapsed().as_secs_f64(), steps)
}

/// The loop device a staged image volume's filesystem is on, as `major:minor`.
fn device_of(staging: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(staging).unwrap().dev();
    format!(
        "{}:{}",
        nix::sys::stat::major(dev),
        nix::sys::stat::minor(dev)
    )
}

async fn create_image_volume(
    csi: &mut Csi,
    name: &str,
    bytes: u64,
    attributes: &[(&str, &str)],
) -> String {
    let request = CreateVolumeRequest {
        parameters: [("layout".into(), "image".into())].into(),
        mutable_parameters: (attributes.iter())
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..csi_node::create_request(name, bytes as i64)
    };
    let reply = csi.controller.create_volume(request).await.expect("create");
    reply.into_inner().volume.expect("volume").volume_id
}

async fn stage_and_publish_for(csi: &mut Csi, id: &str, pod: &Pod, uid: &str) {
    let stage = csi_node::stage_request(id, &pod.staging);
    csi.node.node_stage_volume(stage).await.expect("stage");
    let mut publish = csi_node::publish_request(id, &pod.staging, &pod.target, false);
    publish.volume_context =
        HashMap::from([("csi.storage.k8s.io/pod.uid".to_owned(), uid.to_owned())]);
    csi.node
        .node_publish_volume(publish)
        .await
        .expect("publish");
}

async fn modify_write_limit(csi: &mut Csi, id: &str, limit: &str) {
    let request = ControllerModifyVolumeRequest {
        volume_id: id.into(),
        mutable_parameters: HashMap::from([("writeBytesPerSecond".to_owned(), limit.to_owned())]),
        ..Default::default()
    };
    csi.controller
        .controller_modify_volume(request)
        .await
        .expect("ControllerModifyVolume");
}

fn within_ten_percent(kind: FsKind, what: &str, (measured, steps): (f64, Vec<u64>), limit: u64) {
    let error = (measured - limit as f64) / limit as f64;
    // From the change on, the burst and the pause included: never above the limit.
    let whole = steps.iter().sum::<u64>() as f64 * 1024.0 / (steps.len() as f64 / 4.0);
    figure(
        kind,
        format_args!(
            "io.max {what}: limit {} KiB/s, measured {:.0} KiB/s ({:+.1} %), {:.0} KiB/s from \
             the change; KiB per 250 ms: {steps:?}",
            limit / 1024,
            measured / 1024.0,
            error * 100.0,
            whole / 1024.0
        ),
    );
    assert!(
        whole <= limit as f64 * 1.10,
        "{what}: {whole:.0} B/s from the change against {limit}; KiB per 250 ms: {steps:?}"
    );
    assert!(
        error.abs() <= 0.10,
        "{what}: {measured:.0} B/s against {limit}; KiB per 250 ms: {steps:?}"
    );
}

pub fn a_volumes_write_limit_holds_its_pod_changes_live_and_spares_the_neighbour(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Plain);
    let cgroups = Cgroups::lay_out(&[LIMITED_POD, NEIGHBOUR_POD]);
    let root = format!("--cgroup-root={}", cgroups.root.path().display());
    let served = Served::start(&fs, "state", &[&root]);
    let (limited, neighbour) = (served.pod("limited"), served.pod("neighbour"));
    runtime().block_on(async {
        let mut csi = served.client().await;
        let id = create_image_volume(
            &mut csi,
            "pvc-limited",
            64 * MIB,
            &[("writeBytesPerSecond", "2Mi")],
        )
        .await;
        let other = create_image_volume(&mut csi, "pvc-neighbour", 16 * MIB, &[]).await;
        stage_and_publish_for(&mut csi, &id, &limited, LIMITED_POD).await;
        stage_and_publish_for(&mut csi, &other, &neighbour, NEIGHBOUR_POD).await;
        let (device, other_device) = (device_of(&limited.staging), device_of(&neighbour.staging));
        let io_max = cgroups.io_max(LIMITED_POD);
        assert_eq!(
            io_max.trim(),
            format!("{device} rbps=max wbps=2097152 riops=max wiops=max")
        );
        assert_eq!(
            cgroups.io_max(NEIGHBOUR_POD).trim(),
            "",
            "the neighbour has no limit"
        );

        // About 60 MiB in all at the limits below: one dd, never restarted, on 80 MiB.
        let _w1 = writer(&cgroups, LIMITED_POD, &limited.target.join("data"), true);
        let _w2 = writer(
            &cgroups,
            NEIGHBOUR_POD,
            &neighbour.target.join("data"),
            false,
        );
        within_ten_percent(
            kind,
            "at creation",
            rate(&cgroups, LIMITED_POD, &device, SETTLE),
            2 * MIB,
        );
        let (free, _) = rate(&cgroups, NEIGHBOUR_POD, &other_device, SETTLE);
        figure(
            kind,
            format_args!("io.max neighbour, unlimited: {:.0} KiB/s", free / 1024.0),
        );
        assert!(
            free > 3.0 * (4 * MIB) as f64,
            "the neighbour held back: {free:.0} B/s"
        );
        // The guest has one CPU: the unlimited writer would take it from the limited one.
        drop(_w2);

        modify_write_limit(&mut csi, &id, "4Mi").await;
        within_ten_percent(
            kind,
            "raised live",
            rate(&cgroups, LIMITED_POD, &device, SETTLE),
            4 * MIB,
        );
        modify_write_limit(&mut csi, &id, "1Mi").await;
        within_ten_percent(
            kind,
            "lowered live",
            rate(&cgroups, LIMITED_POD, &device, SETTLE_LOWERED),
            MIB,
        );
        drop(_w1);

        // Unpublish lifts the pod's limit (io.max lists only limited devices).
        let unpublish = csi_node::unpublish_request(&id, &limited.target);
        csi.node
            .node_unpublish_volume(unpublish)
            .await
            .expect("unpublish");
        assert_eq!(
            cgroups.io_max(LIMITED_POD).trim(),
            "",
            "lifted at unpublish"
        );
        let unstage = csi_node::unstage_request(&id, &limited.staging);
        csi.node
            .node_unstage_volume(unstage)
            .await
            .expect("unstage");
        csi.unpublish_and_unstage(&other, &neighbour.target, &neighbour.staging)
            .await;
    });
}
