//! Concurrency: a second call on a volume whose operation is still running is ABORTED, while
//! calls on other volumes go ahead in parallel. A gate in the mounter holds one bind mount
//! open for as long as the test wants, so nothing here depends on timing.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::csi_node::*;
use csi_nodekit::linux::mount::{MountError, MountOptions, SelinuxContext};
use csi_nodekit::linux::mountinfo::MountTable;
use csi_nodekit::linux::mountpoint::{Shown, Top};
use csi_nodekit::linux::statmount::Containing;
use csi_nodekit::node_server::{LinuxMounter, Mounter};
use csi_nodekit::proto::csi::*;
use tonic::Code;

/// The real mounter, except that a bind onto `gated` waits for `open()`.
struct GateMounter {
    gated: PathBuf,
    entered: Mutex<mpsc::Sender<()>>,
    open: (Mutex<bool>, Condvar),
}

impl GateMounter {
    fn new(gated: PathBuf) -> (Arc<Self>, mpsc::Receiver<()>) {
        let (tx, rx) = mpsc::channel();
        let gate = Self {
            gated,
            entered: Mutex::new(tx),
            open: (Mutex::new(false), Condvar::new()),
        };
        (Arc::new(gate), rx)
    }

    fn open(&self) {
        *self.open.0.lock().unwrap() = true;
        self.open.1.notify_all();
    }
}

impl Mounter for GateMounter {
    fn mount_table(&self) -> Result<MountTable, MountError> {
        LinuxMounter.mount_table()
    }

    fn mount_at(&self, path: &Path) -> Result<Option<Top>, MountError> {
        LinuxMounter.mount_at(path)
    }

    fn identity(&self, path: &Path) -> Result<Shown, MountError> {
        LinuxMounter.identity(path)
    }

    fn containing(&self, path: &Path) -> Result<Option<Containing>, MountError> {
        LinuxMounter.containing(path)
    }

    fn bind(&self, source: &Path, target: &Path, options: MountOptions) -> Result<(), MountError> {
        if target == self.gated {
            let _ = self.entered.lock().unwrap().send(());
            let (lock, cvar) = &self.open;
            let _open = cvar
                .wait_while(lock.lock().unwrap(), |open| !*open)
                .unwrap();
        }
        LinuxMounter.bind(source, target, options)
    }

    fn bind_file(&self, source: &Path, target: &Path, readonly: bool) -> Result<(), MountError> {
        LinuxMounter.bind_file(source, target, readonly)
    }

    fn mount_device(
        &self,
        device: &Path,
        fstype: &std::ffi::CStr,
        target: &Path,
        options: MountOptions,
        context: Option<&SelinuxContext>,
        prepare: &mut dyn FnMut(&std::fs::File) -> std::io::Result<()>,
    ) -> Result<(), MountError> {
        LinuxMounter.mount_device(device, fstype, target, options, context, prepare)
    }

