//! The Kubernetes manifests in `packaging/kubernetes/`, as shipped and as
//! `scripts/render-manifests.sh` renders them for another image and kubelet root: valid against
//! the API schema, consistent with each other, and every flag they give our binary is one it
//! accepts.
//!
//! Needs `kubernetes-validate` (PyPI, which brings PyYAML); `.ci/run` installs both.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Kubernetes versions the manifests must validate against: the newest the validator knows and
/// the oldest we claim (CSIDriver, CSIStorageCapacity and inline volumes are GA long before).
const KUBERNETES_VERSIONS: &[&str] = &["1.37.0", "1.30.0"];

/// Where our image's name starts; its tag must be the crate version.
const IMAGE: &str = "localhost/csi-nodekit:";

/// The kubelet's root directory the shipped manifests are written for.
pub(super) const KUBELET_ROOT: &str = "/var/lib/kubelet";

pub(super) fn manifest_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/kubernetes")
}

/// The shipped image reference.
fn shipped_image() -> String {
    format!("{IMAGE}{}", env!("CARGO_PKG_VERSION"))
}

/// Every YAML file under `packaging/kubernetes/`, sorted.
fn manifests() -> Vec<PathBuf> {
    manifests_in(&manifest_dir())
}

/// Every YAML file under `dir`, sorted.
pub(super) fn manifests_in(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read manifest dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out.sort();
    assert!(out.len() >= 5, "expected the manifests in {dir:?}");
    out
}

/// All documents of all manifests, parsed with PyYAML (the validator's own parser).
fn documents() -> Vec<(PathBuf, Value)> {
    documents_in(&manifest_dir())
}

