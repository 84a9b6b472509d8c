//! Group snapshots through the GroupController: members cut together, recorded with their
//! group, restorable one by one, deleted only with the group; the spec's idempotency and error
//! codes; nothing left of a cut that fails; and a restart. Data is written straight into the
//! volume directories, so no mounts are needed.

use std::path::Path;

use csi_nodekit::proto::csi::*;
use tonic::Code;

use crate::common::csi_node::*;
use crate::common::csi_snapshots::*;
use crate::common::tree_fixture::noise;

const MIB: i64 = 1 << 20;

fn group_request(name: &str, sources: &[&str]) -> CreateVolumeGroupSnapshotRequest {
    CreateVolumeGroupSnapshotRequest {
        name: name.into(),
        source_volume_ids: sources.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn get_request(id: &str, members: &[String]) -> GetVolumeGroupSnapshotRequest {
    GetVolumeGroupSnapshotRequest {
        group_snapshot_id: id.into(),
        snapshot_ids: members.to_vec(),
        ..Default::default()
    }
}

fn delete_request(id: &str, members: &[String]) -> DeleteVolumeGroupSnapshotRequest {
    DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: id.into(),
        snapshot_ids: members.to_vec(),
        ..Default::default()
    }
}

impl Csi {
    async fn group(&mut self, name: &str, sources: &[&str]) -> VolumeGroupSnapshot {
        let reply = self
            .group
            .create_volume_group_snapshot(group_request(name, sources));
        let reply = reply.await.unwrap_or_else(|e| panic!("group {name}: {e}"));
        reply.into_inner().group_snapshot.expect("a group snapshot")
    }
}

/// Three volumes, each with 2 MiB of its own data; their IDs.
async fn three_volumes(csi: &mut Csi, state: &Path) -> Vec<String> {
    let mut ids = Vec::new();
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        let id = create(csi, name, 8 * MIB).await;
        let data = noise(2 * MIB as usize, i as u64);
        std::fs::write(state.join("volumes").join(&id).join("data"), data).unwrap();
        ids.push(id);
    }
    ids
}

fn members(group: &VolumeGroupSnapshot) -> Vec<String> {
    group
        .snapshots
        .iter()
        .map(|s| s.snapshot_id.clone())
        .collect()
}

#[tokio::test]
async fn a_group_snapshot_cuts_its_volumes_together_and_is_deleted_with_its_members() {
    let (sandbox, server, mut csi) = setup().await;
    let state = sandbox.path().join("state");
    let ids = three_volumes(&mut csi, &state).await;
    let sources: Vec<&str> = ids.iter().map(String::as_str).collect();
    let group = csi.group("g", &sources).await;
    assert!(group.ready_to_use && group.group_snapshot_id.starts_with("group-"));
    assert_eq!(group.snapshots.len(), 3);
    for (member, source) in group.snapshots.iter().zip(&ids) {
        assert_eq!(
            &member.source_volume_id, source,
            "members in the order of the sources"
        );
        assert_eq!(member.group_snapshot_id, group.group_snapshot_id);
        assert!(member.ready_to_use && member.snapshot_id.starts_with("snap-"));
        assert_eq!(member.size_bytes, 8 * MIB);
        assert_eq!(member.creation_time, group.creation_time, "cut together");
    }
    let ids_of = members(&group);

    // The same name and volumes (in any order): the same group, every member in full.
    assert_eq!(
        csi.group("g", &[sources[2], sources[0], sources[1]]).await,
        group
    );
    let other = group_request("g", &sources[..2]);
    let reply = csi.group.create_volume_group_snapshot(other).await;
    assert_eq!(code(reply), Code::AlreadyExists);

    let listed = csi.snapshots().await;
    assert_eq!(listed.len(), 3);
    assert!(
        listed
            .iter()
            .all(|s| s.group_snapshot_id == group.group_snapshot_id)
    );
    let got = csi.group.get_volume_group_snapshot(get_request(
        &group.group_snapshot_id,
        &[ids_of[1].clone(), ids_of[0].clone(), ids_of[2].clone()],
    ));
    assert_eq!(
        got.await.unwrap().into_inner().group_snapshot,
        Some(group.clone())
    );
    for wrong in [vec![], ids_of[..2].to_vec(), vec!["snap-x".into(); 3]] {
        let get = get_request(&group.group_snapshot_id, &wrong);
        let reply = csi.group.get_volume_group_snapshot(get).await;
        assert_eq!(code(reply), Code::InvalidArgument, "{wrong:?}");
        let delete = delete_request(&group.group_snapshot_id, &wrong);
        let reply = csi.group.delete_volume_group_snapshot(delete).await;
        assert_eq!(code(reply), Code::InvalidArgument, "{wrong:?}");
    }
    let alone = csi
        .controller
        .delete_snapshot(delete_snapshot_request(&ids_of[0]));
    let status = alone.await.expect_err("a member deleted alone");
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    assert!(
        status.message().contains("DeleteVolumeGroupSnapshot"),
        "{status}"
    );

    // A member restores its own volume's data, even once that volume is gone.
    csi.controller
        .delete_volume(crate::common::csi_node::delete_request(&ids[1]))
        .await
        .unwrap();
    let restored = csi
        .create_from(from_snapshot("restored", 0, &ids_of[1]))
        .await;
    let data = std::fs::read(state.join("volumes").join(&restored.volume_id).join("data"));
    assert_eq!(data.unwrap(), noise(2 * MIB as usize, 1));

    let delete = delete_request(&group.group_snapshot_id, &ids_of);
    csi.group
        .delete_volume_group_snapshot(delete.clone())
        .await
        .expect("delete");
    assert_eq!(csi.snapshots().await, vec![], "the members went with it");
    let data = std::fs::read_dir(state.join("snapshots")).unwrap();
    assert_eq!(data.count(), 0);
    csi.group
        .delete_volume_group_snapshot(delete)
        .await
        .expect("gone already is fine");
    let get = get_request(&group.group_snapshot_id, &ids_of);
    assert_eq!(
        code(csi.group.get_volume_group_snapshot(get).await),
        Code::NotFound
    );
    server.stop().await;
}