    fn unmount(&self, target: &Path, checked: &Top) -> Result<(), MountError> {
        LinuxMounter.unmount(target, checked)
    }
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_call_on_a_busy_volume_is_aborted_while_other_volumes_proceed() {
    let sandbox = MountSandbox::new();
    let pods = sandbox.dir("pods");
    let slow_target = pods.join("slow");
    let (gate, entered) = GateMounter::new(slow_target.clone());
    let server = start_with(&sandbox, config(&sandbox), gate.clone()).await;
    let mut csi = server.client().await;
    let busy = create(&mut csi, "pvc-busy", 1).await;
    let free = create(&mut csi, "pvc-free", 1).await;
    let (busy_staging, free_staging) = (sandbox.dir("s-busy"), sandbox.dir("s-free"));
    csi.node
        .node_stage_volume(stage_request(&busy, &busy_staging))
        .await
        .unwrap();
    csi.node
        .node_stage_volume(stage_request(&free, &free_staging))
        .await
        .unwrap();

    let mut first = csi.clone();
    let held = publish_request(&busy, &busy_staging, &slow_target, false);
    let in_flight = tokio::spawn(async move { first.node.node_publish_volume(held).await });
    tokio::task::spawn_blocking(move || entered.recv_timeout(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("the publish reached the mounter");

    let again = publish_request(&busy, &busy_staging, &pods.join("other"), false);
    assert_eq!(
        code(csi.node.node_publish_volume(again).await),
        Code::Aborted
    );
    let unpublish = unpublish_request(&busy, &slow_target);
    assert_eq!(
        code(csi.node.node_unpublish_volume(unpublish).await),
        Code::Aborted
    );
    let delete = DeleteVolumeRequest {
        volume_id: busy.clone(),
        ..Default::default()
    };
    assert_eq!(
        code(csi.controller.delete_volume(delete).await),
        Code::Aborted
    );
    let expand = ControllerExpandVolumeRequest {
        volume_id: busy.clone(),
        capacity_range: Some(CapacityRange {
            required_bytes: 2,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    assert_eq!(
        code(csi.controller.controller_expand_volume(expand).await),
        Code::Aborted
    );

    let other_volume = publish_request(&free, &free_staging, &pods.join("free"), false);
    csi.node
        .node_publish_volume(other_volume)
        .await
        .expect("another volume is not held up by the busy one");
    assert!(is_mounted(&pods.join("free")));
    assert!(!in_flight.is_finished(), "the first publish is still held");

    gate.open();
    in_flight
        .await
        .unwrap()
        .expect("the held publish completes");
    assert!(is_mounted(&slow_target));
    let retry = publish_request(&busy, &busy_staging, &slow_target, false);
    csi.node
        .node_publish_volume(retry)
        .await
        .expect("once it finished, the volume takes calls again");
    for (id, target, staging) in [
        (&busy, slow_target.clone(), &busy_staging),
        (&free, pods.join("free"), &free_staging),
    ] {
        csi.unpublish_and_unstage(id, &target, staging).await;
    }
    assert!(sandbox.mounts().is_empty());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_of_one_name_make_exactly_one_volume() {
    let (_sandbox, server, csi) = setup().await;
    // Many concurrent creates of one name: every one either returns the single volume or
    // is ABORTED because another is in progress; never two volumes.
    let calls = (0..16).map(|_| {
        let mut csi = csi.clone();
        tokio::spawn(async move {
            csi.controller
                .create_volume(create_request("same", 1))
                .await
        })
    });
    let mut ids = std::collections::HashSet::new();
    for call in calls {
        match call.await.unwrap() {
            Ok(reply) => {
                ids.insert(reply.into_inner().volume.unwrap().volume_id);
            }
            Err(status) => assert_eq!(status.code(), Code::Aborted, "{status:?}"),
        }
    }
    assert_eq!(ids.len(), 1, "{ids:?}");
    server.stop().await;
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_volumes_go_through_their_lifecycles_in_parallel() {
    let (sandbox, server, csi) = setup().await;
    let pods = sandbox.dir("pods");
    let runs = (0..24).map(|i| {
        let mut csi = csi.clone();
        let staging = sandbox.dir(&format!("staging-{i}"));
        let target = pods.join(format!("t-{i}"));
        tokio::spawn(async move {
            let id = create(&mut csi, &format!("pvc-{i}"), 1).await;
            csi.node
                .node_stage_volume(stage_request(&id, &staging))
                .await?;
            csi.node
                .node_publish_volume(publish_request(&id, &staging, &target, i % 2 == 0))
                .await?;
            assert!(is_mounted(&target));
            csi.node
                .node_unpublish_volume(unpublish_request(&id, &target))
                .await?;
            csi.node
                .node_unstage_volume(unstage_request(&id, &staging))
                .await?;
            let delete = DeleteVolumeRequest {
                volume_id: id,
                ..Default::default()
            };
            csi.controller.delete_volume(delete).await?;
            Ok::<_, tonic::Status>(())
        })
    });
    for run in runs.collect::<Vec<_>>() {
        run.await.unwrap().expect("lifecycle");
    }
    assert!(sandbox.mounts().is_empty());
    let csi = &mut csi.clone();
    assert!(csi.list().await.is_empty());
    server.stop().await;
}
