//! The Kubernetes manifests in `packaging/kubernetes/` as `scripts/render-manifests.sh` renders
//! them with `kubectl kustomize` (the base, every component, the examples, the drop-in and the
//! doctor pod): valid against the API schema, consistent with each other, every flag they give
//! our binary one it accepts, and our image pulled only as often as its tag demands.
//!
//! Needs `kubernetes-validate` (PyPI, which brings PyYAML and jsonschema) and `kubectl`;
//! `.ci/run` installs them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// Kubernetes versions the manifests must validate against: the newest the validator knows and
/// the oldest we claim (CSIDriver, CSIStorageCapacity and inline volumes are GA long before).
const KUBERNETES_VERSIONS: &[&str] = &["1.37.0", "1.30.0"];

/// A manifest whose objects need a newer Kubernetes than the oldest we claim says so in a line
/// of this form, and is validated only against the versions from that one on.
const NEEDS: &str = "# Needs Kubernetes ";

/// Where our image's name starts; its tag must be the crate version.
pub(super) const IMAGE: &str = "localhost/csi-nodekit:";

/// The kubelet's root directory the shipped manifests are written for.
pub(super) const KUBELET_ROOT: &str = "/var/lib/kubelet";

/// Every component that adds to the driver, as `--with` takes them (`selinux` is a choice that
/// takes away, tested on its own). [`rendered`] adds the CA that `snapshot-metadata` needs.
pub(super) const EVERY_COMPONENT: &str = "--with=snapshots,metrics,snapshot-metadata";

/// What `overlays/complete` holds: the components a cluster can take without preparing anything
/// but external-snapshotter (snapshot-metadata needs a Secret and a CA first).
pub(super) const COMPLETE: &str = "--with=snapshots,metrics";

/// A CA certificate (public part only; its key was thrown away) for
/// `--snapshot-metadata-ca`.
pub(super) fn test_ca() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/snapshot-metadata-ca.pem")
}

pub(super) fn manifest_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/kubernetes")
}

/// The shipped image reference.
pub(super) fn shipped_image() -> String {
    format!("{IMAGE}{}", env!("CARGO_PKG_VERSION"))
}

/// Runs `scripts/render-manifests.sh` with `args`.
pub(super) fn render(args: &[&str]) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/render-manifests.sh");
    Command::new("bash")
        .arg(script)
        .args(args)
        .output()
        .expect("run bash")
}