/// All documents of the manifests under `dir`.
pub(super) fn documents_in(dir: &Path) -> Vec<(PathBuf, Value)> {
    const DUMP: &str = "import json, sys, yaml\n\
        print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d is not None]))";
    let mut out = Vec::new();
    for file in manifests_in(dir) {
        let result = Command::new("python3")
            .args(["-c", DUMP])
            .arg(&file)
            .output();
        let output = result.expect("python3 is needed to read the manifests");
        assert!(
            output.status.success(),
            "cannot parse {file:?} (python3 with PyYAML, which kubernetes-validate installs): {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let docs: Vec<Value> = serde_json::from_slice(&output.stdout).expect("JSON from python3");
        out.extend(docs.into_iter().map(|d| (file.clone(), d)));
    }
    out
}

fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

/// The pod spec of a Pod or of a workload's template.
fn pod_spec(doc: &Value) -> Option<&Value> {
    match kind(doc) {
        "Pod" => Some(&doc["spec"]),
        "DaemonSet" | "Deployment" | "StatefulSet" => Some(&doc["spec"]["template"]["spec"]),
        _ => None,
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// `$(VAR)` references replaced from the container's literal `env` values, as the kubelet does.
fn expand(arg: &str, env: &BTreeMap<String, String>) -> String {
    env.iter()
        .fold(arg.to_owned(), |a, (k, v)| a.replace(&format!("$({k})"), v))
}

/// `kubernetes-validate --strict` of `files` against every version we claim.
pub(super) fn validate_strictly(files: &[PathBuf]) {
    for version in KUBERNETES_VERSIONS {
        let result = Command::new("kubernetes-validate")
            .args(["--strict", "--quiet", "--kubernetes-version", version])
            .args(files)
            .output();
        let output = match result {
            Ok(output) => output,
            Err(e) => panic!(
                "kubernetes-validate could not be run ({e}): install it with \
                 `pip install kubernetes-validate==1.37.0` (.ci/run does)"
            ),
        };
        assert!(
            output.status.success(),
            "kubernetes-validate --strict against Kubernetes {version} failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// Runs every command line the manifests give a container of `image` (exec probes included,
/// `$(VAR)` expanded) through the binary under test, with `--version` appended.
pub(super) fn check_command_lines(docs: &[(PathBuf, Value)], image: &str) {
    // The image's names, as links to the binary under test; the image's entry point is
    // /csi-nodekit.
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "csi-nodekit",
        "csi-node-driver-registrar",
        "node-driver-registrar",
        "livenessprobe",
        "csi-node-server",
    ] {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_csi-nodekit"), dir.path().join(name))
            .unwrap();
    }
    let mut checked = 0;
    for (file, doc) in docs {
        let Some(spec) = pod_spec(doc) else { continue };
        for container in spec["containers"].as_array().into_iter().flatten() {
            if !container["image"]
                .as_str()
                .is_some_and(|i| i.starts_with(image))
            {
                continue;
            }
            let env: BTreeMap<String, String> = container["env"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| Some((e["name"].as_str()?.into(), e["value"].as_str()?.into())))
                .collect();
            let mut command = strings(&container["command"]);
            if command.is_empty() {
                command.push("/csi-nodekit".into());
            }
            command.extend(strings(&container["args"]));
            let mut lines = vec![command];
            for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
                let exec = strings(&container[probe]["exec"]["command"]);
                if !exec.is_empty() {
                    lines.push(exec);
                }
            }
            for line in lines {
                let program = line[0].strip_prefix('/').unwrap_or_else(|| {
                    panic!("{file:?}: {:?} should be an absolute path", line[0])
                });
                let args: Vec<String> = line[1..].iter().map(|a| expand(a, &env)).collect();
                let output = Command::new(dir.path().join(program))
                    .args(&args)
                    .arg("--version")
                    .output()
                    .expect("run the binary");
                assert!(
                    output.status.success(),
                    "{file:?}: `{}` is not accepted: {}",
                    line.join(" "),
                    String::from_utf8_lossy(&output.stderr)
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 6,
        "only {checked} command lines of {image} found"
    );
}

/// The manifests under `dir` agree on the driver name, on the socket paths under the kubelet
/// root `root`, and run our containers from `image`; node-server mounts the kubelet's
/// directories at their host paths (the paths the kubelet hands it).
pub(super) fn check_agreement(docs: &[(PathBuf, Value)], dir: &Path, image: &str, root: &str) {
    let driver = docs
        .iter()
        .find(|(_, d)| kind(d) == "CSIDriver")
        .map(|(_, d)| d["metadata"]["name"].as_str().unwrap().to_owned())
        .expect("a CSIDriver");
    let socket_dir = format!("{root}/plugins/{driver}");
    let mut registrars = 0;
    for (file, doc) in docs {
        if kind(doc) == "StorageClass" {
            assert_eq!(doc["provisioner"], driver.as_str(), "{file:?}");
        }
        let Some(spec) = pod_spec(doc) else { continue };
        let volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
        for volume in &volumes {
            if let Some(inline) = volume["csi"].as_object() {
                assert_eq!(inline["driver"], driver.as_str(), "{file:?}");
            }
        }
        for container in spec["containers"].as_array().into_iter().flatten() {
            let used = container["image"].as_str().unwrap_or_default();
            if used.contains("csi-nodekit") {
                assert_eq!(used, image, "{file:?}: image of {}", container["name"]);
            }
        }
        if file.starts_with(dir.join("drop-in")) {
            continue; // another driver's DaemonSet
        }
        let host_path = |name: &Value| {
            volumes
                .iter()
                .find(|v| &v["name"] == name)
                .and_then(|v| v["hostPath"]["path"].as_str())
        };
        for container in spec["containers"].as_array().into_iter().flatten() {
            for arg in strings(&container["args"]) {
                if let Some(name) = arg.strip_prefix("--driver-name=") {
                    assert_eq!(name, driver, "{file:?}");
                }
                if let Some(path) = arg.strip_prefix("--kubelet-registration-path=") {
                    assert_eq!(path, format!("{socket_dir}/csi.sock"), "{file:?}");
                    let at = volumes
                        .iter()
                        .filter_map(|v| v["hostPath"]["path"].as_str())
                        .any(|p| p == socket_dir);
                    assert!(at, "{file:?}: no hostPath {socket_dir}");
                    registrars += 1;
                }
            }
            for mount in container["volumeMounts"].as_array().into_iter().flatten() {
                let Some(host) = host_path(&mount["name"]) else {
                    continue;
                };
                let path = mount["mountPath"].as_str().unwrap_or_default();
                if host.starts_with(root) && path.starts_with(root) {
                    assert_eq!(path, host, "{file:?}: a kubelet path mounted elsewhere");
                }
                assert!(
                    !path.starts_with(KUBELET_ROOT) || path.starts_with(root),
                    "{file:?}: {path} is under {KUBELET_ROOT}, not {root}"
                );
            }
        }
        for volume in &volumes {
            let Some(path) = volume["hostPath"]["path"].as_str() else {
                continue;
            };
            let kubelet = ["/var/lib/kubelet", "/plugins", "/pods"]
                .iter()
                .any(|p| path.contains(p));
            assert!(
                !kubelet || path.starts_with(root),
                "{file:?}: hostPath {path} is not under the kubelet root {root}"
            );
        }
    }
    assert!(
        registrars >= 1,
        "no registrar with --kubelet-registration-path"
    );
}

/// The doctor pod (`tools/`) mounts the host read-only where it tells the doctor to look,
/// names the kubelet root when the manifests were rendered for one (`Some`), and its role
/// only reads.
pub(super) fn check_doctor(docs: &[(PathBuf, Value)], dir: &Path, root: Option<&str>) {
    let in_tools = |file: &PathBuf| file.starts_with(dir.join("tools"));
    let (_, pod) = docs
        .iter()
        .find(|(file, d)| in_tools(file) && kind(d) == "Pod")
        .expect("the doctor pod in tools/");
    let spec = &pod["spec"];
    assert_eq!(
        spec["hostPID"], true,
        "the doctor finds the kubelet's --root-dir in /proc"
    );
    let container = &spec["containers"][0];
    let args = strings(&container["args"]);
    assert_eq!(args[..2], ["probe", "doctor"]);
    let given = args.iter().find_map(|a| a.strip_prefix("--kubelet-root="));
    assert_eq!(given, root, "{args:?}");
    let host_root = args
        .iter()
        .find_map(|a| a.strip_prefix("--host-root="))
        .expect("--host-root");
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == host_root)
        .expect("a mount at --host-root");
    assert_eq!(mount["readOnly"], true);
    let volume = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert_eq!(volume["hostPath"]["path"], "/");
    let (_, role) = docs
        .iter()
        .find(|(file, d)| in_tools(file) && kind(d) == "ClusterRole")
        .expect("the doctor's ClusterRole");
    for rule in role["rules"].as_array().unwrap() {
        for verb in strings(&rule["verbs"]) {
            assert!(["get", "list"].contains(&verb.as_str()), "{rule}");
        }
    }
}

#[ignore = "needs kubernetes-validate and PyYAML (.ci/run installs them)"]
#[test]
fn every_manifest_validates_strictly_against_the_kubernetes_api_schema() {
    validate_strictly(&manifests());
}

#[ignore = "needs kubernetes-validate and PyYAML (.ci/run installs them)"]
#[test]
fn every_command_line_the_manifests_give_our_image_is_accepted_by_the_binary() {
    check_command_lines(&documents(), IMAGE);
}

#[ignore = "needs kubernetes-validate and PyYAML (.ci/run installs them)"]
#[test]
fn the_manifests_agree_on_the_driver_name_the_socket_paths_and_the_image_version() {
    check_agreement(
        &documents(),
        &manifest_dir(),
        &shipped_image(),
        KUBELET_ROOT,
    );
}

#[ignore = "needs kubernetes-validate and PyYAML (.ci/run installs them)"]
#[test]
fn the_doctor_pod_reads_the_host_where_it_tells_the_doctor_to_look_and_has_only_read_rights() {
    check_doctor(&documents(), &manifest_dir(), None);
}

#[ignore = "needs kubernetes-validate and PyYAML (.ci/run installs them)"]
#[test]
fn the_driver_takes_no_selinux_mount_label_and_its_pod_shares_one_selinux_type() {
    let docs = documents();
    let (_, driver) = docs.iter().find(|(_, d)| kind(d) == "CSIDriver").unwrap();
    // Bind-mounted directories of one filesystem cannot take a per-volume context= label.
    assert_eq!(driver["spec"]["seLinuxMount"], false);
    let (file, daemonset) = docs
        .iter()
        .find(|(f, d)| kind(d) == "DaemonSet" && !f.starts_with(manifest_dir().join("drop-in")))
        .expect("our DaemonSet");
    let spec = pod_spec(daemonset).unwrap();
    // The privileged node-server runs as spc_t; the others reach its socket only as that too.
    assert_eq!(
        spec["securityContext"]["seLinuxOptions"]["type"], "spc_t",
        "{file:?}"
    );
    for container in spec["containers"].as_array().unwrap() {
        let own = &container["securityContext"]["seLinuxOptions"];
        assert!(
            own.is_null(),
            "{file:?}: {} sets its own",
            container["name"]
        );
    }
}

#[ignore = "needs kubernetes-validate and PyYAML (.ci/run installs them)"]
#[test]
fn our_daemonset_upgrades_with_a_surge_and_never_leaves_a_node_without_its_driver() {
    let docs = documents();
    let (file, daemonset) = docs
        .iter()
        .find(|(f, d)| kind(d) == "DaemonSet" && !f.starts_with(manifest_dir().join("drop-in")))
        .expect("our DaemonSet");
    let strategy = &daemonset["spec"]["updateStrategy"];
    assert_eq!(strategy["type"], "RollingUpdate", "{file:?}");
    assert_eq!(strategy["rollingUpdate"]["maxSurge"], 1, "{file:?}");
    assert_eq!(strategy["rollingUpdate"]["maxUnavailable"], 0, "{file:?}");
    // The surge waits for the new pod to be Ready: the registrar's readiness must be the
    // endpoint that answers 200 while it stands by behind the old pod's registrar.
    let spec = pod_spec(daemonset).expect("a pod template");
    let registrar = spec["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| strings(&c["args"]).first().map(String::as_str) == Some("registrar"))
        .expect("the registrar container");
    assert_eq!(
        registrar["readinessProbe"]["httpGet"]["path"], "/readyz",
        "{file:?}"
    );
}
