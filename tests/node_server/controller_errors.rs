//! Error codes of the Controller and Identity services through real gRPC, as the CSI spec
//! (and csi-sanity) expects them: missing and malformed fields, unknown volumes, incompatible
//! repeats, capacity, pagination; and bad flags of the binary.

use crate::common;

use std::collections::HashMap;

use common::csi_node::*;
use csi_nodekit::proto::csi::*;
use tonic::Code;

#[tokio::test]
async fn create_volume_refuses_missing_and_unsupported_fields_with_exact_codes() {
    let (_sandbox, server, mut csi) = setup().await;
    let c = &mut csi.controller;
    let no_name = create_request("", 1);
    assert_eq!(code(c.create_volume(no_name).await), Code::InvalidArgument);
    let no_caps = CreateVolumeRequest {
        volume_capabilities: vec![],
        ..create_request("n", 1)
    };
    assert_eq!(code(c.create_volume(no_caps).await), Code::InvalidArgument);
    // A volume is a directory or a device: both at once is not a volume.
    let mut both = create_request("n", 1);
    let mut block = both.volume_capabilities[0].clone();
    block.access_type = Some(volume_capability::AccessType::Block(
        volume_capability::BlockVolume {},
    ));
    both.volume_capabilities.push(block);
    assert_eq!(code(c.create_volume(both).await), Code::InvalidArgument);
    let negative = create_request("n", -1);
    assert_eq!(code(c.create_volume(negative).await), Code::InvalidArgument);
    let inverted = CreateVolumeRequest {
        capacity_range: Some(CapacityRange {
            required_bytes: 10,
            limit_bytes: 5,
        }),
        ..create_request("n", 0)
    };
    assert_eq!(code(c.create_volume(inverted).await), Code::OutOfRange);
    // A content source must name a snapshot or a volume, by a non-empty ID.
    for source in [
        None,
        Some(volume_content_source::Type::Volume(
            volume_content_source::VolumeSource::default(),
        )),
        Some(volume_content_source::Type::Snapshot(
            volume_content_source::SnapshotSource::default(),
        )),
    ] {
        let clone = CreateVolumeRequest {
            volume_content_source: Some(VolumeContentSource { r#type: source }),
            ..create_request("n", 1)
        };
        assert_eq!(code(c.create_volume(clone).await), Code::InvalidArgument);
    }
    let elsewhere = CreateVolumeRequest {
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![Topology {
                segments: HashMap::from([(format!("topology.{DRIVER}/node"), "node-b".into())]),
            }],
            preferred: vec![],
        }),
        ..create_request("n", 1)
    };
    assert_eq!(
        code(c.create_volume(elsewhere).await),
        Code::ResourceExhausted
    );
    let too_big = create_request("big", 65 << 20);
    assert_eq!(
        code(c.create_volume(too_big).await),
        Code::ResourceExhausted
    );
    server.stop().await;
}

#[tokio::test]
async fn the_same_name_with_another_size_already_exists_and_the_same_size_is_the_same_volume() {
    let (_sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-1", 1 << 20).await;
    assert_eq!(create(&mut csi, "pvc-1", 1 << 20).await, id);
    let bigger = CreateVolumeRequest {
        capacity_range: Some(CapacityRange {
            required_bytes: 2 << 20,
            limit_bytes: 2 << 20,
        }),
        ..create_request("pvc-1", 0)
    };
    assert_eq!(
        code(csi.controller.create_volume(bigger).await),
        Code::AlreadyExists
    );
    let here = CreateVolumeRequest {
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![Topology {
                segments: HashMap::from([(format!("topology.{DRIVER}/node"), NODE.into())]),
            }],
            preferred: vec![],
        }),
        ..create_request("pvc-2", 1)
    };
    let volume = csi
        .controller
        .create_volume(here)
        .await
        .unwrap()
        .into_inner();
    let topology = &volume.volume.unwrap().accessible_topology[0].segments;
    assert_eq!(topology[&format!("topology.{DRIVER}/node")], NODE);
    server.stop().await;
}

