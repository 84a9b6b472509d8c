//! csi-sanity's snapshot and content-source specs (`controller.go`): CreateVolume from a
//! snapshot or a volume, CreateSnapshot, DeleteSnapshot, ListSnapshots, and (csi-test v5.5 on)
//! GetSnapshot. Names are csi-sanity's, with its unique suffix.

use csi_nodekit::proto::csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
use csi_nodekit::proto::csi::*;
use tonic::Code;

use super::*;

fn from_source(request: CreateVolumeRequest, source: Type) -> CreateVolumeRequest {
    CreateVolumeRequest {
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(source),
        }),
        ..request
    }
}

fn snapshot_source(id: &str) -> Type {
    Type::Snapshot(SnapshotSource {
        snapshot_id: id.into(),
    })
}

fn volume_source(id: &str) -> Type {
    Type::Volume(VolumeSource {
        volume_id: id.into(),
    })
}

pub async fn create_volume_from_an_existing_source_snapshot_echoes_the_source(s: &mut Sanity) {
    let source = s.unique("sanity-controller-source-vol");
    let volume = s.must_create(s.create_request(&source)).await;
    let name = s.unique("sanity-controller-snap-from-vol");
    // csi-sanity waits for ready_to_use, asking again with the same request every 5 s.
    let snapshot = loop {
        let snapshot = s.must_create_snapshot(&name, &volume.volume_id).await;
        if snapshot.ready_to_use {
            break snapshot;
        }
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    };
    let request = from_source(
        s.create_request(&s.unique("sanity-controller-vol-from-snap")),
        snapshot_source(&snapshot.snapshot_id),
    );
    let reply = s.create_volume(request).await.expect("restore");
    let restored = reply.into_inner().volume.expect("a volume");
    assert!(restored.content_source.is_some(), "{restored:?}");
}

pub async fn create_volume_fails_with_not_found_for_a_missing_source_snapshot(s: &mut Sanity) {
    let request = from_source(
        s.create_request(&s.unique("sanity-controller-vol-from-snap")),
        snapshot_source("non-existing-snapshot-id"),
    );
    assert_eq!(code(s.create_volume(request).await), Code::NotFound);
}

pub async fn create_volume_from_an_existing_source_volume_succeeds(s: &mut Sanity) {
    let source = s.unique("sanity-controller-source-vol");
    let volume = s.must_create(s.create_request(&source)).await;
    let request = from_source(
        s.create_request(&s.unique("sanity-controller-vol-from-vol")),
        volume_source(&volume.volume_id),
    );
    s.create_volume(request).await.expect("clone");
}

pub async fn create_volume_fails_with_not_found_for_a_missing_source_volume(s: &mut Sanity) {
    let request = from_source(
        s.create_request(&s.unique("sanity-controller-vol-from-vol")),
        volume_source(&unknown_volume_id()),
    );
    assert_eq!(code(s.create_volume(request).await), Code::NotFound);
}

pub async fn create_snapshot_fails_without_a_name(s: &mut Sanity) {
    let request = snapshot_request("", "testId");
    assert_eq!(
        code(s.create_snapshot(request).await),
        Code::InvalidArgument
    );
}

pub async fn create_snapshot_fails_without_a_source_volume_id(s: &mut Sanity) {
    let request = snapshot_request("name", "");
    assert_eq!(
        code(s.create_snapshot(request).await),
        Code::InvalidArgument
    );
}

pub async fn create_snapshot_with_an_existing_name_and_the_same_source_returns_it_again(
    s: &mut Sanity,
) {
    let volume = s.unique("CreateSnapshot-volume-1");
    let volume = s.must_create(s.create_request(&volume)).await.volume_id;
    let name = s.unique("CreateSnapshot-snapshot-1");
    let first = s.must_create_snapshot(&name, &volume).await;
    let second = s.must_create_snapshot(&name, &volume).await;
    // csi-sanity checks each reply alone; the same snapshot, creation time and all, is ours.
    assert_eq!(first, second);
}

pub async fn create_snapshot_with_an_existing_name_and_another_source_already_exists(
    s: &mut Sanity,
) {
    let name = s.unique("CreateSnapshot-snapshot-2");
    let volume = s.unique("CreateSnapshot-volume-2");
    s.must_create_snapshot_of_new_volume(&volume, &name).await;
    let other = s.unique("CreateSnapshot-volume-3");
    let other = s.must_create(s.create_request(&other)).await.volume_id;
    let reply = s.create_snapshot(snapshot_request(&name, &other)).await;
    assert_eq!(code(reply), Code::AlreadyExists);
}

