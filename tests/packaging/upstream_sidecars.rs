//! The upstream sidecars in the manifests, held to their pinned releases: every flag one of
//! them is given is a flag that release registers, every feature gate one it knows, every RBAC
//! rule for it one its release documents. There is no network to the upstream repositories in
//! CI, so the flag sets and rules are recorded here as data, each with the file it was read from.
//!
//! Where they were read: the public code index's copies of the upstream repositories (the
//! versions it holds, named by commit below). For csi-provisioner and csi-snapshotter those
//! copies are older than the pinned tags, which could not be read offline; every flag and rule
//! the manifests use is present in them, and the releases since (CHANGELOG-6.x.md, -8.x.md,
//! read in the same index) remove none of them. For csi-snapshot-metadata the copy read is a
//! v1.x one (with v1.0.0's HTTP health endpoint); v1.1.0's changelog names no flag change, and
//! the TLS tuning flags merged after it are left out. docs/deploy.md, "Pinned upstream
//! releases".

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value;

use super::manifests::{
    EVERY_COMPONENT, container, documents_in, expand, kind, literal_env, our_daemonset, rendered,
    strings,
};

/// klog's and component-base's logging flags, which the sidecars built on component-base
/// register.
const LOGGING: &[&str] = &["v", "vmodule", "logging-format", "log-flush-frequency"];

/// The flags `klog.InitFlags` registers, all a sidecar without component-base's logging has.
const KLOG: &[&str] = &[
    "v",
    "vmodule",
    "log_dir",
    "log_file",
    "log_file_max_size",
    "logtostderr",
    "alsologtostderr",
    "stderrthreshold",
    "skip_headers",
    "skip_log_headers",
    "add_dir_header",
    "one_output",
    "log_backtrace_at",
];

struct Release {
    image: &'static str,
    /// Its logging flags: [`LOGGING`] or [`KLOG`].
    logging: &'static [&'static str],
    /// Flag names the release registers (without dashes), besides its logging flags.
    flags: &'static [&'static str],
    /// Feature gates `--feature-gates` takes.
    gates: &'static [&'static str],
    /// Documented ClusterRole rules: (API group, resource, verbs).
    rules: &'static [(&'static str, &'static str, &'static [&'static str])],
}

/// external-provisioner, pinned v6.4.0 (CHANGELOG/CHANGELOG-6.4.md). Flags from
/// cmd/csi-provisioner/csi-provisioner.go as the index holds it (the pflag-based version with
/// node deployment, capacity and CrossNamespaceVolumeDataSource); `Topology` from the gate the
/// manifests have passed since v5 (not re-read here). Rules from deploy/kubernetes/rbac.yaml
/// (index copy @f7527624e740a469da16f15cc6c7731763971fef) plus the ones its README documents for
/// --enable-capacity (CSIStorageCapacity, get pods) and topology (csinodes) and the
/// VolumeAttachment watch it starts only for PUBLISH_UNPUBLISH drivers.
const PROVISIONER: Release = Release {
    image: "registry.k8s.io/sig-storage/csi-provisioner:v6.4.0",
    logging: LOGGING,
    flags: &[
        "master",
        "kubeconfig",
        "csi-address",
        "volume-name-prefix",
        "volume-name-uuid-length",
        "version",
        "retry-interval-start",
        "retry-interval-max",
        "worker-threads",
        "cloning-protection-threads",
        "capacity-threads",
        "timeout",
        "leader-election",
        "leader-election-namespace",
        "strict-topology",
        "immediate-topology",
        "extra-create-metadata",
        "metrics-address",
        "http-endpoint",
        "metrics-path",
        "enable-pprof",
        "leader-election-lease-duration",
        "leader-election-renew-deadline",
        "leader-election-retry-period",
        "default-fstype",
        "kube-api-qps",
        "kube-api-burst",
        "kube-api-capacity-qps",
        "kube-api-capacity-burst",
        "enable-capacity",
        "capacity-for-immediate-binding",
        "capacity-poll-interval",
        "capacity-ownerref-level",
        "node-deployment",
        "node-deployment-immediate-binding",
        "node-deployment-base-delay",
        "node-deployment-max-delay",
        "controller-publish-readonly",
        "prevent-volume-mode-conversion",
        "feature-gates",
    ],
    gates: &["Topology", "CrossNamespaceVolumeDataSource"],
    rules: &[
        (
            "",
            "persistentvolumes",
            &["get", "list", "watch", "create", "patch", "delete"],
        ),
        (
            "",
            "persistentvolumeclaims",
            &["get", "list", "watch", "update"],
        ),
        (
            "storage.k8s.io",
            "storageclasses",
            &["get", "list", "watch"],
        ),
        (
            "",
            "events",
            &["list", "watch", "create", "update", "patch"],
        ),
        (
            "snapshot.storage.k8s.io",
            "volumesnapshots",
            &["get", "list"],
        ),
        (
            "snapshot.storage.k8s.io",
            "volumesnapshotcontents",
            &["get", "list"],
        ),
        ("storage.k8s.io", "csinodes", &["get", "list", "watch"]),
        ("", "nodes", &["get", "list", "watch"]),
        (
            "storage.k8s.io",
            "volumeattachments",
            &["get", "list", "watch"],
        ),
        (
            "storage.k8s.io",
            "csistoragecapacities",
            &[
                "get", "list", "watch", "create", "update", "patch", "delete",
            ],
        ),
        ("", "pods", &["get"]),
    ],
};

