//! What a careless CO sends, through real gRPC with real mounts: a target on (or inside) the
//! staging path, malformed volume IDs in every call, and an inline volume published at two
//! targets.

use crate::common;

use std::collections::HashMap;
use std::path::Path;

use common::csi_node::*;
use csi_nodekit::proto::csi::*;
use tonic::Code;

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_onto_the_staging_path_or_nested_with_it_is_refused_and_leaves_it_staged() {
    let (sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-nested", 1).await;
    let staging = sandbox.dir("plugins/globalmount");
    csi.node
        .node_stage_volume(stage_request(&id, &staging))
        .await
        .unwrap();
    std::fs::write(staging.join("data"), b"kept").unwrap();
    // Through a symlinked parent, the paths only meet once resolved.
    let link = sandbox.path().join("link");
    std::os::unix::fs::symlink(&staging, &link).unwrap();
    for target in [
        staging.clone(),
        staging.join("sub"),
        sandbox.path().join("plugins"),
        link.join("t"),
    ] {
        let publish = publish_request(&id, &staging, &target, false);
        let result = csi.node.node_publish_volume(publish).await;
        assert_eq!(code(result), Code::InvalidArgument, "{}", target.display());
    }
    assert_eq!(
        sandbox.mounts(),
        vec![staging.clone()],
        "only the staging mount"
    );
    assert_eq!(std::fs::read(staging.join("data")).unwrap(), b"kept");
    assert!(!staging.join("sub").exists() && !staging.join("t").exists());
    csi.node
        .node_unstage_volume(unstage_request(&id, &staging))
        .await
        .unwrap();
    server.stop().await;
}

/// Every call that names a volume, with `id` (staging at `<dir>/s`, target `<dir>/t`): the
/// code each answers.
pub(crate) async fn codes_for(csi: &mut Csi, id: &str, dir: &Path) -> Vec<(&'static str, Code)> {
    let (staging, target) = (dir.join("s"), dir.join("t"));
    let code_of = |result: Result<(), tonic::Status>| match result {
        Ok(()) => Code::Ok,
        Err(status) => status.code(),
    };
    let n = &mut csi.node;
    let c = &mut csi.controller;
    let range = Some(CapacityRange {
        required_bytes: 1,
        limit_bytes: 0,
    });
    vec![
        (
            "NodeStageVolume",
            code_of(
                n.node_stage_volume(stage_request(id, &staging))
                    .await
                    .map(drop),
            ),
        ),
        (
            "NodeUnstageVolume",
            code_of(
                n.node_unstage_volume(unstage_request(id, &staging))
                    .await
                    .map(drop),
            ),
        ),
        (
            "NodePublishVolume",
            code_of(
                n.node_publish_volume(publish_request(id, &staging, &target, false))
                    .await
                    .map(drop),
            ),
        ),
        (
            "NodeUnpublishVolume",
            code_of(
                n.node_unpublish_volume(unpublish_request(id, &target))
                    .await
                    .map(drop),
            ),
        ),
        (
            "NodeGetVolumeStats",
            code_of(
                n.node_get_volume_stats(stats_request(id, &dir.display().to_string()))
                    .await
                    .map(drop),
            ),
        ),
        (
            "NodeExpandVolume",
            code_of(
                n.node_expand_volume(NodeExpandVolumeRequest {
                    volume_id: id.into(),
                    volume_path: dir.display().to_string(),
                    capacity_range: range,
                    ..Default::default()
                })
                .await
                .map(drop),
            ),
        ),
        (
            "ValidateVolumeCapabilities",
            code_of(
                c.validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
                    volume_id: id.into(),
                    volume_capabilities: vec![rwo()],
                    ..Default::default()
                })
                .await
                .map(drop),
            ),
        ),
        (
            "ControllerExpandVolume",
            code_of(
                c.controller_expand_volume(ControllerExpandVolumeRequest {
                    volume_id: id.into(),
                    capacity_range: range,
                    ..Default::default()
                })
                .await
                .map(drop),
            ),
        ),
        (
            "DeleteVolume",
            code_of(c.delete_volume(delete_request(id)).await.map(drop)),
        ),
        (
            "CreateVolume from a volume",
            code_of(
                c.create_volume(from_source(volume_source(id)))
                    .await
                    .map(drop),
            ),
        ),
        (
            "CreateVolume from a snapshot",
            code_of(
                c.create_volume(from_source(snapshot_source(id)))
                    .await
                    .map(drop),
            ),
        ),
    ]
}