/// Renders with `args` into a fresh directory and returns it. With the snapshot-metadata
/// component and no `--snapshot-metadata-ca`, the CA of [`test_ca`] is given.
pub(super) fn rendered(args: &[&str]) -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let metadata = args.iter().any(|a| {
        a.strip_prefix("--with=")
            .is_some_and(|list| list.split(',').any(|c| c == "snapshot-metadata"))
    });
    if metadata && !args.iter().any(|a| a.starts_with("--snapshot-metadata-ca")) {
        all.push(format!("--snapshot-metadata-ca={}", test_ca().display()));
    }
    all.push(format!("--out={}", out.path().display()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let output = render(&all);
    assert!(
        output.status.success(),
        "render-manifests.sh {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

/// `kubectl kustomize` of a kustomization under `packaging/kubernetes/`.
pub(super) fn kustomize(dir: &str) -> String {
    let output = Command::new("kubectl")
        .arg("kustomize")
        .arg(manifest_dir().join(dir))
        .output()
        .expect("kubectl is needed (its built-in kustomize renders the manifests)");
    assert!(
        output.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
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
    assert!(!out.is_empty(), "expected manifests in {dir:?}");
    out
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

pub(super) fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

/// The pod spec of a Pod or of a workload's template.
pub(super) fn pod_spec(doc: &Value) -> Option<&Value> {
    match kind(doc) {
        "Pod" => Some(&doc["spec"]),
        "DaemonSet" | "Deployment" | "StatefulSet" => Some(&doc["spec"]["template"]["spec"]),
        _ => None,
    }
}

pub(super) fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// A container's `env` entries with literal values.
pub(super) fn literal_env(container: &Value) -> BTreeMap<String, String> {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| Some((e["name"].as_str()?.into(), e["value"].as_str()?.into())))
        .collect()
}

/// `$(VAR)` references replaced from the container's literal `env` values, as the kubelet does.
pub(super) fn expand(arg: &str, env: &BTreeMap<String, String>) -> String {
    env.iter()
        .fold(arg.to_owned(), |a, (k, v)| a.replace(&format!("$({k})"), v))
}

/// Strict validation of every document of `files`: the API's own kinds with
/// `kubernetes-validate --strict` against every version we claim (a file that says it needs a
/// newer one only from that one on), external-snapshotter's and external-snapshot-metadata's
/// kinds against the CRD schemas in `tests/fixtures/snapshot-crd-schemas.json` (unknown fields
/// refused), which kubernetes-validate does not hold.
pub(super) fn validate_strictly(files: &[PathBuf]) {
    const SPLIT: &str = r##"
import json, sys, yaml, jsonschema
schemas = json.load(open(sys.argv[1]))["schemas"]
def strict(schema):
    if isinstance(schema, dict):
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
        for value in schema.values():
            strict(value)
    elif isinstance(schema, list):
        for value in schema:
            strict(value)
    return schema
custom = {(s["apiVersion"], s["kind"]): strict(s["schema"]) for s in schemas}
groups = ("snapshot.storage.k8s.io/", "groupsnapshot.storage.k8s.io/", "cbt.storage.k8s.io/")
out_dir, checked = sys.argv[2], 0
for n, path in enumerate(sys.argv[3:]):
    kept = []
    for doc in yaml.safe_load_all(open(path)):
        if doc is None:
            continue
        if doc["apiVersion"].startswith(groups):
            key = (doc["apiVersion"], doc["kind"])
            if key not in custom:
                sys.exit(f"{path}: no CRD schema for {key}")
            jsonschema.validate(doc, custom[key])
            checked += 1
        else:
            kept.append(doc)
    head = [l for l in open(path) if l.startswith("# Needs Kubernetes ")]
    name = f"{out_dir}/{n:03}.yaml"
    with open(name, "w") as f:
        f.write("".join(head[:1]))
        yaml.safe_dump_all(kept, f)
print(checked)
"##;
    let schemas =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/snapshot-crd-schemas.json");
    let split = tempfile::tempdir().unwrap();
    let output = Command::new("python3")
        .args(["-c", SPLIT])
        .arg(&schemas)
        .arg(split.path())
        .args(files)
        .output()
        .expect("python3 is needed");
    assert!(
        output.status.success(),
        "external-snapshotter and -snapshot-metadata objects against their CRD schemas:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut parts = manifests_in(split.path());
    parts.retain(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0));
    for version in KUBERNETES_VERSIONS {
        let minor = |v: &str| v.split('.').nth(1).and_then(|m| m.parse::<u32>().ok());
        let these: Vec<&PathBuf> = parts
            .iter()
            .filter(|p| {
                let text = std::fs::read_to_string(p).unwrap();
                let needs = text
                    .lines()
                    .find_map(|l| l.strip_prefix(NEEDS))
                    .and_then(|rest| minor(rest.split_whitespace().next().unwrap_or_default()));
                needs.is_none_or(|n| minor(version).is_some_and(|v| v >= n))
            })
            .collect();
        let result = Command::new("kubernetes-validate")
            .args(["--strict", "--quiet", "--kubernetes-version", version])
            .args(&these)
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
            let env = literal_env(container);
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
            let env = literal_env(container);
            for arg in strings(&container["args"]) {
                let arg = expand(&arg, &env);
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

/// The shipped manifests with every component, rendered as the script renders them.
fn complete() -> (tempfile::TempDir, Vec<(PathBuf, Value)>) {
    let out = rendered(&[EVERY_COMPONENT]);
    let docs = documents_in(out.path());
    (out, docs)
}

#[ignore = "needs kubectl, kubernetes-validate and PyYAML (.ci/run installs them)"]
#[test]
fn every_manifest_with_every_component_validates_strictly_against_the_api_and_crd_schemas() {
    let out = rendered(&[EVERY_COMPONENT]);
    let files = manifests_in(out.path());
    let names: Vec<String> = files
        .iter()
        .map(|f| f.strip_prefix(out.path()).unwrap().display().to_string())
        .collect();
    for expected in [
        "csi-nodekit.yaml",
        "examples/snapshot-restore.yaml",
        "tools/doctor-pod.yaml",
    ] {
        assert!(names.contains(&expected.to_owned()), "{names:?}");
    }
    validate_strictly(&files);
}

#[ignore = "needs kubectl, kubernetes-validate and PyYAML (.ci/run installs them)"]
#[test]
fn every_command_line_the_manifests_give_our_image_is_accepted_by_the_binary() {
    check_command_lines(&complete().1, IMAGE);
}

#[ignore = "needs kubectl, kubernetes-validate and PyYAML (.ci/run installs them)"]
#[test]
fn the_manifests_agree_on_the_driver_name_the_socket_paths_and_the_image_version() {
    let (out, docs) = complete();
    check_agreement(&docs, out.path(), &shipped_image(), KUBELET_ROOT);
}

#[ignore = "needs kubectl, kubernetes-validate and PyYAML (.ci/run installs them)"]
#[test]
fn the_doctor_pod_reads_the_host_where_it_tells_the_doctor_to_look_and_has_only_read_rights() {
    let (out, docs) = complete();
    check_doctor(&docs, out.path(), None);
}

/// Our DaemonSet among rendered documents.
pub(super) fn our_daemonset(docs: &[(PathBuf, Value)]) -> &Value {
    &docs
        .iter()
        .find(|(f, d)| kind(d) == "DaemonSet" && f.ends_with("csi-nodekit.yaml"))
        .expect("our DaemonSet")
        .1
}

/// A container of our DaemonSet by name.
pub(super) fn container<'a>(daemonset: &'a Value, name: &str) -> &'a Value {
    pod_spec(daemonset).unwrap()["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

#[ignore = "needs kubectl, kubernetes-validate and PyYAML (.ci/run installs them)"]
#[test]
fn the_driver_takes_no_selinux_mount_label_and_its_pod_shares_one_selinux_type() {
    let (_out, docs) = complete();
    let (_, driver) = docs.iter().find(|(_, d)| kind(d) == "CSIDriver").unwrap();
    // Bind-mounted directories of one filesystem cannot take a per-volume context= label.
    assert_eq!(driver["spec"]["seLinuxMount"], false);
    let (file, daemonset) = docs
        .iter()
        .find(|(f, d)| kind(d) == "DaemonSet" && f.ends_with("csi-nodekit.yaml"))
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

#[ignore = "needs kubectl, kubernetes-validate and PyYAML (.ci/run installs them)"]
#[test]
fn our_daemonset_upgrades_with_a_surge_and_never_leaves_a_node_without_its_driver() {
    let (_out, docs) = complete();
    let (file, daemonset) = docs
        .iter()
        .find(|(f, d)| kind(d) == "DaemonSet" && f.ends_with("csi-nodekit.yaml"))
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