/// external-snapshotter's csi-snapshotter, pinned v8.7.0 (CHANGELOG/CHANGELOG-8.7.md, which
/// enables the VolumeGroupSnapshot gate). Flags from cmd/csi-snapshotter/main.go as the index
/// holds it (the v8 version with --node-deployment, the group snapshot flags and the
/// CSIVolumeGroupSnapshot gate it names in its warning). Rules from
/// deploy/kubernetes/csi-snapshotter/rbac-csi-snapshotter.yaml
/// (@0ccf8017800f0f6160f5003f2cf333954dfa4a91) and, for group snapshots, the same rules on
/// groupsnapshot.storage.k8s.io that v8's file adds (not in that older copy: unverified here).
const SNAPSHOTTER: Release = Release {
    image: "registry.k8s.io/sig-storage/csi-snapshotter:v8.7.0",
    logging: LOGGING,
    flags: &[
        "kubeconfig",
        "csi-address",
        "resync-period",
        "snapshot-name-prefix",
        "snapshot-name-uuid-length",
        "version",
        "worker-threads",
        "timeout",
        "extra-create-metadata",
        "leader-election",
        "leader-election-namespace",
        "leader-election-lease-duration",
        "leader-election-renew-deadline",
        "leader-election-retry-period",
        "kube-api-qps",
        "kube-api-burst",
        "metrics-address",
        "http-endpoint",
        "metrics-path",
        "retry-interval-start",
        "retry-interval-max",
        "node-deployment",
        "groupsnapshot-name-prefix",
        "groupsnapshot-name-uuid-length",
        "feature-gates",
    ],
    gates: &["CSIVolumeGroupSnapshot"],
    rules: &[
        (
            "",
            "events",
            &["list", "watch", "create", "update", "patch"],
        ),
        (
            "snapshot.storage.k8s.io",
            "volumesnapshotclasses",
            &["get", "list", "watch"],
        ),
        (
            "snapshot.storage.k8s.io",
            "volumesnapshotcontents",
            &[
                "create", "get", "list", "watch", "update", "delete", "patch",
            ],
        ),
        (
            "snapshot.storage.k8s.io",
            "volumesnapshotcontents/status",
            &["update", "patch"],
        ),
        (
            "groupsnapshot.storage.k8s.io",
            "volumegroupsnapshotclasses",
            &["get", "list", "watch"],
        ),
        (
            "groupsnapshot.storage.k8s.io",
            "volumegroupsnapshotcontents",
            &[
                "create", "get", "list", "watch", "update", "delete", "patch",
            ],
        ),
        (
            "groupsnapshot.storage.k8s.io",
            "volumegroupsnapshotcontents/status",
            &["update", "patch"],
        ),
    ],
};

