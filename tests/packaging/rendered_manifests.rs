//! `scripts/render-manifests.sh`, the thin wrapper around `kubectl kustomize`: the manifests for
//! another image and another kubelet root (MicroK8s', k0s') pass every check the shipped ones
//! pass and keep nothing of the default root; the overlays in the repository give the same
//! bytes as the script; our image is pulled only as often as its tag demands.

use std::path::PathBuf;

use serde_json::Value;

use super::manifests::{
    COMPLETE, EVERY_COMPONENT, IMAGE, KUBELET_ROOT, check_agreement, check_command_lines,
    check_doctor, documents_in, kustomize, manifests_in, pod_spec, render, rendered, shipped_image,
    validate_strictly,
};

const MICROK8S_ROOT: &str = "/var/snap/microk8s/common/var/lib/kubelet";
const K0S_ROOT: &str = "/var/lib/k0s/kubelet";
const REGISTRY_IMAGE: &str = "registry.example.com/platform/csi-nodekit:0.1.0-rc1";

#[ignore = "needs kubectl, kubernetes-validate and PyYAML (.ci/run installs them)"]
#[test]
fn manifests_rendered_for_microk8s_and_k0s_validate_and_agree_on_the_new_image_and_root() {
    for root in [MICROK8S_ROOT, K0S_ROOT] {
        let out = rendered(&[
            &format!("--image={REGISTRY_IMAGE}"),
            "--kubelet-root",
            root,
            EVERY_COMPONENT,
        ]);
        let files = manifests_in(out.path());
        validate_strictly(&files);
        let docs = documents_in(out.path());
        check_command_lines(&docs, REGISTRY_IMAGE);
        check_agreement(&docs, out.path(), REGISTRY_IMAGE, root);
        check_doctor(&docs, out.path(), Some(root));
        for file in &files {
            // MicroK8s' root ends in the default one: what is left without it must not.
            let text = std::fs::read_to_string(file)
                .unwrap()
                .replace(root, "<root>");
            assert!(
                !text.contains(KUBELET_ROOT),
                "{file:?} rendered for {root} still names {KUBELET_ROOT}"
            );
            assert!(!text.contains("localhost/csi-nodekit:"), "{file:?}");
        }
    }
}

#[ignore = "needs kubectl (.ci/run installs it)"]
#[test]
fn the_kustomize_overlays_in_the_repository_render_what_the_script_renders() {
    let cases: [(&str, &[&str]); 4] = [
        ("", &[]),
        ("overlays/microk8s", &["--kubelet-root", MICROK8S_ROOT]),
        ("overlays/k0s", &["--kubelet-root", K0S_ROOT]),
        ("overlays/complete", &[COMPLETE]),
    ];
    for (overlay, args) in cases {
        let out = rendered(args);
        let by_script = std::fs::read_to_string(out.path().join("csi-nodekit.yaml")).unwrap();
        assert_eq!(
            kustomize(overlay),
            by_script,
            "packaging/kubernetes/{overlay} vs {args:?}"
        );
    }
    // Without flags the files outside the base are the shipped ones, byte for byte.
    let out = rendered(&[]);
    let shipped = super::manifests::manifest_dir();
    for dir in ["examples", "drop-in", "tools"] {
        for file in manifests_in(&shipped.join(dir)) {
            let name = file.strip_prefix(&shipped).unwrap();
            assert_eq!(
                std::fs::read(out.path().join(name)).unwrap(),
                std::fs::read(&file).unwrap(),
                "{name:?}"
            );
        }
    }
}

