//! node-server against mount tables as real nodes have them: a network-namespace bind mount
//! (what CNI leaves at `/run/netns/cni-…` on every Kubernetes node, root `net:[…]` in
//! mountinfo) present for a volume's whole life, and staging and target paths holding a space,
//! a tab, a newline and a backslash (octal-escaped in mountinfo). Real gRPC on a real socket,
//! real bind mounts, in the test command's private mount namespace.

use crate::common;

use std::path::{Path, PathBuf};

use common::csi_node::*;
use csi_nodekit::linux::mountinfo::MountTable;
use csi_nodekit::proto::csi::*;

/// Bind-mounts this process's network namespace on a new file at `file`, as
/// `ip netns add` and CNI plugins do (`mount --bind /proc/self/ns/net FILE`).
fn bind_netns(file: &Path) {
    std::fs::write(file, b"").expect("create the netns mount point");
    nix::mount::mount(
        Some("/proc/self/ns/net"),
        file,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .expect("bind-mount /proc/self/ns/net");
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        table
            .lines()
            .any(|l| l.contains(" net:[") && l.contains(" - nsfs ")),
        "the nsfs line is in the mount table:\n{table}"
    );
}

/// Create, stage, publish, stats, unpublish, unstage, delete; every call must succeed.
async fn whole_life(csi: &mut Csi, name: &str, staging: &Path, target: &Path) {
    let id = create(csi, name, 1 << 20).await;
    csi.stage_and_publish(&id, staging, target, false).await;
    assert!(is_mounted(staging) && is_mounted(target));
    std::fs::write(target.join("data"), b"through the bind").unwrap();
    let stats = csi
        .node
        .node_get_volume_stats(stats_request(&id, &target.display().to_string()))
        .await
        .expect("stats")
        .into_inner();
    assert!(!stats.volume_condition.unwrap().abnormal);
    csi.unpublish_and_unstage(&id, target, staging).await;
    assert!(!is_mounted(staging) && !is_mounted(target));
    csi.controller
        .delete_volume(delete_request(&id))
        .await
        .expect("delete");
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_namespace_mount_on_the_node_breaks_no_volume_operation() {
    let (sandbox, server, mut csi) = setup().await;
    bind_netns(&sandbox.path().join("cni-1234 \\x"));
    let probe = csi.identity.probe(ProbeRequest {}).await.expect("probe");
    assert_ne!(probe.into_inner().ready, Some(false));
    let (staging, pods) = (sandbox.dir("staging"), sandbox.dir("pods"));
    whole_life(&mut csi, "pvc-netns", &staging, &pods.join("target")).await;
    server.stop().await;
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_holding_a_namespace_mount_is_in_use_and_not_deleted() {
    let (sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-holds-netns", 1 << 20).await;
    let data = sandbox.path().join("state/volumes").join(&id);
    let file = data.join("netns");
    bind_netns(&file);
    let refused = csi.controller.delete_volume(delete_request(&id)).await;
    assert_eq!(
        code(refused),
        tonic::Code::FailedPrecondition,
        "a namespace file mounted inside the volume is a mount there"
    );
    assert!(file.exists(), "nothing deleted through the mount");
    nix::mount::umount(&file).unwrap();
    csi.controller
        .delete_volume(delete_request(&id))
        .await
        .expect("delete once the mount is gone");
    assert!(!data.exists());
    server.stop().await;
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staging_and_target_paths_with_spaces_tabs_newlines_and_backslashes_work() {
    let (sandbox, server, mut csi) = setup().await;
    bind_netns(&sandbox.path().join("netns"));
    let odd = "a b\tc\nd\\e";
    let staging: PathBuf = sandbox.dir(&format!("staging {odd}"));
    let pods = sandbox.dir(&format!("pods\\{odd}"));
    let target = pods.join(format!("target {odd}"));
    whole_life(&mut csi, "pvc-odd-paths", &staging, &target).await;
    let table = MountTable::read().unwrap();
    assert!(table.mounts_under(&pods).next().is_none());
    server.stop().await;
}