/// external-snapshot-metadata's sidecar, pinned v1.1.0 (CHANGELOG/CHANGELOG-1.1.md, the newest
/// release the index holds; v1.0.0 made the API v1beta1). Flags from pkg/sidecar/sidecar.go
/// (cmd/csi-snapshot-metadata/main.go only calls it) as the index holds it: the Go flag set with
/// --audience, --disable-metrics and the /health endpoint on --http-endpoint (default :8080),
/// which v1.0.0 added (CHANGELOG-1.0.md, #190), plus `klog.InitFlags`; --tls-min-version,
/// --tls-cipher-suites and --tls-curve-preferences came after v1.1.0 (pull request #259) and are
/// not recorded. Rules from deploy/snapshot-metadata-cluster-role.yaml
/// (@d511e77a600846940cca032eeebf4725bb827ee6) and, not in that file, the VolumeSnapshotClass
/// reads of pkg/internal/server/grpc/snapshotter_secret.go
/// (@56185cdf0328dcca9512cd27452616620a6dabf6: the class of a snapshot, or the driver's default).
const SNAPSHOT_METADATA: Release = Release {
    image: "registry.k8s.io/sig-storage/csi-snapshot-metadata:v1.1.0",
    logging: KLOG,
    flags: &[
        "kubeconfig",
        "csi-address",
        "version",
        "timeout",
        "port",
        "tls-cert",
        "tls-key",
        "audience",
        "max-streaming-duration-min",
        "kube-api-qps",
        "kube-api-burst",
        "http-endpoint",
        "metrics-path",
        "disable-metrics",
    ],
    gates: &[],
    rules: &[
        (
            "cbt.storage.k8s.io",
            "snapshotmetadataservices",
            &[
                "get", "list", "watch", "create", "update", "patch", "delete",
            ],
        ),
        ("authentication.k8s.io", "tokenreviews", &["create", "get"]),
        (
            "authorization.k8s.io",
            "subjectaccessreviews",
            &["create", "get"],
        ),
        (
            "snapshot.storage.k8s.io",
            "volumesnapshots",
            &["get", "list"],
        ),
        (
            "snapshot.storage.k8s.io",
            "volumesnapshotcontents",
            &["get", "list"],
        ),
        (
            "snapshot.storage.k8s.io",
            "volumesnapshotclasses",
            &["get", "list"],
        ),
    ],
};

/// The ClusterRole external-snapshot-metadata documents for a backup application (its
/// deploy/snpashot-metadata-client-cluster-role.yaml, so spelt,
/// @d511e77a600846940cca032eeebf4725bb827ee6, the same rules as
/// deploy/example/backup-app/client-cluster-role.yaml @005a573e6ab08e6889c6ac5899c8a551cd3a24d1).
const SNAPSHOT_METADATA_CLIENT: &[(&str, &str, &[&str])] = &[
    (
        "snapshot.storage.k8s.io",
        "volumesnapshots",
        &["get", "list", "watch"],
    ),
    (
        "snapshot.storage.k8s.io",
        "volumesnapshotcontents",
        &["get", "list", "watch"],
    ),
    (
        "cbt.storage.k8s.io",
        "snapshotmetadataservices",
        &["get", "list"],
    ),
    ("", "serviceaccounts/token", &["create", "get"]),
];

