//! DeleteVolume marks the volume deleted before removing data: a file that cannot be removed
//! (immutable) is named in the error, the half-deleted volume is neither listed nor found by
//! name, and the deletion is finished by a retry or at the next start-up.

use std::path::Path;

use crate::common::csi_node::*;
use crate::common::csi_snapshots::start_at;
use crate::common::scratch_fs::{Kind, ScratchFs, run};
use csi_nodekit::proto::csi::{DeleteVolumeRequest, ListVolumesRequest};

async fn listed(csi: &mut Csi) -> Vec<String> {
    let reply = csi.controller.list_volumes(ListVolumesRequest::default());
    let entries = reply.await.expect("list").into_inner().entries;
    entries
        .into_iter()
        .filter_map(|e| e.volume)
        .map(|v| v.volume_id)
        .collect()
}

async fn delete(csi: &mut Csi, id: &str) -> Result<(), tonic::Status> {
    let request = DeleteVolumeRequest {
        volume_id: id.into(),
        ..Default::default()
    };
    csi.controller.delete_volume(request).await.map(|_| ())
}

/// A volume with files around one made immutable; returns its ID and the immutable file.
async fn volume_with_an_immutable_file(
    csi: &mut Csi,
    state: &Path,
    name: &str,
) -> (String, std::path::PathBuf) {
    let id = create(csi, name, 1 << 20).await;
    let dir = state.join("volumes").join(&id);
    std::fs::create_dir(dir.join("sub")).unwrap();
    for file in ["a", "sub/b", "sub/stuck", "z"] {
        std::fs::write(dir.join(file), file).unwrap();
    }
    let stuck = dir.join("sub/stuck");
    run("chattr", &["+i", stuck.to_str().unwrap()]);
    (id, stuck)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and chattr: an ext4 scratch filesystem and an immutable file"]
async fn an_undeletable_file_is_named_the_volume_is_unlisted_and_a_retry_finishes() {
    let sandbox = MountSandbox::new();
    let fs = ScratchFs::new(Kind::Ext4);
    let state = fs.path().join("state");
    let server = start_at(&sandbox, &state, None).await;
    let mut csi = server.client().await;
    let (id, stuck) = volume_with_an_immutable_file(&mut csi, &state, "pvc-stuck").await;

    let err = delete(&mut csi, &id)
        .await
        .expect_err("an immutable file cannot go");
    assert_eq!(err.code(), tonic::Code::Internal, "{}", err.message());
    assert!(
        err.message().contains(stuck.to_str().unwrap()),
        "{}",
        err.message()
    );
    let record = std::fs::read_to_string(state.join(format!("meta/{id}.json"))).unwrap();
    assert!(
        record.contains("\"deleting\":true") || record.contains("\"deleting\": true"),
        "{record}"
    );
    assert!(
        !listed(&mut csi).await.contains(&id),
        "a half-deleted volume is listed"
    );
    let again = create(&mut csi, "pvc-stuck", 1 << 20).await;
    assert_ne!(again, id, "its name belongs to a volume being deleted");

    run("chattr", &["-i", stuck.to_str().unwrap()]);
    delete(&mut csi, &id).await.expect("the retry finishes");
    assert!(!state.join("volumes").join(&id).exists());
    assert!(!state.join(format!("meta/{id}.json")).exists());
    delete(&mut csi, &id).await.expect("and is idempotent");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and chattr: an ext4 scratch filesystem and an immutable file"]
async fn a_deletion_left_half_done_is_finished_at_the_next_start() {
    let sandbox = MountSandbox::new();
    let fs = ScratchFs::new(Kind::Ext4);
    let state = fs.path().join("state");
    let server = start_at(&sandbox, &state, None).await;
    let mut csi = server.client().await;
    let kept = create(&mut csi, "pvc-kept", 1 << 20).await;
    let (id, stuck) = volume_with_an_immutable_file(&mut csi, &state, "pvc-half").await;
    delete(&mut csi, &id)
        .await
        .expect_err("stopped half-way by the immutable file");
    drop(csi);
    server.stop().await;
    // What a SIGKILL mid-delete leaves: the record marked, part of the data still there.
    run("chattr", &["-i", stuck.to_str().unwrap()]);
    assert!(stuck.exists());

    let server = start_at(&sandbox, &state, None).await;
    let mut csi = server.client().await;
    assert!(
        !state.join("volumes").join(&id).exists(),
        "start-up finished the deletion"
    );
    assert!(!state.join(format!("meta/{id}.json")).exists());
    assert_eq!(listed(&mut csi).await, vec![kept.clone()]);
    // What was left of its data goes in the background.
    let only_kept = || {
        let names: Vec<_> = (std::fs::read_dir(state.join("volumes")).unwrap())
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names == [kept.clone()]
    };
    let gone = crate::common::wait_until(std::time::Duration::from_secs(30), only_kept).await;
    assert!(gone, "what was left of the volume's data was never removed");
    server.stop().await;
}
