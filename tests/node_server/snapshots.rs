//! Snapshots, restores and clones through the real gRPC path with real bind mounts: a volume
//! in use is snapshotted and cloned, the copies carry everything its tree holds, they outlive
//! their source and a restart, and a copy in progress keeps its source from being deleted
//! without holding up publishing it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_nodekit::proto::csi::*;
use tonic::Code;

use crate::common::csi_node::*;
use crate::common::csi_snapshots::*;
use crate::common::scratch_fs::{Kind, ScratchFs};
use crate::common::tree_fixture;

const MIB: i64 = 1 << 20;

/// Publishes `id` at `<sandbox>/<name>` (staged at `<sandbox>/<name>-staging`).
async fn publish_at(csi: &mut Csi, sandbox: &MountSandbox, id: &str, name: &str) -> PathBuf {
    let staging = sandbox.dir(&format!("{name}-staging"));
    let target = sandbox.path().join(name);
    csi.stage_and_publish(id, &staging, &target, false).await;
    target
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: real bind mounts and an ext4 scratch filesystem in a private mount namespace"]
async fn a_volume_in_use_is_snapshotted_restored_and_cloned_with_everything_its_tree_holds() {
    let sandbox = MountSandbox::new();
    // ext4 mounted noatime: the tree comparison reads directories, which must not move atimes.
    let fs = ScratchFs::new(Kind::Ext4);
    let server = start_at(&sandbox, &fs.path().join("state"), None).await;
    let mut csi = server.client().await;
    let id = create(&mut csi, "source", 64 * MIB).await;
    let source = publish_at(&mut csi, &sandbox, &id, "source").await;
    let left_out = tree_fixture::build(&source.join("tree"));

    let snapshot = csi.snapshot("snap", &id).await;
    assert!(snapshot.ready_to_use);
    assert_eq!(snapshot.size_bytes, 64 * MIB, "the source's size");
    assert_eq!(snapshot.source_volume_id, id);
    assert!(snapshot.snapshot_id.starts_with("snap-"));
    assert!(
        snapshot
            .creation_time
            .is_some_and(|t| t.seconds > 1_700_000_000)
    );
    assert_eq!(snapshot.group_snapshot_id, "");

    let restored = csi
        .create_from(from_snapshot("restored", 0, &snapshot.snapshot_id))
        .await;
    assert_eq!(
        restored.capacity_bytes,
        64 * MIB,
        "no size asked: the source's"
    );
    let echoed = restored.content_source.clone().and_then(|s| s.r#type);
    assert!(
        matches!(&echoed, Some(volume_content_source::Type::Snapshot(s))
            if s.snapshot_id == snapshot.snapshot_id),
        "{echoed:?}"
    );
    let restored_at = publish_at(&mut csi, &sandbox, &restored.volume_id, "restored").await;
    tree_fixture::assert_same(&source.join("tree"), &restored_at.join("tree"), &left_out);

    let clone = csi.create_from(from_volume("clone", 0, &id)).await;
    let clone_at = publish_at(&mut csi, &sandbox, &clone.volume_id, "clone").await;
    tree_fixture::assert_same(&source.join("tree"), &clone_at.join("tree"), &left_out);
    let listed = csi.list().await;
    let listed_clone = listed.iter().find(|v| v.volume_id == clone.volume_id);
    assert_eq!(
        listed_clone,
        Some(&clone),
        "ListVolumes echoes the source too"
    );

    // The copies are copies: the source changes alone.
    std::fs::write(source.join("tree/a/file.txt"), "changed").unwrap();
    for copy in [&restored_at, &clone_at] {
        let text = std::fs::read_to_string(copy.join("tree/a/file.txt")).unwrap();
        assert_eq!(text, "hello, volume\n");
    }
    for (volume, name) in [(&id, "source"), (&restored.volume_id, "restored")] {
        let (target, staging) = (
            sandbox.path().join(name),
            sandbox.dir(&format!("{name}-staging")),
        );
        csi.unpublish_and_unstage(volume, &target, &staging).await;
    }
    let (target, staging) = (sandbox.path().join("clone"), sandbox.dir("clone-staging"));
    csi.unpublish_and_unstage(&clone.volume_id, &target, &staging)
        .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
async fn snapshots_outlive_their_deleted_source_and_a_restart() {
    let sandbox = MountSandbox::new();
    let state = sandbox.path().join("state");
    let server = start_at(&sandbox, &state, None).await;
    let mut csi = server.client().await;
    let id = create(&mut csi, "source", 32 * MIB).await;
    let target = publish_at(&mut csi, &sandbox, &id, "source").await;
    tree_fixture::data_tree(&target.join("data"));
    let sums = checksums(&target.join("data"));
    let snapshot = csi.snapshot("snap", &id).await;
    let staging = sandbox.dir("source-staging");
    csi.unpublish_and_unstage(&id, &target, &staging).await;
    csi.controller
        .delete_volume(delete_request(&id))
        .await
        .expect("a volume with snapshots can be deleted");
    assert_eq!(csi.snapshots().await, vec![snapshot.clone()]);
    server.stop().await;

    let server = start_at(&sandbox, &state, None).await;
    let mut csi = server.client().await;
    assert_eq!(csi.snapshots().await, vec![snapshot.clone()], "as it was");
    let again = csi.snapshot("snap", &id).await;
    assert_eq!(
        again, snapshot,
        "the name still finds it, though its source is gone"
    );
    let restored = csi
        .create_from(from_snapshot("restored", 0, &snapshot.snapshot_id))
        .await;
    let at = publish_at(&mut csi, &sandbox, &restored.volume_id, "restored").await;
    assert_eq!(checksums(&at.join("data")), sums);
    let staging = sandbox.dir("restored-staging");
    csi.unpublish_and_unstage(&restored.volume_id, &at, &staging)
        .await;
    csi.delete_snapshot(&snapshot.snapshot_id).await;
    csi.delete_snapshot(&snapshot.snapshot_id).await;
    assert_eq!(csi.snapshots().await, vec![]);
    let data = std::fs::read_dir(state.join("snapshots")).unwrap();
    assert_eq!(data.count(), 0, "its data is gone");
    server.stop().await;
}

/// Whether a snapshot copy is under way in `state` (its temporary name is there).
fn copying(state: &Path) -> bool {
    std::fs::read_dir(state.join("snapshots")).is_ok_and(|mut names| {
        names.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with(".partial-")))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: real bind mounts and a tmpfs in a private mount namespace"]
async fn a_volume_being_snapshotted_cannot_be_deleted_but_can_be_published_meanwhile() {
    let sandbox = MountSandbox::new();
    let fs = ScratchFs::new(Kind::Tmpfs);
    let state = fs.path().join("state");
    let server = start_at(&sandbox, &state, None).await;
    let mut csi = server.client().await;
    let id = create(&mut csi, "busy", 64 * MIB).await;
    tree_fixture::many_files(&state.join("volumes").join(&id));
    let mut other = csi.clone();
    let source = id.clone();
    let cut = tokio::spawn(async move { other.snapshot("while-busy", &source).await });
    let started = crate::common::wait_until(Duration::from_secs(20), || copying(&state)).await;
    assert!(started, "the copy never showed up");

    let deleted = csi.controller.delete_volume(delete_request(&id)).await;
    let status = deleted.expect_err("deleted under its snapshot");
    assert_eq!(status.code(), Code::Aborted, "{status}");
    assert!(status.message().contains("being copied"), "{status}");
    // Publishing, stats and expansion do not wait for the copy.
    let target = publish_at(&mut csi, &sandbox, &id, "busy").await;
    let expand = ControllerExpandVolumeRequest {
        volume_id: id.clone(),
        capacity_range: Some(CapacityRange {
            required_bytes: 128 * MIB,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    csi.controller
        .controller_expand_volume(expand)
        .await
        .expect("expand");
    assert!(copying(&state), "the calls above ran while the copy did");

    let snapshot = cut.await.expect("join");
    assert!(snapshot.ready_to_use);
    assert_eq!(
        snapshot.size_bytes,
        64 * MIB,
        "the size when the snapshot began"
    );
    let data = state.join("snapshots").join(&snapshot.snapshot_id);
    assert_eq!(checksums(&data), checksums(&target));
    let staging = sandbox.dir("busy-staging");
    csi.unpublish_and_unstage(&id, &target, &staging).await;
    csi.controller
        .delete_volume(delete_request(&id))
        .await
        .expect("deleted once the copy is done");
    server.stop().await;
}
