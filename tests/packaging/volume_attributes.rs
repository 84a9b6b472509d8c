//! `examples/volume-attributes-class.yaml`: the IO-limits class names exactly the four limits
//! node-server takes, each value in the form it takes, for this driver, and its PVC asks for a
//! volume that has a device of its own for `io.max` to name. (That the file validates against
//! the API is in `manifests.rs`.)

use std::path::PathBuf;

use serde_json::Value;

use super::manifests::{documents_in, kind, manifest_dir};

const BYTE_RATES: &[&str] = &["readBytesPerSecond", "writeBytesPerSecond"];
const OPERATION_RATES: &[&str] = &["readIOPS", "writeIOPS"];

/// A plain count: digits only.
fn is_integer(value: &str) -> bool {
    !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit())
}

/// A Kubernetes quantity of bytes without a fraction or exponent: digits, then one of the
/// binary or decimal suffixes or none.
fn is_byte_quantity(value: &str) -> bool {
    let suffixes = [
        "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E", "",
    ];
    suffixes
        .iter()
        .any(|s| value.strip_suffix(s).is_some_and(is_integer))
}

#[test]
fn the_forms_a_limit_takes_are_told_apart_as_the_example_needs() {
    for good in ["0", "1048576", "20Mi", "1Gi", "500k"] {
        assert!(is_byte_quantity(good), "{good}");
    }
    for bad in ["", "Mi", "20MiB", "1.5Gi", "-1", "20 Mi", "1e6"] {
        assert!(!is_byte_quantity(bad), "{bad}");
    }
    assert!(is_integer("2000") && !is_integer("2k") && !is_integer(""));
}

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
    for (key, value) in parameters {
        let value = value.as_str().expect("parameters are strings");
        if BYTE_RATES.contains(&key.as_str()) {
            assert!(is_byte_quantity(value), "{key}: {value}");
        } else {
            assert!(is_integer(value), "{key}: {value}");
        }
    }

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
