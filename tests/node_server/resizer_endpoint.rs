//! `node-server --resizer-only`, the real binary: the endpoint a cluster-wide external-resizer
//! talks to. The calls below are the ones csi-resizer v2.3.0 makes at start-up and the choice
//! it makes from their answers (`pkg/resizer/csi_resizer.go`: a Controller service without
//! EXPAND_VOLUME and a Node service with it → its node-only "trivial resizer"), so it never
//! calls ControllerExpandVolume on a node that does not hold the volume; a later
//! VolumeAttributesClass change is refused with the code its modify controller marks
//! Infeasible; nothing else is served, and no state directory is touched.

use std::time::Duration;

use crate::common::csi_node::connect;
use crate::common::{binary, is_socket, send_signal, spawn, wait_exit, wait_until};
use csi_nodekit::proto::csi::*;
use tonic::Code;

#[tokio::test]
async fn a_cluster_wide_resizer_finds_node_only_expansion_and_a_clear_refusal_to_modify() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("resizer.sock");
    let state = dir.path().join("never-made");
    let mut endpoint = spawn(
        std::process::Command::new(binary())
            .arg("node-server")
            .arg("--resizer-only")
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .arg("--driver-name=nodekit.csi.local")
            .arg(format!("--state-dir={}", state.display())),
        "node-server --resizer-only",
    );
    assert!(
        wait_until(Duration::from_secs(10), || is_socket(&socket)).await,
        "no socket: {}",
        endpoint.stderr()
    );
    let mut csi = connect(&socket).await;

    // What csi-resizer asks at start-up, in its order.
    let info = csi.identity.get_plugin_info(GetPluginInfoRequest {});
    assert_eq!(
        info.await.expect("GetPluginInfo").into_inner().name,
        "nodekit.csi.local"
    );
    let plugin = csi
        .identity
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .expect("GetPluginCapabilities")
        .into_inner();
    let services: Vec<i32> = (plugin.capabilities.iter())
        .filter_map(|c| match &c.r#type {
            Some(plugin_capability::Type::Service(s)) => Some(s.r#type),
            _ => None,
        })
        .collect();
    let controller_service = plugin_capability::service::Type::ControllerService as i32;
    assert!(
        services.contains(&controller_service),
        "without a Controller service csi-resizer refuses to start: {plugin:?}"
    );
    let controller = csi
        .controller
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .expect("ControllerGetCapabilities")
        .into_inner();
    let expand = controller_service_capability::rpc::Type::ExpandVolume as i32;
    let controller_expands = controller.capabilities.iter().any(|c| {
        matches!(&c.r#type, Some(controller_service_capability::Type::Rpc(r)) if r.r#type == expand)
    });
    let node = csi
        .node
        .node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .expect("NodeGetCapabilities")
        .into_inner();
    let node_expand = node_service_capability::rpc::Type::ExpandVolume as i32;
    let node_expands = node.capabilities.iter().any(|c| {
        matches!(&c.r#type, Some(node_service_capability::Type::Rpc(r)) if r.r#type == node_expand)
    });
    assert!(
        !controller_expands && node_expands,
        "csi-resizer takes its trivial resizer only for node-only expansion: {controller:?} {node:?}"
    );
    let probe = csi.identity.probe(ProbeRequest {}).await.expect("Probe");
    assert_eq!(probe.into_inner().ready, Some(true));

    // A class changed on a bound PVC: INVALID_ARGUMENT, which csi-resizer's modify controller
    // marks Infeasible (and stops retrying), its message in the PVC's event.
    let modify = ControllerModifyVolumeRequest {
        volume_id: "pvc-0b1e".into(),
        mutable_parameters: [("inodeLimit".into(), "1000".into())].into(),
        ..Default::default()
    };
    let refused = csi.controller.controller_modify_volume(modify).await;
    let refused = refused.expect_err("no modification from here");
    assert_eq!(refused.code(), Code::InvalidArgument);
    for words in ["pvc-0b1e", "VolumeAttributesClass", "same node"] {
        assert!(refused.message().contains(words), "{words}: {refused:?}");
    }
    // Nothing else is served: a volume call here would act on the wrong node.
    let expand = ControllerExpandVolumeRequest {
        volume_id: "pvc-0b1e".into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 1 << 30,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    let reply = csi.controller.controller_expand_volume(expand).await;
    assert_eq!(reply.expect_err("expand").code(), Code::Unimplemented);
    let create = CreateVolumeRequest {
        name: "pvc-x".into(),
        ..Default::default()
    };
    let reply = csi.controller.create_volume(create).await;
    assert_eq!(reply.expect_err("create").code(), Code::Unimplemented);
    let reply = csi.node.node_get_info(NodeGetInfoRequest {}).await;
    assert_eq!(reply.expect_err("node info").code(), Code::Unimplemented);
    assert!(!state.exists(), "no state directory made");

    send_signal(&endpoint.0, nix::sys::signal::Signal::SIGTERM);
    let status = wait_exit(&mut endpoint.0, Duration::from_secs(10));
    assert!(status.success(), "{status}: {}", endpoint.stderr());
    assert!(!socket.exists(), "the socket goes with it");
}

#[test]
fn an_http_endpoint_asked_of_the_resizer_endpoint_is_refused_with_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(binary())
        .arg("node-server")
        .arg("--resizer-only")
        .arg(format!(
            "--endpoint=unix://{}",
            dir.path().join("r.sock").display()
        ))
        .arg("--http-endpoint=:9999")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--http-endpoint"), "{stderr}");
    assert!(!dir.path().join("r.sock").exists(), "nothing served");
}