#[tokio::test]
async fn a_group_snapshot_refuses_bad_requests_and_leaves_nothing_of_a_failed_cut() {
    let sandbox = MountSandbox::new();
    let state = sandbox.path().join("state");
    // Room for the three volumes and 4 MiB of snapshot data: not for three members of 2 MiB.
    let server = start_at(&sandbox, &state, Some(28 << 20)).await;
    let mut csi = server.client().await;
    let ids = three_volumes(&mut csi, &state).await;
    let (a, b) = (ids[0].as_str(), ids[1].as_str());
    let cases = [
        (group_request("", &[a]), Code::InvalidArgument),
        (group_request("g", &[]), Code::InvalidArgument),
        (group_request("g", &[a, ""]), Code::InvalidArgument),
        (group_request("g", &[a, b, a]), Code::InvalidArgument),
        (group_request("g", &[a, "vol-unknown", b]), Code::NotFound),
        (
            group_request("g", &[a, b, &ids[2]]),
            Code::ResourceExhausted,
        ),
    ];
    for (request, expected) in cases {
        let shown = format!("{:?}", request.source_volume_ids);
        let reply = csi.group.create_volume_group_snapshot(request).await;
        assert_eq!(code(reply), expected, "{shown}");
        assert_eq!(csi.snapshots().await, vec![], "{shown}: nothing is left");
        let data = std::fs::read_dir(state.join("snapshots")).unwrap();
        assert_eq!(data.count(), 0, "{shown}: no data is left");
    }
    let fits = csi.group("g", &[a, b]).await;
    assert_eq!(fits.snapshots.len(), 2, "two members fit");
    server.stop().await;
}

#[tokio::test]
async fn a_group_snapshot_survives_a_restart() {
    let sandbox = MountSandbox::new();
    let state = sandbox.path().join("state");
    let server = start_at(&sandbox, &state, None).await;
    let mut csi = server.client().await;
    let ids = three_volumes(&mut csi, &state).await;
    let group = csi.group("g", &[&ids[0], &ids[2]]).await;
    server.stop().await;
    let server = start_at(&sandbox, &state, None).await;
    let mut csi = server.client().await;
    let get = get_request(&group.group_snapshot_id, &members(&group));
    let got = csi.group.get_volume_group_snapshot(get).await.unwrap();
    assert_eq!(got.into_inner().group_snapshot, Some(group.clone()));
    assert_eq!(csi.group("g", &[&ids[2], &ids[0]]).await, group);
    server.stop().await;
}
