//! `examples/volume-attributes-class.yaml`: the IO-limits class names exactly the four limits
//! node-server takes, each value one node-server's parser takes, for this driver, and its PVC asks for a
//! volume that has a device of its own for `io.max` to name. (That the file validates against
//! the API is in `manifests.rs`.)

use std::collections::HashMap;
use std::path::PathBuf;

use csi_nodekit::node_server::state::attributes::Attributes;
use serde_json::Value;

use super::manifests::{
    EVERY_COMPONENT, container, documents_in, kind, manifest_dir, our_daemonset, pod_spec,
    rendered, strings,
};

const BYTE_RATES: &[&str] = &["readBytesPerSecond", "writeBytesPerSecond"];
const OPERATION_RATES: &[&str] = &["readIOPS", "writeIOPS"];

#[ignore = "needs PyYAML (.ci/run installs it)"]
#[test]
fn the_io_limits_class_sets_the_four_limits_in_their_forms_for_a_volume_with_a_device_of_its_own() {
    let example = manifest_dir().join("examples/volume-attributes-class.yaml");
    let docs: Vec<(PathBuf, Value)> = documents_in(&manifest_dir().join("examples"))
        .into_iter()
        .filter(|(file, _)| *file == example)
        .collect();
    let limits: Vec<&str> = BYTE_RATES.iter().chain(OPERATION_RATES).copied().collect();
    let class = docs
        .iter()
        .map(|(_, d)| d)
        .find(|d| {
            kind(d) == "VolumeAttributesClass"
                && d["parameters"]
                    .as_object()
                    .is_some_and(|p| p.keys().any(|k| limits.contains(&k.as_str())))
        })
        .expect("a VolumeAttributesClass with IO limits");
    assert_eq!(class["driverName"], "nodekit.csi.local");
    let parameters = class["parameters"].as_object().unwrap();
    let mut keys: Vec<&str> = parameters.keys().map(String::as_str).collect();
    keys.sort();
    let mut expected = limits.clone();
    expected.sort();
    assert_eq!(keys, expected, "the four limits, nothing else");
    // node-server's own parser takes every value, as a limit.
    let given: HashMap<String, String> = parameters
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.as_str().expect("parameters are strings").to_owned(),
            )
        })
        .collect();
    let attributes = Attributes::from_mutable(&given).expect("node-server takes the class");
    assert!(
        attributes.io_limit_key().is_some(),
        "{given:?} sets no limit"
    );

    // Its PVC: a volume of the image layout (or a raw block one), which has a device.
    let name = class["metadata"]["name"].as_str().unwrap();
    let pvc = docs
        .iter()
        .map(|(_, d)| d)
        .find(|d| {
            kind(d) == "PersistentVolumeClaim" && d["spec"]["volumeAttributesClassName"] == name
        })
        .expect("a PVC of the class");
    let block = pvc["spec"]["volumeMode"] == "Block";
    let base = documents_in(&manifest_dir().join("base"));
    let storage_class = base
        .iter()
        .map(|(_, d)| d)
        .find(|d| {
            kind(d) == "StorageClass" && d["metadata"]["name"] == pvc["spec"]["storageClassName"]
        })
        .expect("the PVC's StorageClass is shipped");
    assert!(
        block || storage_class["parameters"]["layout"] == "image",
        "{pvc}: a directory volume has no device of its own"
    );
}

#[ignore = "needs kubectl and PyYAML (.ci/run installs them)"]
#[test]
fn node_server_sees_the_nodes_cgroup_hierarchy_where_its_cgroup_root_says() {
    let out = rendered(&[EVERY_COMPONENT]);
    let docs = documents_in(out.path());
    let daemonset = our_daemonset(&docs);
    let node_server = container(daemonset, "node-server");
    let args = strings(&node_server["args"]);
    let root = args
        .iter()
        .find_map(|a| a.strip_prefix("--cgroup-root="))
        .expect("node-server is given --cgroup-root");
    let mount = node_server["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == root)
        .unwrap_or_else(|| panic!("nothing mounted at {root}"));
    let volumes = pod_spec(daemonset).unwrap()["volumes"].as_array().unwrap();
    let volume = volumes
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mount's volume");
    assert_eq!(volume["hostPath"]["path"], "/sys/fs/cgroup", "{volume}");
    assert_ne!(mount["readOnly"], true, "io.max is written");
}