#[test]
fn the_render_script_refuses_an_unknown_flag_a_bad_value_and_a_missing_argument_with_exit_2() {
    let cases = [
        (&["--bogus"][..], "flag provided but not defined: --bogus"),
        (
            &["--kubelet-root=var/lib/kubelet"],
            "invalid value \"var/lib/kubelet\" for flag --kubelet-root",
        ),
        (
            &["--kubelet-root=/var/lib/../kubelet"],
            "invalid value \"/var/lib/../kubelet\" for flag --kubelet-root",
        ),
        (&["--image=a b"], "invalid value \"a b\" for flag --image"),
        (
            &["--image=registry/csi-nodekit"],
            "invalid value \"registry/csi-nodekit\" for flag --image: no tag",
        ),
        (
            &["--image=r/x@sha256:12"],
            "invalid value \"r/x@sha256:12\" for flag --image",
        ),
        (
            &["--with=snapshots,bogus"],
            "invalid value \"snapshots,bogus\" for flag --with",
        ),
        (
            &["--with=snapshots,snapshot-metadata"],
            "flag --with=snapshot-metadata needs --snapshot-metadata-ca=FILE",
        ),
        (
            &["--with=snapshots", "--snapshot-metadata-ca=/dev/null"],
            "flag --snapshot-metadata-ca is only for --with=…,snapshot-metadata",
        ),
        (
            &[
                "--with=snapshot-metadata",
                "--snapshot-metadata-ca=Cargo.toml",
            ],
            "invalid value \"Cargo.toml\" for flag --snapshot-metadata-ca: not a readable PEM",
        ),
        (&["--out"], "flag needs an argument: --out"),
    ];
    for (args, message) in cases {
        let output = render(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
}

/// Every container running our image in `docs`, with its file, image and pull policy.
fn ours(docs: &[(PathBuf, Value)], image_name: &str) -> Vec<(PathBuf, String, String)> {
    let mut found = Vec::new();
    for (file, doc) in docs {
        let Some(spec) = pod_spec(doc) else { continue };
        for container in spec["containers"].as_array().into_iter().flatten() {
            let image = container["image"].as_str().unwrap_or_default();
            if image.starts_with(image_name) {
                let policy = container["imagePullPolicy"].as_str().unwrap_or("<unset>");
                found.push((file.clone(), image.to_owned(), policy.to_owned()));
            }
        }
    }
    found
}

#[ignore = "needs kubectl and PyYAML (.ci/run installs them)"]
#[test]
fn our_image_is_pulled_if_not_present_only_under_a_tag_or_digest_that_names_one_build() {
    let version = env!("CARGO_PKG_VERSION");
    let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    let cases = [
        // (the --image flag, image name, image in the manifests, expected policy)
        (None, "localhost/csi-nodekit", shipped_image(), "Always"),
        (
            Some(format!("localhost/csi-nodekit:{version}-0123456789ab")),
            "localhost/csi-nodekit",
            format!("localhost/csi-nodekit:{version}-0123456789ab"),
            "IfNotPresent",
        ),
        (
            Some(REGISTRY_IMAGE.to_owned()),
            "registry.example.com/platform/csi-nodekit",
            REGISTRY_IMAGE.to_owned(),
            "Always",
        ),
        (
            Some(format!(
                "registry.example.com:5000/csi-nodekit:{version}@{digest}"
            )),
            "registry.example.com:5000/csi-nodekit",
            format!("registry.example.com:5000/csi-nodekit@{digest}"),
            "IfNotPresent",
        ),
    ];
    for (flag, name, image, policy) in cases {
        let flag = flag.map(|f| format!("--image={f}"));
        let mut args = vec![EVERY_COMPONENT];
        args.extend(flag.as_deref());
        let out = rendered(&args);
        let found = ours(&documents_in(out.path()), name);
        // node-server, registrar, liveness-probe, the resizer's endpoint, the doctor pod, the
        // drop-in's two.
        assert_eq!(found.len(), 7, "{args:?}: {found:?}");
        for (file, used, pulled) in found {
            assert_eq!(used, image, "{args:?} {file:?}");
            assert_eq!(pulled, policy, "{args:?} {file:?}: image {used}");
        }
    }
    // The shipped files follow the rule too: the version's tag moves with every rebuild.
    let shipped = documents_in(&super::manifests::manifest_dir());
    let found = ours(&shipped, IMAGE.trim_end_matches(':'));
    assert!(found.len() >= 7, "{found:?}");
    for (file, _, pulled) in found {
        assert_eq!(pulled, "Always", "{file:?}");
    }
}

/// The StorageClasses of our provisioner and their `layout`, and the CSIDriver's
/// `seLinuxMount`, in rendered documents.
fn selinux_view(docs: &[(PathBuf, Value)]) -> (Option<bool>, Vec<(String, String)>) {
    let of_kind = |kind: &'static str| {
        (docs.iter())
            .map(|(_, doc)| doc)
            .filter(move |doc| doc["kind"] == kind)
    };
    let mount = of_kind("CSIDriver")
        .find(|d| d["metadata"]["name"] == "nodekit.csi.local")
        .and_then(|d| d["spec"]["seLinuxMount"].as_bool());
    let classes = of_kind("StorageClass")
        .filter(|c| c["provisioner"] == "nodekit.csi.local")
        .map(|c| {
            let name = c["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let layout = c["parameters"]["layout"].as_str().unwrap_or("directory");
            (name, layout.to_owned())
        })
        .collect();
    (mount, classes)
}

#[ignore = "needs kubectl, kubernetes-validate and PyYAML (.ci/run installs them)"]
#[test]
fn the_selinux_component_turns_on_selinux_mounts_and_keeps_only_image_volume_classes() {
    let plain = rendered(&[]);
    let (mount, classes) = selinux_view(&documents_in(plain.path()));
    assert_eq!(
        mount,
        Some(false),
        "without the component: the runtime relabels"
    );
    assert!(
        classes.iter().any(|(_, layout)| layout == "directory"),
        "{classes:?}"
    );

    let out = rendered(&["--with=selinux,snapshots"]);
    validate_strictly(&manifests_in(out.path()));
    let docs = documents_in(out.path());
    check_command_lines(&docs, IMAGE);
    let (mount, classes) = selinux_view(&docs);
    assert_eq!(
        mount,
        Some(true),
        "the kubelet passes context= and skips relabelling"
    );
    assert!(!classes.is_empty());
    assert!(
        classes.iter().all(|(_, layout)| layout == "image"),
        "every class makes volumes that can take a context: {classes:?}"
    );
}
