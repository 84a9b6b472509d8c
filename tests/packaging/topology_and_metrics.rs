//! Two promises of the manifests that span several objects: restored and cloned volumes are
//! created only on their source's node (the provisioner, the StorageClass, node-server's
//! topology key and the restore example agree), and every `/metrics` endpoint is served and
//! reachable for a scraper (a declared port, a Service port, node-server's annotation).

use std::path::Path;

use serde_json::Value;

use super::manifests::{
    EVERY_COMPONENT, container, documents_in, kind, our_daemonset, pod_spec, rendered, strings,
};

#[ignore = "needs kubectl and PyYAML (.ci/run installs them)"]
#[test]
fn a_restored_or_cloned_volume_is_created_only_on_the_node_its_source_is_on() {
    let out = rendered(&[EVERY_COMPONENT]);
    let docs = documents_in(out.path());
    let daemonset = our_daemonset(&docs);
    // CreateVolume is asked for the scheduler's node alone (strict topology, delayed binding),
    // by that node's provisioner, against that node's node-server: it finds the source there
    // or fails, never creates an empty volume elsewhere.
    let args = strings(&container(daemonset, "csi-provisioner")["args"]);
    for flag in [
        "--node-deployment=true",
        "--feature-gates=Topology=true",
        "--strict-topology=true",
        "--immediate-topology=false",
    ] {
        assert!(
            args.contains(&flag.to_owned()),
            "provisioner lacks {flag}: {args:?}"
        );
    }
    let classes: Vec<&Value> = (docs.iter())
        .filter(|(_, d)| kind(d) == "StorageClass")
        .map(|(_, d)| d)
        .collect();
    let layouts: Vec<(&str, &str)> = (classes.iter())
        .map(|c| {
            let name = c["metadata"]["name"].as_str().unwrap_or_default();
            (name, c["parameters"]["layout"].as_str().unwrap_or_default())
        })
        .collect();
    // The default class holds sizes on any node: a filesystem of its own per volume.
    assert_eq!(
        layouts,
        [
            ("csi-nodekit", "image"),
            ("csi-nodekit-shared", "directory")
        ]
    );
    for class in classes {
        assert_eq!(class["volumeBindingMode"], "WaitForFirstConsumer");
    }
    // node-server's topology key, from its source: the example must pin by that key.
    let driver_rs = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/node_server/driver/mod.rs");
    let source = std::fs::read_to_string(driver_rs).unwrap();
    assert!(
        source.contains(r#"format!("topology.{}/node", self.config.driver_name)"#),
        "node-server's topology key changed: update the example and docs/deploy.md"
    );
    let key = "topology.nodekit.csi.local/node";
    let restore = out.path().join("examples/snapshot-restore.yaml");
    let (_, pod) = docs
        .iter()
        .find(|(f, d)| *f == restore && kind(d) == "Pod")
        .expect("the restore example's pod");
    let terms = &pod_spec(pod).unwrap()["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    assert_eq!(terms[0]["matchExpressions"][0]["key"], key, "{terms}");
    let (_, pvc) = docs
        .iter()
        .find(|(f, d)| *f == restore && kind(d) == "PersistentVolumeClaim")
        .unwrap();
    assert_eq!(pvc["spec"]["dataSource"]["kind"], "VolumeSnapshot");
    assert_eq!(pvc["spec"]["storageClassName"], "csi-nodekit");
}

#[ignore = "needs kubectl and PyYAML (.ci/run installs them)"]
#[test]
fn every_metrics_endpoint_of_the_node_plugin_is_served_declared_and_in_the_metrics_service() {
    let out = rendered(&[EVERY_COMPONENT]);
    let docs = documents_in(out.path());
    let daemonset = our_daemonset(&docs);
    let (_, service) = docs
        .iter()
        .find(|(_, d)| kind(d) == "Service" && d["metadata"]["name"] == "csi-nodekit-metrics")
        .expect("the metrics Service (components/metrics)");
    assert_eq!(service["spec"]["clusterIP"], "None");
    let selector = service["spec"]["selector"].as_object().unwrap();
    let labels = &daemonset["spec"]["template"]["metadata"]["labels"];
    for (key, value) in selector {
        assert_eq!(
            &labels[key], value,
            "the Service selects the DaemonSet's pods"
        );
    }
    let service_ports: Vec<i64> = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["targetPort"].as_i64().unwrap())
        .collect();
    let declared: Vec<i64> = pod_spec(daemonset).unwrap()["containers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
        .map(|p| p["containerPort"].as_i64().unwrap())
        .collect();
    // Each container that serves /metrics: the port its --http-endpoint names.
    let mut served = Vec::new();
    for name in [
        "node-server",
        "liveness-probe",
        "csi-provisioner",
        "csi-snapshotter",
        "csi-snapshot-metadata",
    ] {
        let args = strings(&container(daemonset, name)["args"]);
        let endpoint = args
            .iter()
            .find_map(|a| a.strip_prefix("--http-endpoint=:"))
            .unwrap_or_else(|| panic!("{name} serves no /metrics: {args:?}"));
        let port: i64 = endpoint.parse().unwrap();
        assert!(declared.contains(&port), "{name}: port {port} not declared");
        assert!(
            service_ports.contains(&port),
            "{name}: port {port} not in the Service"
        );
        served.push(port);
    }
    served.sort();
    served.dedup();
    assert_eq!(served.len(), 5, "one port each: {served:?}");
    let annotations = &daemonset["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    let node_server = strings(&container(daemonset, "node-server")["args"]);
    assert!(node_server.contains(&format!(
        "--http-endpoint=:{}",
        annotations["prometheus.io/port"].as_str().unwrap()
    )));

    // The resizer's pod: its own Service and annotation, for csi-resizer's port.
    let resizer = docs
        .iter()
        .map(|(_, d)| d)
        .find(|d| kind(d) == "Deployment" && d["metadata"]["name"] == "csi-nodekit-resizer")
        .expect("the resizer's Deployment");
    let (_, service) = (docs.iter())
        .find(|(_, d)| {
            kind(d) == "Service" && d["metadata"]["name"] == "csi-nodekit-resizer-metrics"
        })
        .expect("the resizer's metrics Service (components/metrics)");
    assert_eq!(service["spec"]["clusterIP"], "None");
    let labels = &resizer["spec"]["template"]["metadata"]["labels"];
    for (key, value) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&labels[key], value, "the Service selects the resizer's pod");
    }
    let args = strings(&container(resizer, "csi-resizer")["args"]);
    let port = (args.iter())
        .find_map(|a| a.strip_prefix("--http-endpoint=:"))
        .expect("csi-resizer serves /metrics");
    let declared = container(resizer, "csi-resizer")["ports"][0]["containerPort"].as_i64();
    assert_eq!(declared.map(|p| p.to_string()).as_deref(), Some(port));
    assert_eq!(
        service["spec"]["ports"][0]["targetPort"]
            .as_i64()
            .map(|p| p.to_string())
            .as_deref(),
        Some(port)
    );
    let annotations = &resizer["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], port);
}
