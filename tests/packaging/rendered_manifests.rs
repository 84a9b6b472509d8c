//! `scripts/render-manifests.sh`: the manifests for another image and another kubelet root
//! (MicroK8s', k0s') pass every check the shipped ones pass, and keep nothing of the default
//! root.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::manifests::{
    KUBELET_ROOT, check_agreement, check_command_lines, check_doctor, documents_in, manifest_dir,
    manifests_in, validate_strictly,
};

const MICROK8S_ROOT: &str = "/var/snap/microk8s/common/var/lib/kubelet";
const K0S_ROOT: &str = "/var/lib/k0s/kubelet";
const REGISTRY_IMAGE: &str = "registry.example.com/platform/csi-nodekit:0.1.0-rc1";

fn render(args: &[&str]) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/render-manifests.sh");
    Command::new("bash")
        .arg(script)
        .args(args)
        .output()
        .expect("run bash")
}

/// Renders into a fresh directory and returns it.
fn rendered(image: &str, root: &str) -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    let output = render(&[
        &format!("--image={image}"),
        "--kubelet-root",
        root,
        &format!("--out={}", out.path().display()),
    ]);
    assert!(
        output.status.success(),
        "render-manifests.sh failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

fn relative(files: &[PathBuf], dir: &Path) -> Vec<PathBuf> {
    files
        .iter()
        .map(|f| f.strip_prefix(dir).unwrap().to_path_buf())
        .collect()
}

#[ignore = "needs kubernetes-validate and PyYAML (.ci/run installs them)"]
#[test]
fn manifests_rendered_for_microk8s_and_k0s_validate_and_agree_on_the_new_image_and_root() {
    for root in [MICROK8S_ROOT, K0S_ROOT] {
        let out = rendered(REGISTRY_IMAGE, root);
        let files = manifests_in(out.path());
        assert_eq!(
            relative(&files, out.path()),
            relative(&manifests_in(&manifest_dir()), &manifest_dir()),
            "every shipped manifest rendered, under its own name"
        );
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

#[test]
fn rendering_with_no_flags_writes_the_shipped_manifests_unchanged() {
    let out = tempfile::tempdir().unwrap();
    let output = render(&["--out", out.path().to_str().unwrap()]);
    assert!(output.status.success(), "{output:?}");
    let shipped = manifests_in(&manifest_dir());
    for file in &shipped {
        let name = file.strip_prefix(manifest_dir()).unwrap();
        assert_eq!(
            std::fs::read(out.path().join(name)).unwrap(),
            std::fs::read(file).unwrap(),
            "{name:?}"
        );
    }
}

#[test]
fn the_render_script_refuses_an_unknown_flag_and_a_relative_kubelet_root_with_exit_2() {
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
