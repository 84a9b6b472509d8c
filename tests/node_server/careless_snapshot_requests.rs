//! What a careless or hostile caller sends the snapshot and group calls, through real gRPC:
//! names over 128 bytes or with NUL, DEL or other excluded control characters, source volume
//! IDs that are paths, snapshot IDs over the limit, and paging tokens that are huge or forged.
//! The spec's codes, a bounded message that never carries the field whole, and nothing made.

use crate::common::csi_node::*;
use csi_nodekit::proto::csi::*;
use tonic::Code;

/// Every careless snapshot or group request, sent through `csi` (whose plugin has the volume
/// `volume`): what was sent, the code it got, the code the spec names, and the length of the
/// error message.
pub(crate) async fn answers(csi: &mut Csi, volume: &str) -> Vec<(String, Code, Code, usize)> {
    fn answer<T>(result: Result<tonic::Response<T>, tonic::Status>) -> (Code, usize) {
        result.map_or_else(|s| (s.code(), s.message().len()), |_| (Code::Ok, 0))
    }
    let snapshot = |name: &str, source: &str| CreateSnapshotRequest {
        name: name.into(),
        source_volume_id: source.into(),
        ..Default::default()
    };
    let group = |name: &str, sources: Vec<String>| CreateVolumeGroupSnapshotRequest {
        name: name.into(),
        source_volume_ids: sources,
        ..Default::default()
    };
    let bad_names = [
        "n".repeat(129),
        "nul\0name".into(),
        "del\u{7f}name".into(),
        "esc\u{1b}name".into(),
    ];
    let mut out = Vec::new();
    let (c, g) = (&mut csi.controller, &mut csi.group);
    for name in &bad_names {
        let (got, len) = answer(c.create_snapshot(snapshot(name, volume)).await);
        out.push((
            format!("CreateSnapshot name {:?}", clip(name)),
            got,
            Code::InvalidArgument,
            len,
        ));
        let (got, len) = answer(
            g.create_volume_group_snapshot(group(name, vec![volume.into()]))
                .await,
        );
        out.push((
            format!("CreateVolumeGroupSnapshot name {:?}", clip(name)),
            got,
            Code::InvalidArgument,
            len,
        ));
    }
    for source in ["../victim", "a/b", ".hidden", &"v".repeat(201)] {
        let (got, len) = answer(c.create_snapshot(snapshot("snap-ok", source)).await);
        out.push((
            format!("CreateSnapshot source {:?}", clip(source)),
            got,
            Code::InvalidArgument,
            len,
        ));
        let request = group("group-ok", vec![source.into()]);
        let (got, len) = answer(g.create_volume_group_snapshot(request).await);
        out.push((
            format!("CreateVolumeGroupSnapshot source {:?}", clip(source)),
            got,
            Code::InvalidArgument,
            len,
        ));
    }
    for id in ["s".repeat(205), "../victim".into(), "a/b".into()] {
        let request = DeleteSnapshotRequest {
            snapshot_id: id.clone(),
            ..Default::default()
        };
        let (got, len) = answer(c.delete_snapshot(request).await);
        out.push((
            format!("DeleteSnapshot {:?}", clip(&id)),
            got,
            Code::InvalidArgument,
            len,
        ));
        let request = GetSnapshotRequest {
            snapshot_id: id.clone(),
            ..Default::default()
        };
        let (got, len) = answer(c.get_snapshot(request).await);
        out.push((
            format!("GetSnapshot {:?}", clip(&id)),
            got,
            Code::InvalidArgument,
            len,
        ));
        let request = DeleteVolumeGroupSnapshotRequest {
            group_snapshot_id: id.clone(),
            ..Default::default()
        };
        let (got, len) = answer(g.delete_volume_group_snapshot(request).await);
        out.push((
            format!("DeleteVolumeGroupSnapshot {:?}", clip(&id)),
            got,
            Code::InvalidArgument,
            len,
        ));
    }
    let tokens = [
        "ab".repeat(5_000),
        "03".into(),
        "+3".into(),
        "18446744073709551616".into(),
        "2e2e".into(),
    ];
    for token in tokens {
        let request = ListSnapshotsRequest {
            starting_token: token.clone(),
            ..Default::default()
        };
        let (got, len) = answer(c.list_snapshots(request).await);
        out.push((
            format!("ListSnapshots token {:?}", clip(&token)),
            got,
            Code::Aborted,
            len,
        ));
        let request = ListVolumesRequest {
            starting_token: token.clone(),
            ..Default::default()
        };
        let (got, len) = answer(c.list_volumes(request).await);
        out.push((
            format!("ListVolumes token {:?}", clip(&token)),
            got,
            Code::Aborted,
            len,
        ));
    }
    out
}

fn clip(value: &str) -> String {
    value.chars().take(20).collect()
}

/// The longest error message a careless request may get: a few names and IDs, clipped.
pub(crate) const MAX_MESSAGE: usize = 200;

#[tokio::test]
async fn careless_snapshot_and_group_requests_get_the_specs_codes_short_messages_and_make_nothing()
{
    let (sandbox, server, mut csi) = setup().await;
    let volume = create(&mut csi, "pvc-careless-snap", 1).await;
    std::fs::create_dir_all(sandbox.path().join("victim")).unwrap();
    for (what, got, want, len) in answers(&mut csi, &volume).await {
        assert_eq!(got, want, "{what}");
        assert!(len <= MAX_MESSAGE, "{what}: a {len}-byte message");
    }
    let listed = csi
        .controller
        .list_snapshots(ListSnapshotsRequest::default());
    assert!(
        listed.await.unwrap().into_inner().entries.is_empty(),
        "no snapshot made"
    );
    server.stop().await;
}

#[tokio::test]
async fn tokens_the_plugin_issued_still_page_through_snapshots() {
    let (_sandbox, server, mut csi) = setup().await;
    let volume = create(&mut csi, "pvc-paging", 1).await;
    for n in 0..3 {
        let request = CreateSnapshotRequest {
            name: format!("snap-{n}"),
            source_volume_id: volume.clone(),
            ..Default::default()
        };
        csi.controller.create_snapshot(request).await.unwrap();
    }
    let (mut token, mut seen) = (String::new(), 0);
    loop {
        let request = ListSnapshotsRequest {
            max_entries: 1,
            starting_token: token,
            ..Default::default()
        };
        let reply = csi
            .controller
            .list_snapshots(request)
            .await
            .unwrap()
            .into_inner();
        seen += reply.entries.len();
        if reply.next_token.is_empty() {
            break;
        }
        token = reply.next_token;
    }
    assert_eq!(seen, 3);
    server.stop().await;
}
