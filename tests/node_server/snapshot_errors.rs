//! Every error code of the snapshot calls and of CreateVolume's content sources, ListSnapshots'
//! paging and filters, and `--capacity` counting snapshot data. No mounts are needed: data is
//! written straight into the volume directories, and any user can run these.

use std::path::Path;

use csi_nodekit::proto::csi::*;
use tonic::Code;

use crate::common::csi_node::*;
use crate::common::csi_snapshots::*;
use crate::common::tree_fixture::noise;

const MIB: i64 = 1 << 20;

/// `count` files of 1 MiB in the volume's directory.
fn write_mib_files(state: &Path, id: &str, count: u64) {
    for i in 0..count {
        let file = state.join("volumes").join(id).join(format!("f{i}"));
        std::fs::write(file, noise(MIB as usize, i)).unwrap();
    }
}

fn range(required: i64, limit: i64) -> Option<CapacityRange> {
    Some(CapacityRange {
        required_bytes: required,
        limit_bytes: limit,
    })
}

#[tokio::test]
async fn restores_and_clones_refuse_missing_sources_smaller_sizes_and_names_taken() {
    let (sandbox, server, mut csi) = setup().await;
    let source = create(&mut csi, "source", 8 * MIB).await;
    let snap = csi.snapshot("snap", &source).await.snapshot_id;
    let c = &mut csi.controller;
    for missing in [
        from_snapshot("r", 0, "snap-missing"),
        from_snapshot("r", 0, &source),
        from_volume("r", 0, &unknown_id()),
        from_volume("r", 0, &snap),
    ] {
        assert_eq!(code(c.create_volume(missing).await), Code::NotFound);
    }
    for smaller in [
        from_snapshot("r", 4 * MIB, &snap),
        from_volume("r", 4 * MIB, &source),
    ] {
        let smaller = CreateVolumeRequest {
            capacity_range: range(4 * MIB, 4 * MIB),
            ..smaller
        };
        assert_eq!(code(c.create_volume(smaller).await), Code::OutOfRange);
    }
    // A smaller size asked for, with room above it: raised to the source's.
    let raised = csi.create_from(from_snapshot("r1", 4 * MIB, &snap)).await;
    assert_eq!(raised.capacity_bytes, 8 * MIB);
    let again = csi.create_from(from_snapshot("r1", 4 * MIB, &snap)).await;
    assert_eq!(again, raised, "the same name and source: the same volume");
    let c = &mut csi.controller;
    for other in [
        from_volume("r1", 0, &source),
        create_request("r1", 8 * MIB),
        from_snapshot("source", 0, &snap),
    ] {
        assert_eq!(code(c.create_volume(other).await), Code::AlreadyExists);
    }
    let volumes = std::fs::read_dir(sandbox.path().join("state/volumes")).unwrap();
    assert_eq!(volumes.count(), 2, "nothing is left of the refused ones");
    server.stop().await;
}

/// An ID of the shape we issue that names no volume.
fn unknown_id() -> String {
    "vol-00000000000000000000000000000000".into()
}

#[tokio::test]
async fn snapshot_calls_are_idempotent_and_refuse_bad_requests_with_exact_codes() {
    let (_sandbox, server, mut csi) = setup().await;
    let a = create(&mut csi, "a", MIB).await;
    let b = create(&mut csi, "b", MIB).await;
    let first = csi.snapshot("snap", &a).await;
    assert_eq!(
        csi.snapshot("snap", &a).await,
        first,
        "creation time and all"
    );
    let c = &mut csi.controller;
    let cases = [
        (snapshot_request("snap", &b), Code::AlreadyExists),
        (snapshot_request("other", &unknown_id()), Code::NotFound),
        (snapshot_request("", &a), Code::InvalidArgument),
        (snapshot_request("other", ""), Code::InvalidArgument),
    ];
    for (request, expected) in cases {
        assert_eq!(code(c.create_snapshot(request).await), expected);
    }
    let get = |id: &str| GetSnapshotRequest {
        snapshot_id: id.into(),
        ..Default::default()
    };
    let got = c.get_snapshot(get(&first.snapshot_id)).await.unwrap();
    assert_eq!(got.into_inner().snapshot, Some(first.clone()));
    assert_eq!(code(c.get_snapshot(get("snap-nope")).await), Code::NotFound);
    assert_eq!(code(c.get_snapshot(get("")).await), Code::InvalidArgument);
    let empty = delete_snapshot_request("");
    assert_eq!(code(c.delete_snapshot(empty).await), Code::InvalidArgument);
    for id in [first.snapshot_id.as_str(), &first.snapshot_id, "snap-nope"] {
        c.delete_snapshot(delete_snapshot_request(id))
            .await
            .unwrap_or_else(|e| panic!("delete {id}: {e}"));
    }
    // Malformed is not "gone already": refused, as a malformed volume ID is.
    let malformed = c.delete_snapshot(delete_snapshot_request("../x")).await;
    assert_eq!(code(malformed), Code::InvalidArgument);
    assert_eq!(
        code(c.get_snapshot(get(&first.snapshot_id)).await),
        Code::NotFound
    );
    server.stop().await;
}