pub async fn create_snapshot_accepts_a_name_of_the_maximum_length(s: &mut Sanity) {
    let volume = s.unique("CreateSnapshot-volume-maxlen-name");
    let volume = s.must_create(s.create_request(&volume)).await.volume_id;
    let name = s.unique_with_length("CreateSnapshot-snapshot-maxlen", MAX_NAME_LENGTH);
    assert_eq!(name.len(), MAX_NAME_LENGTH);
    s.must_create_snapshot(&name, &volume).await;
    s.must_create_snapshot(&name, &volume).await;
}

pub async fn delete_snapshot_fails_without_a_snapshot_id(s: &mut Sanity) {
    let reply = s.csi.controller.delete_snapshot(delete_snapshot("")).await;
    assert_eq!(code(reply), Code::InvalidArgument);
}

pub async fn delete_snapshot_succeeds_for_an_invalid_snapshot_id(s: &mut Sanity) {
    let reply = s
        .csi
        .controller
        .delete_snapshot(delete_snapshot("reallyfakesnapshotid"));
    reply
        .await
        .expect("DeleteSnapshot of an ID that names nothing");
}

/// csi-sanity deletes nothing itself here: its cleanup deletes the snapshot, then the volume,
/// and fails the spec on any error.
pub async fn delete_snapshot_of_a_created_snapshot_succeeds_in_cleanup(s: &mut Sanity) {
    let volume = s.unique("DeleteSnapshot-volume-1");
    let volume = s.create_volume(s.create_request(&volume)).await;
    let volume = volume
        .expect("CreateVolume")
        .into_inner()
        .volume
        .expect("a volume");
    let name = s.unique("DeleteSnapshot-snapshot-1");
    s.must_create_snapshot(&name, &volume.volume_id).await;
}

fn list_request(snapshot_id: &str, source_volume_id: &str) -> ListSnapshotsRequest {
    ListSnapshotsRequest {
        snapshot_id: snapshot_id.into(),
        source_volume_id: source_volume_id.into(),
        ..Default::default()
    }
}

pub async fn list_snapshots_returns_entries_that_each_pass_the_snapshot_checks(s: &mut Sanity) {
    // csi-sanity checks whatever exists; one snapshot makes the check mean something.
    let (volume, name) = (
        s.unique("listSnapshots-volume"),
        s.unique("listSnapshots-snapshot"),
    );
    s.must_create_snapshot_of_new_volume(&volume, &name).await;
    let listed = s.list_snapshots(list_request("", "")).await;
    assert!(!listed.is_empty());
    listed.iter().for_each(verify_snapshot_info);
}

/// Three volumes with a snapshot each, named `<what>-{unrelated-<x>-1, target-<x>,
/// unrelated-<x>-2}`; returns the target's.
async fn three_snapshots(s: &mut Sanity, prefix: &str, x: &str) -> Snapshot {
    let mut target = None;
    for which in [
        format!("unrelated-{x}-1"),
        format!("target-{x}"),
        format!("unrelated-{x}-2"),
    ] {
        let volume = s.unique(&format!("{prefix}-volume-{which}"));
        let snapshot = s.unique(&format!("{prefix}-snapshot-{which}"));
        let (_, snapshot) = s
            .must_create_snapshot_of_new_volume(&volume, &snapshot)
            .await;
        if which.starts_with("target") {
            target = Some(snapshot);
        }
    }
    target.expect("the target was made")
}

pub async fn list_snapshots_returns_only_the_snapshot_with_the_id_asked_for(s: &mut Sanity) {
    let target = three_snapshots(s, "listSnapshots", "s").await;
    let listed = s
        .list_snapshots(list_request(&target.snapshot_id, ""))
        .await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    verify_snapshot_info(&listed[0]);
    assert_eq!(listed[0].snapshot_id, target.snapshot_id);
}

/// csi-sanity asks with nothing there (csi-test#335: a plugin ignoring the filter passes);
/// here one snapshot exists, so the filter must filter.
pub async fn list_snapshots_returns_nothing_for_an_unknown_snapshot_id(s: &mut Sanity) {
    let (volume, name) = (
        s.unique("listSnapshots-volume"),
        s.unique("listSnapshots-snapshot"),
    );
    s.must_create_snapshot_of_new_volume(&volume, &name).await;
    let listed = s.list_snapshots(list_request("none-exist-id", "")).await;
    assert_eq!(listed, Vec::new());
}