/// external-resizer, pinned v2.3.0 (CHANGELOG/CHANGELOG-2.3.md, which adds --resize-timeout and
/// --modify-timeout and removes the RecoverVolumeExpansionFailure gate). Flags from
/// cmd/csi-resizer/main.go (@03ee07c287ef3b03a555ef1a9ee19a47008d3f7b, component-base logging)
/// plus those two; gates from pkg/features/features.go
/// (@07522c1694731994d6816fe847701dcdb9a7b85a) less the removed one. Rules from
/// deploy/kubernetes/rbac.yaml (@3e019e6338dc794bc1122bd75d9dab765d210a3a) and, not in that
/// copy, the VolumeAttributesClass reads of its modify controller (its lister of the classes,
/// pkg/modifycontroller/modify_volume.go @00ef2b5c82cfc6f90f4a00b73f2ef6870337b981).
const RESIZER: Release = Release {
    image: "registry.k8s.io/sig-storage/csi-resizer:v2.3.0",
    logging: LOGGING,
    flags: &[
        "master",
        "kubeconfig",
        "resync-period",
        "workers",
        "extra-modify-metadata",
        "csi-address",
        "timeout",
        "resize-timeout",
        "modify-timeout",
        "version",
        "retry-interval-start",
        "retry-interval-max",
        "leader-election",
        "leader-election-namespace",
        "leader-election-lease-duration",
        "leader-election-renew-deadline",
        "leader-election-retry-period",
        "metrics-address",
        "http-endpoint",
        "metrics-path",
        "kube-api-qps",
        "kube-api-burst",
        "handle-volume-inuse-error",
        "feature-gates",
    ],
    gates: &["AnnotateFsResize", "VolumeAttributesClass"],
    rules: &[
        ("", "persistentvolumes", &["get", "list", "watch", "patch"]),
        ("", "persistentvolumeclaims", &["get", "list", "watch"]),
        ("", "pods", &["get", "list", "watch"]),
        ("", "persistentvolumeclaims/status", &["patch"]),
        (
            "",
            "events",
            &["list", "watch", "create", "update", "patch"],
        ),
        (
            "coordination.k8s.io",
            "leases",
            &["get", "watch", "list", "delete", "update", "create"],
        ),
        (
            "storage.k8s.io",
            "volumeattributesclasses",
            &["get", "list", "watch"],
        ),
    ],
};

const RELEASES: &[&Release] = &[&PROVISIONER, &SNAPSHOTTER, &SNAPSHOT_METADATA, &RESIZER];

/// The accounts our workloads run as: the node plugin's and the resizer's.
const ACCOUNTS: &[&str] = &["csi-nodekit", "csi-nodekit-resizer"];

/// The containers of every workload of ours (the node plugin's DaemonSet, the resizer's
/// Deployment; not the drop-in example's upstream containers).
fn every_container(docs: &[(PathBuf, Value)]) -> Vec<Value> {
    let workloads = docs.iter().filter(|(file, d)| {
        file.ends_with("csi-nodekit.yaml") && ["DaemonSet", "Deployment"].contains(&kind(d))
    });
    workloads
        .flat_map(|(_, d)| {
            super::manifests::pod_spec(d).unwrap()["containers"]
                .clone()
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect()
}

fn complete() -> Vec<(PathBuf, Value)> {
    let out = rendered(&[EVERY_COMPONENT]);
    documents_in(out.path())
}

fn release_of(image: &str) -> Option<&'static Release> {
    RELEASES.iter().copied().find(|r| r.image == image)
}

#[ignore = "needs kubectl and PyYAML (.ci/run installs them)"]
#[test]
fn every_upstream_sidecar_runs_its_pinned_release_with_flags_and_gates_that_release_registers() {
    let docs = complete();
    let mut seen = BTreeSet::new();
    for c in &every_container(&docs) {
        let image = c["image"].as_str().unwrap();
        if image.contains("csi-nodekit") {
            continue;
        }
        let release = release_of(image)
            .unwrap_or_else(|| panic!("{image} is not a pinned release with a recorded flag set"));
        seen.insert(release.image);
        let env = literal_env(c);
        for arg in strings(&c["args"]) {
            let arg = expand(&arg, &env);
            let flag = arg.trim_start_matches('-');
            assert!(
                arg.starts_with('-') && flag.len() + 2 >= arg.len(),
                "{image}: {arg}"
            );
            let (name, value) = flag.split_once('=').unwrap_or((flag, ""));
            assert!(
                release.flags.contains(&name) || release.logging.contains(&name),
                "{image} registers no flag --{name}"
            );
            if name == "feature-gates" {
                for gate in value.split(',') {
                    let (gate, on) = gate.split_once('=').expect("gate=value");
                    assert!(
                        release.gates.contains(&gate),
                        "{image} knows no gate {gate}"
                    );
                    assert!(["true", "false"].contains(&on), "{image}: {gate}={on}");
                }
            }
        }
    }
    assert_eq!(
        seen.len(),
        RELEASES.len(),
        "every pinned release is in the manifests"
    );
}

/// A role's rules as (API group, resource, verb) entries.
fn entries(role: &Value) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for rule in role["rules"].as_array().unwrap() {
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    out.push((group.clone(), resource.clone(), verb));
                }
            }
        }
    }
    out
}