#[tokio::test]
async fn list_snapshots_pages_with_opaque_tokens_and_filters_by_snapshot_and_source() {
    let (_sandbox, server, mut csi) = setup().await;
    let (a, b) = (
        create(&mut csi, "a", MIB).await,
        create(&mut csi, "b", MIB).await,
    );
    let mut all = Vec::new();
    for i in 0..7 {
        all.push(
            csi.snapshot(&format!("s{i}"), if i < 5 { &a } else { &b })
                .await,
        );
    }
    all.sort_by(|x, y| x.snapshot_id.cmp(&y.snapshot_id));
    assert_eq!(csi.snapshots().await, all);

    let page = |max_entries, token: &str, source: &str| ListSnapshotsRequest {
        max_entries,
        starting_token: token.into(),
        source_volume_id: source.into(),
        ..Default::default()
    };
    let c = &mut csi.controller;
    let (mut seen, mut token, mut sizes) = (Vec::new(), String::new(), Vec::new());
    loop {
        let reply = c
            .list_snapshots(page(3, &token, ""))
            .await
            .unwrap()
            .into_inner();
        sizes.push(reply.entries.len());
        seen.extend(reply.entries.into_iter().filter_map(|e| e.snapshot));
        if reply.next_token.is_empty() {
            break;
        }
        assert!(!reply.next_token.contains("snap-"), "tokens are opaque");
        token = reply.next_token;
    }
    assert_eq!((sizes, seen), (vec![3, 3, 1], all.clone()));

    // A token stays good when the snapshot it names is deleted.
    let first = c
        .list_snapshots(page(2, "", ""))
        .await
        .unwrap()
        .into_inner();
    let next = all[2].snapshot_id.clone();
    c.delete_snapshot(delete_snapshot_request(&next))
        .await
        .unwrap();
    let rest = c
        .list_snapshots(page(0, &first.next_token, ""))
        .await
        .unwrap();
    let rest: Vec<_> = rest
        .into_inner()
        .entries
        .into_iter()
        .filter_map(|e| e.snapshot)
        .collect();
    assert_eq!(rest, all[3..].to_vec());

    for bad in ["not-a-token", "zz", "2f2e2e"] {
        assert_eq!(
            code(c.list_snapshots(page(0, bad, "")).await),
            Code::Aborted,
            "{bad}"
        );
    }
    let negative = page(-1, "", "");
    assert_eq!(
        code(c.list_snapshots(negative).await),
        Code::InvalidArgument
    );

    let of_a: Vec<_> = all
        .iter()
        .filter(|s| s.source_volume_id == a)
        .cloned()
        .collect();
    let of_a: Vec<_> = of_a.into_iter().filter(|s| s.snapshot_id != next).collect();
    let (mut listed, mut token) = (Vec::new(), String::new());
    loop {
        let reply = c
            .list_snapshots(page(2, &token, &a))
            .await
            .unwrap()
            .into_inner();
        assert!(reply.entries.len() <= 2);
        listed.extend(reply.entries.into_iter().filter_map(|e| e.snapshot));
        if reply.next_token.is_empty() {
            break;
        }
        token = reply.next_token;
    }
    assert_eq!(listed, of_a, "paging within the filter");
    let of_b = (all.iter())
        .find(|s| s.source_volume_id == b && s.snapshot_id != next)
        .expect("one of b's snapshots is left");
    let one = ListSnapshotsRequest {
        snapshot_id: of_b.snapshot_id.clone(),
        ..Default::default()
    };
    let reply = c.list_snapshots(one.clone()).await.unwrap().into_inner();
    assert_eq!(reply.entries.len(), 1);
    let mismatch = ListSnapshotsRequest {
        source_volume_id: a.clone(),
        ..one
    };
    let reply = c.list_snapshots(mismatch).await.unwrap().into_inner();
    assert!(reply.entries.is_empty(), "both filters apply");
    server.stop().await;
}

async fn available(csi: &mut Csi) -> i64 {
    let reply = csi.controller.get_capacity(GetCapacityRequest::default());
    reply.await.unwrap().into_inner().available_capacity
}

#[tokio::test]
async fn with_a_capacity_snapshot_data_counts_against_it_and_a_snapshot_beyond_it_is_refused() {
    let sandbox = MountSandbox::new();
    let state = sandbox.path().join("state");
    let server = start_at(&sandbox, &state, Some(64 << 20)).await;
    let mut csi = server.client().await;
    let id = create(&mut csi, "data", 32 * MIB).await;
    write_mib_files(&state, &id, 8);
    let snap = csi.snapshot("snap", &id).await;
    let left = available(&mut csi).await;
    // What the snapshot's files hold, whatever reflinks share now: the source may be
    // rewritten, and then every block is kept twice.
    assert!(
        (23 * MIB..=24 * MIB).contains(&left),
        "{left} left after 8 MiB of snapshot"
    );
    create(&mut csi, "more", left - 4 * MIB).await;
    let refused = csi
        .controller
        .create_snapshot(snapshot_request("again", &id));
    assert_eq!(code(refused.await), Code::ResourceExhausted);
    let data = std::fs::read_dir(state.join("snapshots")).unwrap();
    assert_eq!(data.count(), 1, "the refused copy is removed");
    server.stop().await;

    let server = start_at(&sandbox, &state, Some(64 << 20)).await;
    let mut csi = server.client().await;
    assert_eq!(
        available(&mut csi).await,
        4 * MIB,
        "counted again after a restart"
    );
    csi.delete_snapshot(&snap.snapshot_id).await;
    assert_eq!(
        available(&mut csi).await,
        64 * MIB - 32 * MIB - (left - 4 * MIB)
    );
    server.stop().await;
}
