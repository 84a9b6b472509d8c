//! Every error code the CSI spec (and csi-sanity) expects, through real gRPC: missing and
//! malformed fields, unknown volumes, incompatible repeats, ordering, capacity, pagination,
//! and path traversal.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::csi_node::*;
use csi_nodekit::proto::csi::volume_capability::access_mode::Mode;
use csi_nodekit::proto::csi::*;
use tonic::Code;

async fn setup() -> (MountSandbox, CsiServer, Csi) {
    let sandbox = MountSandbox::new();
    let config = csi_nodekit::node_server::Config {
        capacity: Some(64 << 20),
        ..config(&sandbox)
    };
    let server = start(&sandbox, config).await;
    let csi = server.client().await;
    (sandbox, server, csi)
}

fn delete(id: &str) -> DeleteVolumeRequest {
    DeleteVolumeRequest {
        volume_id: id.into(),
        ..Default::default()
    }
}

fn stats(id: &str, path: &str) -> NodeGetVolumeStatsRequest {
    NodeGetVolumeStatsRequest {
        volume_id: id.into(),
        volume_path: path.into(),
        staging_target_path: String::new(),
    }
}

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
    let mut block = create_request("n", 1);
    block.volume_capabilities[0].access_type = Some(volume_capability::AccessType::Block(
        volume_capability::BlockVolume {},
    ));
    assert_eq!(code(c.create_volume(block).await), Code::InvalidArgument);
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
    let clone = CreateVolumeRequest {
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Volume(
                volume_content_source::VolumeSource {
                    volume_id: "x".into(),
                },
            )),
        }),
        ..create_request("n", 1)
    };
    assert_eq!(code(c.create_volume(clone).await), Code::InvalidArgument);
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
async fn delete_volume_needs_an_id_and_succeeds_for_unknown_or_impossible_ones() {
    let (sandbox, server, mut csi) = setup().await;
    let outside = sandbox.dir("outside");
    std::fs::write(outside.join("keep"), b"x").unwrap();
    let c = &mut csi.controller;
    assert_eq!(
        code(c.delete_volume(delete("")).await),
        Code::InvalidArgument
    );
    c.delete_volume(delete("vol-does-not-exist")).await.unwrap();
    c.delete_volume(delete("../../outside")).await.unwrap();
    c.delete_volume(delete("..")).await.unwrap();
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
async fn node_calls_refuse_missing_fields_before_looking_the_volume_up() {
    let (sandbox, server, mut csi) = setup().await;
    let staging = sandbox.dir("staging");
    let target = sandbox.path().join("target");
    let n = &mut csi.node;
    let mut no_cap = stage_request("vol-x", &staging);
    no_cap.volume_capability = None;
    for request in [
        stage_request("", &staging),
        stage_request("vol-x", Path::new("")),
        no_cap,
    ] {
        assert_eq!(
            code(n.node_stage_volume(request).await),
            Code::InvalidArgument
        );
    }
    let mut no_cap = publish_request("vol-x", &staging, &target, false);
    no_cap.volume_capability = None;
    for request in [
        publish_request("", &staging, &target, false),
        publish_request("vol-x", &staging, Path::new(""), false),
        no_cap,
    ] {
        assert_eq!(
            code(n.node_publish_volume(request).await),
            Code::InvalidArgument
        );
    }
    for request in [
        unpublish_request("", &target),
        unpublish_request("vol-x", Path::new("")),
    ] {
        assert_eq!(
            code(n.node_unpublish_volume(request).await),
            Code::InvalidArgument
        );
    }
    for request in [
        unstage_request("", &staging),
        unstage_request("vol-x", Path::new("")),
    ] {
        assert_eq!(
            code(n.node_unstage_volume(request).await),
            Code::InvalidArgument
        );
    }
    for request in [stats("", "some/path"), stats("vol-x", "")] {
        assert_eq!(
            code(n.node_get_volume_stats(request).await),
            Code::InvalidArgument
        );
    }
    let expand = |id: &str, path: &str| NodeExpandVolumeRequest {
        volume_id: id.into(),
        volume_path: path.into(),
        ..Default::default()
    };
    assert_eq!(
        code(n.node_expand_volume(expand("", "/x")).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(n.node_expand_volume(expand("vol-x", "")).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(n.node_expand_volume(expand("vol-x", "some/path")).await),
        Code::NotFound
    );
    server.stop().await;
}

#[tokio::test]
async fn unknown_volumes_are_not_found_and_a_bad_stats_path_is_not_found() {
    let (sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-nf", 1).await;
    let staging = sandbox.dir("staging");
    let target = sandbox.path().join("target");
    let n = &mut csi.node;
    assert_eq!(
        code(n.node_stage_volume(stage_request("vol-x", &staging)).await),
        Code::NotFound
    );
    let publish = publish_request("vol-x", &staging, &target, false);
    assert_eq!(code(n.node_publish_volume(publish).await), Code::NotFound);
    assert_eq!(
        code(n.node_get_volume_stats(stats("vol-x", "some/path")).await),
        Code::NotFound
    );
    assert_eq!(
        code(n.node_get_volume_stats(stats(&id, "some/path")).await),
        Code::NotFound
    );
    let missing = stats(&id, &sandbox.path().join("nope").display().to_string());
    assert_eq!(code(n.node_get_volume_stats(missing).await), Code::NotFound);
    let unmounted = n
        .node_get_volume_stats(stats(&id, &staging.display().to_string()))
        .await
        .unwrap()
        .into_inner();
    assert!(
        unmounted.volume_condition.unwrap().abnormal,
        "not mounted there"
    );
    // Unpublishing or unstaging what is not there is already done, for any volume.
    n.node_unpublish_volume(unpublish_request("vol-x", &target))
        .await
        .unwrap();
    n.node_unstage_volume(unstage_request("vol-x", &staging))
        .await
        .unwrap();
    n.node_unstage_volume(unstage_request(&id, &staging))
        .await
        .unwrap();
    server.stop().await;
}

#[tokio::test]
async fn ordering_and_compatibility_errors_have_their_spec_codes() {
    let (sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-o", 1).await;
    let other = create(&mut csi, "pvc-other", 1).await;
    let staging = sandbox.dir("staging");
    let target = sandbox.dir("pods").join("t");
    let n = &mut csi.node;
    let early = publish_request(&id, &staging, &target, false);
    assert_eq!(
        code(n.node_publish_volume(early).await),
        Code::FailedPrecondition
    );
    let mut unstaged = publish_request(&id, &staging, &target, false);
    unstaged.staging_target_path.clear();
    assert_eq!(
        code(n.node_publish_volume(unstaged).await),
        Code::FailedPrecondition
    );
    assert!(
        sandbox.mounts().is_empty(),
        "nothing was mounted by refused calls"
    );

    n.node_stage_volume(stage_request(&id, &staging))
        .await
        .unwrap();
    assert_eq!(
        code(n.node_stage_volume(stage_request(&other, &staging)).await),
        Code::AlreadyExists,
        "another volume is staged there"
    );
    let mut block = stage_request(&id, &staging);
    block.volume_capability.as_mut().unwrap().access_type = Some(
        volume_capability::AccessType::Block(volume_capability::BlockVolume {}),
    );
    assert_eq!(
        code(n.node_stage_volume(block).await),
        Code::FailedPrecondition
    );
    let mut bad_flag = publish_request(&id, &staging, &target, false);
    bad_flag.volume_capability = Some(capability(Mode::SingleNodeWriter, &["discard"]));
    assert_eq!(
        code(n.node_publish_volume(bad_flag).await),
        Code::InvalidArgument
    );

    n.node_publish_volume(publish_request(&id, &staging, &target, false))
        .await
        .unwrap();
    let read_only = publish_request(&id, &staging, &target, true);
    assert_eq!(
        code(n.node_publish_volume(read_only).await),
        Code::AlreadyExists
    );
    let mut exclusive = publish_request(&id, &staging, &target.with_file_name("t2"), false);
    exclusive.volume_capability = Some(capability(Mode::SingleNodeSingleWriter, &[]));
    assert_eq!(
        code(n.node_publish_volume(exclusive).await),
        Code::FailedPrecondition
    );
    assert_eq!(
        code(
            n.node_unpublish_volume(unpublish_request("vol-x", &target))
                .await
        ),
        Code::NotFound,
        "an unknown volume with something mounted at the target"
    );
    n.node_unpublish_volume(unpublish_request(&id, &target))
        .await
        .unwrap();
    n.node_unstage_volume(unstage_request(&id, &staging))
        .await
        .unwrap();
    server.stop().await;
}

#[tokio::test]
async fn deleting_a_still_mounted_volume_is_refused_and_its_data_stays_intact() {
    let (sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-busy", 1).await;
    let staging = sandbox.dir("staging");
    csi.node
        .node_stage_volume(stage_request(&id, &staging))
        .await
        .unwrap();
    std::fs::create_dir(staging.join("dir")).unwrap();
    std::fs::write(staging.join("dir/data"), b"precious").unwrap();
    assert_eq!(
        code(csi.controller.delete_volume(delete(&id)).await),
        Code::FailedPrecondition
    );
    assert_eq!(
        std::fs::read(staging.join("dir/data")).unwrap(),
        b"precious"
    );
    let data = sandbox
        .path()
        .join("state/volumes")
        .join(&id)
        .join("dir/data");
    assert_eq!(std::fs::read(data).unwrap(), b"precious");
    // A mount inside the volume (not from it) also keeps it alive.
    csi.node
        .node_unstage_volume(unstage_request(&id, &staging))
        .await
        .unwrap();
    let inner = sandbox.path().join("state/volumes").join(&id).join("dir");
    nix::mount::mount(
        Some("tmpfs"),
        &inner,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    assert_eq!(
        code(csi.controller.delete_volume(delete(&id)).await),
        Code::FailedPrecondition
    );
    nix::mount::umount(&inner).unwrap();
    csi.controller.delete_volume(delete(&id)).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn path_traversal_and_paths_over_the_state_directory_are_refused() {
    let (sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-p", 1).await;
    let staging = sandbox.dir("staging");
    let state = sandbox.path().join("state");
    let n = &mut csi.node;
    let escape = format!("{}/pods/../../../../etc/evil", sandbox.path().display());
    let mut traversal = publish_request(&id, &staging, Path::new("/x"), false);
    traversal.target_path = escape;
    assert_eq!(
        code(n.node_publish_volume(traversal).await),
        Code::InvalidArgument
    );
    let relative = stage_request(&id, Path::new("relative/staging"));
    assert_eq!(
        code(n.node_stage_volume(relative).await),
        Code::InvalidArgument
    );
    for inside in [
        state.join("volumes").join(&id).join("x"),
        sandbox.path().to_owned(),
    ] {
        let over = stage_request(&id, &inside);
        assert_eq!(
            code(n.node_stage_volume(over).await),
            Code::InvalidArgument,
            "{inside:?}"
        );
    }
    for bad_id in ["../escape", "a/b", ".."] {
        let request = stage_request(bad_id, &staging);
        assert_eq!(
            code(n.node_stage_volume(request).await),
            Code::InvalidArgument
        );
        let inline = NodePublishVolumeRequest {
            volume_context: HashMap::from([("csi.storage.k8s.io/ephemeral".into(), "true".into())]),
            staging_target_path: String::new(),
            ..publish_request(bad_id, &staging, &sandbox.path().join("t"), false)
        };
        assert_eq!(
            code(n.node_publish_volume(inline).await),
            Code::InvalidArgument
        );
    }
    assert!(!sandbox.path().join("escape").exists() && !state.join("escape").exists());
    let link = sandbox.path().join("link");
    std::os::unix::fs::symlink("/etc", &link).unwrap();
    let through_link = stage_request(&id, &link);
    assert_eq!(
        code(n.node_stage_volume(through_link).await),
        Code::FailedPrecondition
    );
    assert!(sandbox.mounts().is_empty());
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
    assert_eq!(caps.capabilities.len(), 5);
    let snapshot = CreateSnapshotRequest::default();
    assert_eq!(
        code(csi.controller.create_snapshot(snapshot).await),
        Code::Unimplemented
    );
    server.stop().await;
}

#[test]
fn bad_driver_names_node_ids_and_capacities_exit_2_naming_the_value() {
    let dir = tempfile::tempdir().unwrap();
    for (flag, shown) in [
        ("--driver-name=../evil", "\"../evil\""),
        ("--node-id=", "node ID"),
        ("--capacity=10 parsecs", "\"10 parsecs\""),
        ("--max-volumes-per-node=-1", "negative"),
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