fn set_of(rules: &[(&str, &str, &[&str])]) -> BTreeSet<(String, String, String)> {
    rules
        .iter()
        .flat_map(|(group, resource, verbs)| {
            verbs
                .iter()
                .map(move |v| (group.to_string(), resource.to_string(), v.to_string()))
        })
        .collect()
}

/// The (kind, name) of every role some binding among `docs` grants one of our workloads'
/// ServiceAccounts ([`ACCOUNTS`] in csi-nodekit).
fn roles_of_our_workloads(docs: &[(PathBuf, Value)]) -> BTreeSet<(String, String)> {
    let mut roles = BTreeSet::new();
    for (_, doc) in docs {
        if !["ClusterRoleBinding", "RoleBinding"].contains(&kind(doc)) {
            continue;
        }
        let ours = doc["subjects"].as_array().into_iter().flatten().any(|s| {
            s["kind"] == "ServiceAccount"
                && ACCOUNTS.iter().any(|a| s["name"] == *a)
                && s["namespace"] == "csi-nodekit"
        });
        if ours {
            let role = &doc["roleRef"];
            roles.insert((
                role["kind"].as_str().unwrap().to_owned(),
                role["name"].as_str().unwrap().to_owned(),
            ));
        }
    }
    roles
}

#[ignore = "needs kubectl and PyYAML (.ci/run installs them)"]
#[test]
fn every_rbac_rule_of_the_node_plugin_and_the_resizer_is_one_an_upstream_release_documents() {
    let docs = complete();
    let documented: BTreeSet<(String, String, String)> =
        RELEASES.iter().flat_map(|r| set_of(r.rules)).collect();
    let held = roles_of_our_workloads(&docs);
    let mut checked = 0;
    let mut found = BTreeSet::new();
    for (file, doc) in &docs {
        let key = (
            kind(doc).to_owned(),
            doc["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
        if !held.contains(&key) {
            continue;
        }
        found.insert(key);
        for entry in entries(doc) {
            assert!(
                documented.contains(&entry),
                "{file:?}: {entry:?} is not documented"
            );
            checked += 1;
        }
    }
    assert_eq!(
        found, held,
        "every role bound to our workloads is in the manifests"
    );
    assert!(checked > 40, "only {checked} rule entries found");
}

#[ignore = "needs kubectl and PyYAML (.ci/run installs them)"]
#[test]
fn the_backup_client_role_asks_only_what_upstream_documents_and_nothing_binds_it() {
    let docs = complete();
    let name = "csi-nodekit-snapshot-metadata-client";
    let (file, role) = docs
        .iter()
        .find(|(_, d)| kind(d) == "ClusterRole" && d["metadata"]["name"] == name)
        .expect("the backup client's ClusterRole (components/snapshot-metadata)");
    let documented = set_of(SNAPSHOT_METADATA_CLIENT);
    let given: BTreeSet<_> = entries(role).into_iter().collect();
    for entry in &given {
        assert!(
            documented.contains(entry),
            "{file:?}: {entry:?} is not documented"
        );
    }
    // What the sidecar and the client's discovery need of it: read the snapshots and the
    // SnapshotMetadataService, and (for a token of its own) create one.
    for (group, resource, verb) in [
        ("snapshot.storage.k8s.io", "volumesnapshots", "get"),
        ("snapshot.storage.k8s.io", "volumesnapshotcontents", "get"),
        ("cbt.storage.k8s.io", "snapshotmetadataservices", "get"),
        ("", "serviceaccounts/token", "create"),
    ] {
        let entry = (group.to_owned(), resource.to_owned(), verb.to_owned());
        assert!(given.contains(&entry), "{file:?}: lacks {entry:?}");
    }
    // The backup application's own account is yours to bind: the node plugin does not hold it.
    for (_, doc) in &docs {
        if ["ClusterRoleBinding", "RoleBinding"].contains(&kind(doc)) {
            assert_ne!(
                doc["roleRef"]["name"], name,
                "bound by the manifests: {doc}"
            );
        }
    }
}

#[ignore = "needs kubectl and PyYAML (.ci/run installs them)"]
#[test]
fn the_snapshotter_and_provisioner_act_only_for_their_own_node_and_without_leader_election() {
    let docs = complete();
    let daemonset = our_daemonset(&docs);
    for name in ["csi-provisioner", "csi-snapshotter"] {
        let c = container(daemonset, name);
        let args = strings(&c["args"]);
        assert!(
            args.contains(&"--node-deployment=true".to_owned()),
            "{name}: {args:?}"
        );
        assert!(
            !args.iter().any(|a| a.starts_with("--leader-election")),
            "{name}"
        );
        let node = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "NODE_NAME")
            .unwrap_or_else(|| panic!("{name}: NODE_NAME"));
        assert_eq!(node["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    }
    // Group snapshots: the gate, and a class for node-server's driver.
    let snapshotter = strings(&container(daemonset, "csi-snapshotter")["args"]);
    assert!(snapshotter.contains(&"--feature-gates=CSIVolumeGroupSnapshot=true".to_owned()));
    for class in ["VolumeSnapshotClass", "VolumeGroupSnapshotClass"] {
        let (_, doc) = docs.iter().find(|(_, d)| kind(d) == class).expect(class);
        assert_eq!(doc["driver"], "nodekit.csi.local", "{class}");
    }
}

#[ignore = "needs kubectl and PyYAML (.ci/run installs them)"]
#[test]
fn the_one_resizer_expands_on_the_volumes_node_through_node_server_resizer_only() {
    let out = rendered(&[]);
    let docs = documents_in(out.path());
    let resizer = docs
        .iter()
        .map(|(_, d)| d)
        .find(|d| kind(d) == "Deployment" && d["metadata"]["name"] == "csi-nodekit-resizer")
        .expect("the resizer's Deployment is in the base");
    assert_eq!(resizer["spec"]["replicas"], 1);
    let spec = super::manifests::pod_spec(resizer).unwrap();
    assert_eq!(spec["serviceAccountName"], "csi-nodekit-resizer");
    let endpoint = container(resizer, "resizer-endpoint");
    let command = strings(&endpoint["command"]);
    let args = strings(&endpoint["args"]);
    assert_eq!(command, ["/csi-nodekit", "node-server"]);
    assert!(args.contains(&"--resizer-only".to_owned()), "{args:?}");
    // The same driver name as the node plugin's node-server, or the resizer skips its PVs.
    let daemonset = our_daemonset(&docs);
    let node_server = strings(&container(daemonset, "node-server")["args"]);
    let name = |args: &[String]| {
        (args.iter())
            .find(|a| a.starts_with("--driver-name="))
            .cloned()
    };
    assert_eq!(name(&args), name(&node_server));
    let socket = (args.iter())
        .find_map(|a| a.strip_prefix("--endpoint=unix://"))
        .expect("a socket")
        .to_owned();
    let upstream = container(resizer, "csi-resizer");
    let upstream_args = strings(&upstream["args"]);
    assert!(upstream_args.contains(&format!("--csi-address={socket}")));
    assert!(upstream_args.contains(&"--leader-election=true".to_owned()));
    // Nothing of the node: no host path, no privilege, not root.
    for volume in spec["volumes"].as_array().unwrap() {
        assert!(volume.get("hostPath").is_none(), "{volume}");
    }
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    for c in [endpoint, upstream] {
        assert_ne!(c["securityContext"]["privileged"], true);
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    }
    // Both classes let a PVC grow.
    let classes: Vec<_> = (docs.iter())
        .filter(|(_, d)| kind(d) == "StorageClass")
        .map(|(_, d)| d)
        .collect();
    assert_eq!(classes.len(), 2);
    for class in classes {
        assert_eq!(class["allowVolumeExpansion"], true, "{class}");
    }
}