/// Volume IDs no call may take: not one plain path component, over the spec's 128 bytes, or
/// with a control character.
pub(crate) fn malformed_ids() -> Vec<String> {
    let odd = ["..", "/", "a/b", "../../outside", ".", "", "a\0b", "a\x7fb"];
    let mut ids: Vec<String> = odd.map(String::from).to_vec();
    ids.push("x".repeat(129));
    ids
}

/// A CreateVolume request of a new name whose content comes from `source`.
fn from_source(source: volume_content_source::Type) -> CreateVolumeRequest {
    CreateVolumeRequest {
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(source),
        }),
        ..create_request("pvc-from-a-careless-source", 1 << 20)
    }
}

fn volume_source(id: &str) -> volume_content_source::Type {
    volume_content_source::Type::Volume(volume_content_source::VolumeSource {
        volume_id: id.into(),
    })
}

fn snapshot_source(id: &str) -> volume_content_source::Type {
    volume_content_source::Type::Snapshot(volume_content_source::SnapshotSource {
        snapshot_id: id.into(),
    })
}

#[tokio::test]
async fn malformed_volume_ids_are_invalid_in_every_call_and_unknown_ones_are_not_found() {
    let (sandbox, server, mut csi) = setup().await;
    let dir = sandbox.dir("pods");
    let outside = sandbox.dir("outside");
    std::fs::write(outside.join("keep"), b"x").unwrap();
    for bad in malformed_ids() {
        for (rpc, code) in codes_for(&mut csi, &bad, &dir).await {
            assert_eq!(code, Code::InvalidArgument, "{rpc} of {bad:?}");
        }
    }
    // Well-formed IDs of no volume, as csi-sanity sends them, keep their spec answers.
    for unknown in ["none-exist-id", "fake-vol-id-0123456789", &"x".repeat(128)] {
        let expected = |rpc: &str| match rpc {
            "NodeUnstageVolume" | "NodeUnpublishVolume" | "DeleteVolume" => Code::Ok,
            _ => Code::NotFound,
        };
        for (rpc, code) in codes_for(&mut csi, unknown, &dir).await {
            assert_eq!(code, expected(rpc), "{rpc} of {unknown:?}");
        }
    }
    assert!(outside.join("keep").exists());
    assert!(sandbox.mounts().is_empty());
    server.stop().await;
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_volume_published_at_two_targets_stays_until_its_last_unpublish() {
    let (sandbox, server, mut csi) = setup().await;
    let pods = sandbox.dir("pods");
    let (first, second) = (pods.join("first"), pods.join("second"));
    let id = "csi-twice";
    let publish = |target: &Path| NodePublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.display().to_string(),
        volume_capability: Some(rwo()),
        volume_context: HashMap::from([
            ("csi.storage.k8s.io/ephemeral".into(), "true".into()),
            ("size".into(), "1Mi".into()),
        ]),
        ..Default::default()
    };
    for target in [&first, &second] {
        csi.node.node_publish_volume(publish(target)).await.unwrap();
    }
    std::fs::write(first.join("note"), b"shared").unwrap();
    csi.node
        .node_unpublish_volume(unpublish_request(id, &first))
        .await
        .expect("the first unpublish succeeds");
    assert!(!is_mounted(&first) && !first.exists());
    assert!(is_mounted(&second), "the second target stays");
    assert_eq!(std::fs::read(second.join("note")).unwrap(), b"shared");
    let data = sandbox.path().join("state/volumes").join(id);
    assert!(data.is_dir());
    csi.node
        .node_unpublish_volume(unpublish_request(id, &second))
        .await
        .expect("the last unpublish succeeds");
    assert!(!data.exists(), "removed with its last target");
    assert!(csi.list().await.is_empty());
    assert!(sandbox.mounts().is_empty());
    server.stop().await;
}
