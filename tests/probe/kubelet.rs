//! The kubelet emulator in process, against real registration and CSI sockets: what it
//! registers, what it writes, and what it tells the plugins it refuses.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::eventually;
use common::fake_plugin::{
    Bind, NodeAnswer, csi_plugin, node, registration, registration_with_node,
};
use common::kubelet::{Kubelet, WAIT, dirs, failed, registered};
use csi_nodekit::probe::kubelet::{Event, Failure, Registration, Retry};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_registers_and_the_csinode_is_exactly_what_the_kubelet_writes() {
    let d = dirs();
    let driver_socket = d.root.join("plugins/x.csi/csi.sock");
    let _driver = node(
        &driver_socket,
        NodeAnswer::new(
            "n-17",
            10,
            &[("topology.x/zone", "a"), ("topology.x/rack", "r1")],
        ),
    );
    let endpoint = driver_socket.display().to_string();
    let reg_socket = d.registry.join("x.csi-reg.sock");
    let (_reg, registrar) = registration(&reg_socket, Bind::AtPath, csi_plugin("x.csi", &endpoint));
    let mut kubelet = Kubelet::start(&d.registry, None);

    let (socket, registration, node) = registered(kubelet.next().await);
    assert_eq!(socket, reg_socket);
    assert_eq!(
        registration,
        Registration {
            driver: "x.csi".into(),
            endpoint,
            node_id: "n-17".into()
        }
    );
    assert_eq!(
        node.csi_node.to_string(),
        r#"{"apiVersion":"storage.k8s.io/v1","kind":"CSINode","metadata":{"name":"node-a"},"spec":{"drivers":[{"allocatable":{"count":10},"name":"x.csi","nodeID":"n-17","topologyKeys":["topology.x/rack","topology.x/zone"]}]}}"#
    );
    assert_eq!(node.annotation.as_deref(), Some(r#"{"x.csi":"n-17"}"#));
    let labels: Vec<(&str, &str)> = node
        .labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        labels,
        [("topology.x/rack", "r1"), ("topology.x/zone", "a")]
    );
    let statuses = registrar.statuses(1, WAIT).await;
    assert!(statuses[0].plugin_registered && statuses[0].error.is_empty());
}

/// One plugin alone in a registry, refused: its first NotifyRegistrationStatus.
async fn refusal_of(
    info: csi_nodekit::proto::registration::PluginInfo,
) -> (String, Failure, Retry) {
    let d = dirs();
    let reg_socket = d.registry.join("d-reg.sock");
    let (_reg, registrar) = registration(&reg_socket, Bind::AtPath, info);
    let mut kubelet = Kubelet::start(&d.registry, None);
    let (_, failure, retry) = failed(kubelet.next().await);
    let status = registrar.statuses(1, WAIT).await.remove(0);
    assert!(!status.plugin_registered);
    assert_eq!(
        status.error, failure.reason,
        "the reason reported is the one sent"
    );
    (status.error, failure, retry)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_validation_failure_reaches_the_plugin_with_the_kubelets_text() {
    let prefix = "RegisterPlugin error -- plugin validation failed with err: validation failed \
                  for CSI Driver d.csi at endpoint /p/csi.sock: kubernetes.io/csi: ValidatePlugin \
                  for CSI driver \"d.csi\" failed.";
    let table: &[(&[&str], String)] = &[
        (
            &[],
            format!("{prefix} Plugin returned an empty list for supported versions"),
        ),
        (
            &["1"],
            format!(
                "{prefix} None of the versions specified [\"1\"] are supported. err=could not \
                 find a highest supported version from versions ([1]) reported: illegal version \
                 string \"1\""
            ),
        ),
        (
            &["0.3.0"],
            format!(
                "{prefix} None of the versions specified [\"0.3.0\"] are supported. \
                 err=highest supported version reported is 0.3.0, must be v1.x"
            ),
        ),
        (
            &["2.0.0", "v3.1"],
            format!(
                "{prefix} None of the versions specified [\"2.0.0\" \"v3.1\"] are supported. \
                 err=could not find a highest supported version from versions ([2.0.0 v3.1]) \
                 reported: <nil>"
            ),
        ),
    ];
    for (versions, expected) in table {
        let mut info = csi_plugin("d.csi", "/p/csi.sock");
        info.supported_versions = versions.iter().map(|v| v.to_string()).collect();
        let (sent, failure, retry) = refusal_of(info).await;
        assert_eq!(&sent, expected, "{versions:?}");
        assert_eq!(failure.driver.as_deref(), Some("d.csi"));
        assert_eq!(
            retry,
            Retry::After(Duration::from_millis(500)),
            "{versions:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_type_other_than_csi_is_refused_as_unhandled() {
    let mut info = csi_plugin("gpu", "/p/gpu.sock");
    info.r#type = "DevicePlugin".into();
    let (sent, _, retry) = refusal_of(info).await;
    assert!(
        sent.starts_with("RegisterPlugin error -- no handler registered for plugin type: DevicePlugin at socket /")
            && sent.ends_with("/registry/d-reg.sock"),
        "{sent}"
    );
    assert_eq!(retry, Retry::After(Duration::from_millis(500)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_name_registered_at_an_equal_version_is_refused_and_a_higher_one_replaces_it() {
    let d = dirs();
    let driver_socket = d.root.join("csi.sock");
    let _driver = node(&driver_socket, NodeAnswer::new("n1", 0, &[]));
    let endpoint = driver_socket.display().to_string();
    let info = csi_plugin("dup.csi", &endpoint);
    let (_a, _) = registration(&d.registry.join("a-reg.sock"), Bind::AtPath, info.clone());
    let mut kubelet = Kubelet::start(&d.registry, None);
    registered(kubelet.next().await);

    let (_b, b) = registration(&d.registry.join("b-reg.sock"), Bind::AtPath, info.clone());
    let (_, failure, _) = failed(kubelet.next().await);
    let expected = format!(
        "RegisterPlugin error -- plugin validation failed with err: validation failed for CSI \
         Driver dup.csi at endpoint {endpoint}: kubernetes.io/csi: ValidatePlugin for CSI driver \
         \"dup.csi\" failed. Another driver with the same name is already registered with a \
         higher supported version: \"1.0.0\""
    );
    assert_eq!(failure.reason, expected);
    assert_eq!(b.statuses(1, WAIT).await[0].error, expected);

    let mut higher = info;
    higher.supported_versions = vec!["1.1.0".into()];
    let (_c, _) = registration(&d.registry.join("c-reg.sock"), Bind::AtPath, higher);
    let event = loop {
        // b keeps being refused (with back-off) while c registers.
        match kubelet.next().await {
            Event::Failed { socket, .. } if socket.ends_with("b-reg.sock") => continue,
            event => break event,
        }
    };
    let (socket, _, node) = registered(event);
    assert!(socket.ends_with("c-reg.sock"));
    assert_eq!(
        node.csi_node["spec"]["drivers"].as_array().unwrap().len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_node_id_fails_once_and_is_retried_only_when_the_socket_is_recreated() {
    let d = dirs();
    let driver_socket = d.root.join("csi.sock");
    let answer = NodeAnswer::new("", 0, &[]);
    let _driver = node(&driver_socket, answer.clone());
    let info = csi_plugin("e.csi", &driver_socket.display().to_string());
    let reg_socket = d.registry.join("e-reg.sock");
    let (reg, registrar) = registration(&reg_socket, Bind::AtPath, info.clone());
    let mut kubelet = Kubelet::start(&d.registry, None);

    let (_, failure, retry) = failed(kubelet.next().await);
    let expected = "RegisterPlugin error -- plugin registration failed with err: error adding \
                    CSI driver node info: driverNodeID must not be empty";
    assert_eq!(failure.reason, expected);
    assert_eq!(retry, Retry::Never);
    assert_eq!(registrar.statuses(1, WAIT).await[0].error, expected);
    kubelet.assert_quiet_for(Duration::from_millis(2_500)).await;
    assert_eq!(
        registrar.get_info_count(),
        1,
        "the kubelet does not retry on its own"
    );

    answer.response.lock().unwrap().node_id = "n1".into();
    reg.stop().await;
    std::fs::remove_file(&reg_socket).unwrap();
    let (_reg, _) = registration(&reg_socket, Bind::AtPath, info);
    assert!(
        matches!(kubelet.next().await, Event::Deregistered { driver, .. } if driver == "e.csi")
    );
    let (_, registration, _) = registered(kubelet.next().await);
    assert_eq!(registration.node_id, "n1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_get_info_error_reaches_the_plugin_as_grpc_go_prints_it() {
    let d = dirs();
    let driver_socket = d.root.join("csi.sock");
    let answer = NodeAnswer::new("n1", 0, &[]);
    *answer.error.lock().unwrap() = Some(tonic::Status::internal("disk on fire"));
    let _driver = node(&driver_socket, answer);
    let info = csi_plugin("f.csi", &driver_socket.display().to_string());
    let (_reg, registrar) = registration(&d.registry.join("f-reg.sock"), Bind::AtPath, info);
    let mut kubelet = Kubelet::start(&d.registry, None);
    let (_, failure, retry) = failed(kubelet.next().await);
    assert_eq!(
        failure.reason,
        "RegisterPlugin error -- plugin registration failed with err: rpc error: code = \
         Internal desc = disk on fire"
    );
    assert_eq!(retry, Retry::Never);
    assert!(!registrar.statuses(1, WAIT).await[0].plugin_registered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_host_path_is_dialled_under_the_host_root() {
    let d = dirs();
    let unique = format!(
        "/var/lib/kubelet/plugins/csi-nodekit-test-{}",
        std::process::id()
    );
    let host_path = format!("{unique}/csi.sock");
    let host_root = d.root.join("host");
    let _driver = node(
        &host_root.join(host_path.trim_start_matches('/')),
        NodeAnswer::new("n1", 0, &[]),
    );
    let info = csi_plugin("h.csi", &host_path);
    let (_reg, _) = registration(&d.registry.join("h-reg.sock"), Bind::AtPath, info.clone());
    let mut kubelet = Kubelet::start(&d.registry, Some(&host_root));
    let (_, registered_as, _) = registered(kubelet.next().await);
    assert_eq!(
        registered_as.endpoint, host_path,
        "reported as the host path"
    );

    // Without the mapping the host path does not exist here.
    let other = dirs();
    let (_reg, _) = registration(&other.registry.join("h-reg.sock"), Bind::AtPath, info);
    let mut kubelet = Kubelet::start(&other.registry, None);
    let (_, failure, _) = failed(kubelet.next().await);
    assert_eq!(
        failure.reason,
        format!(
            "RegisterPlugin error -- plugin registration failed with err: rpc error: code = \
             Unavailable desc = connection error: desc = \"transport: Error while dialing: dial \
             unix {host_path}: connect: no such file or directory\""
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_endpoint_means_the_registration_socket_itself() {
    let d = dirs();
    let reg_socket = d.registry.join("self-reg.sock");
    let info = csi_plugin("self.csi", "");
    let (_reg, _) = registration_with_node(
        &reg_socket,
        Bind::AtPath,
        info,
        Some(NodeAnswer::new("n1", 3, &[])),
    );
    let mut kubelet = Kubelet::start(&d.registry, Some(Path::new("/does-not-apply")));
    let (_, registration, node) = registered(kubelet.next().await);
    assert_eq!(registration.endpoint, reg_socket.display().to_string());
    assert_eq!(
        node.csi_node["spec"]["drivers"][0]["allocatable"],
        json!({"count": 3})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_info_that_hangs_past_one_second_fails_with_deadline_exceeded() {
    let d = dirs();
    let reg_socket = d.registry.join("slow-reg.sock");
    let (_reg, registrar) = registration(
        &reg_socket,
        Bind::AtPath,
        csi_plugin("slow.csi", "/p/csi.sock"),
    );
    *registrar.get_info_delay.lock().unwrap() = Duration::from_secs(3);
    let mut kubelet = Kubelet::start(&d.registry, None);
    let (_, failure, retry) = failed(kubelet.next().await);
    assert_eq!(
        failure.reason,
        format!(
            "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {}, \
             err: rpc error: code = DeadlineExceeded desc = context deadline exceeded",
            reg_socket.display()
        )
    );
    assert_eq!(failure.driver, None);
    assert_eq!(retry, Retry::After(Duration::from_millis(500)));
    let told = eventually(Duration::from_millis(300), || {
        (!registrar.statuses.lock().unwrap().is_empty()).then_some(())
    })
    .await;
    assert!(told.is_none(), "nothing is notified when GetInfo fails");
}