pub async fn list_snapshots_returns_only_the_snapshots_of_the_source_volume_asked_for(
    s: &mut Sanity,
) {
    let target = three_snapshots(s, "listSnapshots", "v").await;
    let listed = s
        .list_snapshots(list_request("", &target.source_volume_id))
        .await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    verify_snapshot_info(&listed[0]);
    assert_eq!(listed[0].source_volume_id, target.source_volume_id);
}

/// As for an unknown snapshot ID, one snapshot exists here so that the filter is tested.
pub async fn list_snapshots_returns_nothing_for_an_unknown_source_volume(s: &mut Sanity) {
    let (volume, name) = (
        s.unique("listSnapshots-volume"),
        s.unique("listSnapshots-snapshot"),
    );
    s.must_create_snapshot_of_new_volume(&volume, &name).await;
    let listed = s
        .list_snapshots(list_request("", &unknown_volume_id()))
        .await;
    assert_eq!(listed, Vec::new());
}

pub async fn list_snapshots_shows_new_snapshots_and_forgets_deleted_ones(s: &mut Sanity) {
    let before = s.list_snapshots(list_request("", "")).await.len();
    let volume = s.unique("listSnapshots-volume-3");
    let name = s.unique("listSnapshots-snapshot-3");
    let (_, snapshot) = s.must_create_snapshot_of_new_volume(&volume, &name).await;
    assert_eq!(
        s.list_snapshots(list_request("", "")).await.len(),
        before + 1
    );
    s.delete_snapshot(&snapshot.snapshot_id).await;
    assert_eq!(s.list_snapshots(list_request("", "")).await.len(), before);
}

pub async fn list_snapshots_pages_with_a_next_token_when_fewer_entries_are_asked_for(
    s: &mut Sanity,
) {
    let (min, max_entries) = (5, 2);
    let existing = s.list_snapshots(list_request("", "")).await.len();
    for i in existing..min {
        let (volume, name) = (
            s.unique(&format!("volume{i}")),
            s.unique(&format!("snapshot{i}")),
        );
        s.must_create_snapshot_of_new_volume(&volume, &name).await;
    }
    let total = existing.max(min);
    let first = ListSnapshotsRequest {
        max_entries,
        ..Default::default()
    };
    let reply = s.csi.controller.list_snapshots(first).await;
    let page = reply.expect("ListSnapshots").into_inner();
    assert_eq!(page.entries.len(), max_entries as usize);
    assert!(!page.next_token.is_empty(), "a next token");
    let rest = ListSnapshotsRequest {
        starting_token: page.next_token,
        ..Default::default()
    };
    let rest = s.list_snapshots(rest).await;
    assert_eq!(rest.len(), total - max_entries as usize);
}

/// csi-sanity accepts any error; the spec's general rule says INVALID_ARGUMENT.
pub async fn get_snapshot_fails_without_a_snapshot_id(s: &mut Sanity) {
    let reply = s.csi.controller.get_snapshot(GetSnapshotRequest::default());
    assert_eq!(code(reply.await), Code::InvalidArgument);
}

pub async fn get_snapshot_returns_the_snapshot_with_the_id_asked_for(s: &mut Sanity) {
    let target = three_snapshots(s, "getSnapshot", "s").await;
    let request = GetSnapshotRequest {
        snapshot_id: target.snapshot_id.clone(),
        ..Default::default()
    };
    let reply = s.csi.controller.get_snapshot(request).await;
    let snapshot = reply.expect("GetSnapshot").into_inner().snapshot;
    let snapshot = snapshot.expect("a snapshot");
    verify_snapshot_info(&snapshot);
    assert_eq!(snapshot.snapshot_id, target.snapshot_id);
}

/// csi-sanity accepts any error; the spec names NOT_FOUND.
pub async fn get_snapshot_fails_for_an_unknown_snapshot_id(s: &mut Sanity) {
    let request = GetSnapshotRequest {
        snapshot_id: "none-exist-id".into(),
        ..Default::default()
    };
    let reply = s.csi.controller.get_snapshot(request).await;
    assert_eq!(code(reply), Code::NotFound);
}
