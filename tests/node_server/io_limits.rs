//! Per-volume IO limits, their refusals and where they are written. The kernel's side — a
//! writer held to its limit, changed live, a neighbour spared — runs in the quota VM under
//! cgroup v2 (`booted/quota_vm/io_limits.rs`); this machine is cgroup v1. Here a node without
//! cgroup v2 is a `--cgroup-root` with no `cgroup.controllers` (as a v1 node's
//! `/sys/fs/cgroup` is), and a v2 node's pod cgroups are laid out as files, which shows what
//! is written where, not what the kernel does with it.

use std::collections::HashMap;
use std::path::Path;

use crate::common::csi_block::*;
use crate::common::csi_node::*;
use crate::common::scratch_fs::Kind;
use csi_nodekit::node_server::Config;
use csi_nodekit::proto::csi::*;
use tonic::Code;

use super::image::image_create;

const POD: &str = "6f1e2d3c-4b5a-4978-8796-a5b4c3d2e1f0";

async fn node_with_cgroup_root(root: &Path) -> (BlockNode, CsiServer, Csi) {
    let node = BlockNode::new(Kind::Xfs);
    let config = Config {
        cgroup_root: root.to_owned(),
        ..Config::new(DRIVER, NODE, &node.state)
    };
    let server = start(&node.sandbox, config).await;
    let csi = server.client().await;
    (node, server, csi)
}

fn assert_refused(status: &tonic::Status, code: Code, named: &[&str]) {
    assert_eq!(status.code(), code, "{status:?}");
    for word in named {
        assert!(
            status.message().contains(word),
            "{word:?}: {}",
            status.message()
        );
    }
}

#[ignore = "needs root: real loop devices, ext4 and XFS in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_limits_are_refused_for_directory_volumes_and_on_a_node_without_cgroup_v2() {
    let v1 = tempfile::tempdir().unwrap();
    let (_node, _server, mut csi) = node_with_cgroup_root(v1.path()).await;
    let mut directory = create_request("pvc-dir", MIB as i64);
    directory.mutable_parameters = HashMap::from([("writeBytesPerSecond".into(), "1Mi".into())]);
    let refused = csi.controller.create_volume(directory).await.unwrap_err();
    assert_refused(
        &refused,
        Code::InvalidArgument,
        &["writeBytesPerSecond", "device of the volume's own"],
    );

    let limited = image_create("pvc-limited", 16 * MIB, &[("writeIOPS", "100")]);
    let refused = csi.controller.create_volume(limited).await.unwrap_err();
    assert_refused(&refused, Code::InvalidArgument, &["writeIOPS", "cgroup v2"]);

    // No limit asked ("0") holds anywhere; a limit asked later is refused the same way.
    let unlimited = image_create("pvc-unlimited", 16 * MIB, &[("writeIOPS", "0")]);
    let id = create_with(&mut csi, unlimited).await;
    let modify = ControllerModifyVolumeRequest {
        volume_id: id.clone(),
        mutable_parameters: HashMap::from([("readBytesPerSecond".into(), "10Mi".into())]),
        ..Default::default()
    };
    let refused = csi
        .controller
        .controller_modify_volume(modify)
        .await
        .unwrap_err();
    assert_refused(
        &refused,
        Code::InvalidArgument,
        &["readBytesPerSecond", "cgroup v2"],
    );

    for (key, bad) in [("readIOPS", "many"), ("writeBytesPerSecond", "1.5Mi")] {
        let request = image_create("pvc-bad", 16 * MIB, &[(key, bad)]);
        let refused = csi.controller.create_volume(request).await.unwrap_err();
        assert_refused(&refused, Code::InvalidArgument, &[key, bad]);
    }
}

#[ignore = "needs root: real loop devices, ext4 and XFS, bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_volume_is_published_only_for_a_pod_whose_cgroup_holds_its_limits_and_unpublish_lifts_them()
 {
    // A cgroup v2 node's files, as the kubelet's cgroupfs driver lays a burstable pod out.
    let v2 = tempfile::tempdir().unwrap();
    std::fs::write(v2.path().join("cgroup.controllers"), "cpu io memory pids\n").unwrap();
    let pod_cgroup = v2.path().join(format!("kubepods/burstable/pod{POD}"));
    std::fs::create_dir_all(&pod_cgroup).unwrap();
    std::fs::write(pod_cgroup.join("io.max"), "").unwrap();
    let (node, _server, mut csi) = node_with_cgroup_root(v2.path()).await;
    let sandbox = &node.sandbox;
    let request = image_create("pvc-limited", 16 * MIB, &[("writeBytesPerSecond", "1Mi")]);
    let id = create_with(&mut csi, request).await;
    let (staging, target) = (sandbox.dir("staging"), sandbox.dir("target"));
    csi.node
        .node_stage_volume(stage_request(&id, &staging))
        .await
        .expect("stage");
    let for_pod = |uid: Option<&str>| NodePublishVolumeRequest {
        volume_context: uid
            .map(|uid| HashMap::from([("csi.storage.k8s.io/pod.uid".into(), uid.into())]))
            .unwrap_or_default(),
        ..publish_request(&id, &staging, &target, false)
    };

    let refused = csi
        .node
        .node_publish_volume(for_pod(None))
        .await
        .unwrap_err();
    assert_refused(
        &refused,
        Code::FailedPrecondition,
        &["IO limits", "podInfoOnMount"],
    );
    let elsewhere = "00000000-1111-4222-8333-444444444444";
    let refused = csi
        .node
        .node_publish_volume(for_pod(Some(elsewhere)))
        .await
        .unwrap_err();
    assert_refused(
        &refused,
        Code::FailedPrecondition,
        &["no cgroup of pod", elsewhere],
    );
    assert!(
        !sandbox.mounts().iter().any(|m| m == &target),
        "mounted though refused"
    );

    csi.node
        .node_publish_volume(for_pod(Some(POD)))
        .await
        .expect("publish");
    let device = std::fs::metadata(&staging)
        .map(|m| std::os::unix::fs::MetadataExt::dev(&m))
        .unwrap();
    let numbers = format!(
        "{}:{}",
        nix::sys::stat::major(device),
        nix::sys::stat::minor(device)
    );
    let written = std::fs::read_to_string(pod_cgroup.join("io.max")).unwrap();
    assert_eq!(
        written,
        format!("{numbers} rbps=max wbps=1048576 riops=max wiops=max")
    );
    // The kubelet retries a publish it is unsure of: the limits are written again.
    std::fs::write(pod_cgroup.join("io.max"), "").unwrap();
    csi.node
        .node_publish_volume(for_pod(Some(POD)))
        .await
        .expect("publish again");
    assert!(
        std::fs::read_to_string(pod_cgroup.join("io.max"))
            .unwrap()
            .contains("wbps=1048576")
    );

    csi.node
        .node_unpublish_volume(unpublish_request(&id, &target))
        .await
        .expect("unpublish");
    let lifted = std::fs::read_to_string(pod_cgroup.join("io.max")).unwrap();
    assert_eq!(
        lifted,
        format!("{numbers} rbps=max wbps=max riops=max wiops=max")
    );
    csi.node
        .node_unstage_volume(unstage_request(&id, &staging))
        .await
        .expect("unstage");
}