#[tokio::test]
async fn delete_volume_needs_a_well_formed_id_and_succeeds_for_unknown_ones() {
    let (sandbox, server, mut csi) = setup().await;
    let outside = sandbox.dir("outside");
    std::fs::write(outside.join("keep"), b"x").unwrap();
    let c = &mut csi.controller;
    for malformed in ["", "../../outside", ".."] {
        assert_eq!(
            code(c.delete_volume(delete_request(malformed)).await),
            Code::InvalidArgument,
            "{malformed:?}"
        );
    }
    c.delete_volume(delete_request("vol-does-not-exist"))
        .await
        .unwrap();
    assert!(outside.join("keep").exists());
    assert!(sandbox.path().join("state/volumes").is_dir());
    server.stop().await;
}

#[tokio::test]
async fn validate_volume_capabilities_checks_fields_then_existence() {
    let (_sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-v", 1).await;
    let c = &mut csi.controller;
    let request = |id: &str, caps: Vec<VolumeCapability>| ValidateVolumeCapabilitiesRequest {
        volume_id: id.into(),
        volume_capabilities: caps,
        ..Default::default()
    };
    let no_id = request("", vec![rwo()]);
    assert_eq!(
        code(c.validate_volume_capabilities(no_id).await),
        Code::InvalidArgument
    );
    let no_caps = request(&id, vec![]);
    assert_eq!(
        code(c.validate_volume_capabilities(no_caps).await),
        Code::InvalidArgument
    );
    let unknown = request("vol-unknown", vec![rwo()]);
    assert_eq!(
        code(c.validate_volume_capabilities(unknown).await),
        Code::NotFound
    );
    let ok = c
        .validate_volume_capabilities(request(&id, vec![rwo()]))
        .await
        .unwrap();
    assert_eq!(
        ok.into_inner().confirmed.unwrap().volume_capabilities,
        vec![rwo()]
    );
    let mut block = rwo();
    block.access_type = Some(volume_capability::AccessType::Block(
        volume_capability::BlockVolume {},
    ));
    let refused = c
        .validate_volume_capabilities(request(&id, vec![block]))
        .await
        .unwrap();
    let refused = refused.into_inner();
    assert!(refused.confirmed.is_none() && refused.message.contains("block"));
    server.stop().await;
}

#[tokio::test]
async fn list_volumes_pages_with_tokens_and_aborts_on_a_foreign_token() {
    let (_sandbox, server, mut csi) = setup().await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(create(&mut csi, &format!("pvc-{i}"), 1).await);
    }
    ids.sort();
    let c = &mut csi.controller;
    let (mut seen, mut token) = (Vec::new(), String::new());
    loop {
        let page = c
            .list_volumes(ListVolumesRequest {
                max_entries: 2,
                starting_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.entries.len() <= 2);
        seen.extend(
            page.entries
                .into_iter()
                .map(|e| e.volume.unwrap().volume_id),
        );
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    assert_eq!(seen, ids);
    let foreign = ListVolumesRequest {
        max_entries: 0,
        starting_token: "invalid-token".into(),
    };
    assert_eq!(code(c.list_volumes(foreign).await), Code::Aborted);
    let negative = ListVolumesRequest {
        max_entries: -1,
        starting_token: String::new(),
    };
    assert_eq!(code(c.list_volumes(negative).await), Code::InvalidArgument);
    server.stop().await;
}

#[tokio::test]
async fn capacity_is_reported_for_this_node_only_and_spent_by_volumes() {
    let (_sandbox, server, mut csi) = setup().await;
    create(&mut csi, "pvc-c", 16 << 20).await;
    let c = &mut csi.controller;
    let here = c.get_capacity(GetCapacityRequest::default()).await.unwrap();
    assert_eq!(here.into_inner().available_capacity, 48 << 20);
    let elsewhere = GetCapacityRequest {
        accessible_topology: Some(Topology {
            segments: HashMap::from([(format!("topology.{DRIVER}/node"), "node-b".into())]),
        }),
        ..Default::default()
    };
    let there = c.get_capacity(elsewhere).await.unwrap();
    assert_eq!(there.into_inner().available_capacity, 0);
    server.stop().await;
}

#[tokio::test]
async fn controller_expand_checks_fields_existence_and_capacity() {
    let (_sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-e", 1 << 20).await;
    let expand = |id: &str, range: Option<(i64, i64)>| ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: range.map(|(required_bytes, limit_bytes)| CapacityRange {
            required_bytes,
            limit_bytes,
        }),
        ..Default::default()
    };
    let c = &mut csi.controller;
    assert_eq!(
        code(c.controller_expand_volume(expand("", Some((1, 0)))).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(c.controller_expand_volume(expand(&id, None)).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            c.controller_expand_volume(expand("vol-x", Some((1, 0))))
                .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(
            c.controller_expand_volume(expand(&id, Some((128 << 20, 0))))
                .await
        ),
        Code::OutOfRange
    );
    assert_eq!(
        code(
            c.controller_expand_volume(expand(&id, Some((0, 1000))))
                .await
        ),
        Code::OutOfRange
    );
    let same = c
        .controller_expand_volume(expand(&id, Some((1, 0))))
        .await
        .unwrap();
    assert_eq!(
        same.into_inner().capacity_bytes,
        1 << 20,
        "volumes never shrink"
    );
    server.stop().await;
}

#[tokio::test]
async fn identity_and_node_info_describe_the_driver_and_pin_volumes_to_this_node() {
    let (_sandbox, server, mut csi) = setup().await;
    let info = csi
        .identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, DRIVER);
    assert!(!info.vendor_version.is_empty());
    let probe = csi
        .identity
        .probe(ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true));
    let node = csi
        .node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(node.node_id, NODE);
    assert_eq!(
        node.accessible_topology.unwrap().segments[&format!("topology.{DRIVER}/node")],
        NODE
    );
    let caps = csi
        .node
        .node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(caps.capabilities.len(), 6);
    let caps = csi
        .controller
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(caps.capabilities.len(), 9);
    let publish = ControllerPublishVolumeRequest::default();
    assert_eq!(
        code(csi.controller.controller_publish_volume(publish).await),
        Code::Unimplemented
    );
    server.stop().await;
}

#[test]
fn bad_driver_names_node_ids_capacities_block_sizes_and_endpoints_exit_2_naming_the_value() {
    let dir = tempfile::tempdir().unwrap();
    for (flag, shown) in [
        ("--driver-name=../evil", "\"../evil\""),
        ("--node-id=", "node ID"),
        ("--capacity=10 parsecs", "\"10 parsecs\""),
        ("--max-volumes-per-node=-1", "negative"),
        (
            "--snapshot-metadata-block-size=3000",
            "power of two from 4Ki to 1Gi, not 3000",
        ),
        (
            "--snapshot-metadata-block-size=2Ki",
            "power of two from 4Ki to 1Gi, not 2048",
        ),
        // The last --endpoint wins, as with Go's flag package.
        (
            "--endpoint=unix://relative.sock",
            "\"unix://relative.sock\"",
        ),
    ] {
        let output = std::process::Command::new(common::binary())
            .arg("node-server")
            .arg(format!(
                "--endpoint={}",
                dir.path().join("csi.sock").display()
            ))
            .arg(format!(
                "--state-dir={}",
                dir.path().join("state").display()
            ))
            .arg(flag)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flag}: {stderr}");
        assert!(stderr.contains(shown), "{flag}: {stderr}");
        assert!(!dir.path().join("csi.sock").exists());
    }
}
