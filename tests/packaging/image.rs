//! The container image: built by `scripts/build-image.sh`, unpacked from its OCI archive, and
//! run with `chroot` into its root filesystem, where nothing but our binary and its links exist.
//!
//! Needs root (chroot) and buildah or podman (`.ci/run` installs buildah). The first run builds
//! the static release binary, which takes minutes; later runs reuse it.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// One run of the build script: its archive and what it printed.
pub(super) struct Build {
    _out: tempfile::TempDir,
    pub(super) archive: PathBuf,
    /// The CycloneDX SBOM written beside the archive.
    pub(super) sbom: PathBuf,
    /// The image's digest, as the script printed it.
    pub(super) digest: String,
    archive_sha256: String,
}

/// The cargo target directory this test binary was built in: the release build goes there too,
/// so `scripts/build-static.sh` and this test share it.
pub(super) fn target_dir() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_csi-nodekit"));
    bin.ancestors()
        .nth(2)
        .expect("<target>/debug/csi-nodekit")
        .to_owned()
}

/// What the build script stamps the image with: the date of the commit checked out, in UTC.
pub(super) fn commit_date() -> String {
    let git = Command::new("git")
        .args(["log", "-1", "--format=%ct"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run git");
    assert!(
        git.status.success(),
        "{}",
        String::from_utf8_lossy(&git.stderr)
    );
    let epoch: i64 = String::from_utf8_lossy(&git.stdout).trim().parse().unwrap();
    let date = Command::new("date")
        .args(["-u", "-d", &format!("@{epoch}"), "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .expect("run date");
    String::from_utf8(date.stdout).unwrap().trim().to_owned()
}

/// Runs the build script; with `binary`, the image is built from it instead of a fresh build.
fn build_image(binary: Option<&Path>) -> Build {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the image test needs root (buildah, chroot); run the suite as README.md says"
    );
    let out = tempfile::tempdir().unwrap();
    let mut command =
        Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-image.sh"));
    command
        .env("CARGO_TARGET_DIR", target_dir())
        .env("IMAGE_OUT", out.path())
        .env_remove("SOURCE_DATE_EPOCH")
        .env_remove("IMAGE_BINARY");
    if let Some(binary) = binary {
        command.env("IMAGE_BINARY", binary);
    }
    let output = command.output().expect("run scripts/build-image.sh");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "scripts/build-image.sh failed:\n{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let field = |name: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name:?} line in:\n{stdout}"))
            .trim()
            .to_owned()
    };
    let digest = field("digest:");
    let archive_line = field("archive:");
    let archive_sha256 = archive_line
        .rsplit_once("sha256:")
        .map(|(_, sum)| sum.to_owned())
        .expect("archive checksum");
    let archive = out.path().join(format!("csi-nodekit-{VERSION}.oci.tar"));
    assert!(archive.is_file(), "no archive at {archive:?}:\n{stdout}");
    let sbom = out.path().join(format!("csi-nodekit-{VERSION}.cdx.json"));
    assert_eq!(field("sbom:"), format!("{} (CycloneDX)", sbom.display()));
    Build {
        _out: out,
        archive,
        sbom,
        digest,
        archive_sha256,
    }
}

/// The first build, shared by the tests here and in `supply_chain.rs` (one static build).
pub(super) fn first_build() -> &'static Build {
    static BUILD: OnceLock<Build> = OnceLock::new();
    BUILD.get_or_init(|| build_image(None))
}

fn run(command: &mut Command) -> String {
    let output = command.output().expect("run command");
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn blob(layout: &Path, digest: &str) -> PathBuf {
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    layout.join("blobs/sha256").join(hex)
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).expect("read blob")).expect("JSON blob")
}

/// Unpacks the archive's image: returns its config and the root filesystem's directory.
pub(super) fn unpack(archive: &Path, into: &Path) -> (Value, PathBuf) {
    let layout = into.join("layout");
    let rootfs = into.join("rootfs");
    std::fs::create_dir_all(&layout).unwrap();
    std::fs::create_dir_all(&rootfs).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(&layout));
    let index = json(&layout.join("index.json"));
    let manifests = index["manifests"].as_array().expect("index manifests");
    // One image under two names: the version's tag and this build's own.
    assert_eq!(manifests.len(), 2, "{index}");
    assert_eq!(manifests[0]["digest"], manifests[1]["digest"], "{index}");
    let hex = manifests[0]["digest"]
        .as_str()
        .unwrap()
        .strip_prefix("sha256:")
        .unwrap();
    let mut names: Vec<&str> = manifests
        .iter()
        .map(|m| {
            m["annotations"]["org.opencontainers.image.ref.name"]
                .as_str()
                .unwrap()
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            format!("localhost/csi-nodekit:{VERSION}"),
            format!("localhost/csi-nodekit:{VERSION}-{}", &hex[..12]),
        ]
    );
    let manifest = json(&blob(&layout, manifests[0]["digest"].as_str().unwrap()));
    let config = json(&blob(
        &layout,
        manifest["config"]["digest"].as_str().unwrap(),
    ));
    for layer in manifest["layers"].as_array().expect("layers") {
        assert_eq!(
            layer["mediaType"],
            "application/vnd.oci.image.layer.v1.tar+gzip"
        );
        let file = blob(&layout, layer["digest"].as_str().unwrap());
        run(Command::new("tar")
            .arg("-xzpf")
            .arg(&file)
            .arg("-C")
            .arg(&rootfs));
    }
    (config, rootfs)
}

/// Every entry of the root filesystem: path → `file <mode>`, `link -> <target>` or `dir`.
fn listing(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let name = path.strip_prefix(root).unwrap().display().to_string();
            let what = if meta.is_symlink() {
                format!("link -> {}", std::fs::read_link(&path).unwrap().display())
            } else if meta.is_dir() {
                walk(root, &path, out);
                "dir".to_owned()
            } else {
                format!("file {:o}", meta.permissions().mode() & 0o7777)
            };
            out.insert(name, what);
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// `chroot`, found on the test's PATH, so the command itself can run with an empty environment.
fn chroot() -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain(["/usr/sbin".into(), "/usr/bin".into()])
        .map(|dir| dir.join("chroot"))
        .find(|p| p.is_file())
        .expect("chroot (coreutils) on PATH")
}

#[ignore = "needs root and buildah: builds the image and runs it under chroot"]
#[test]
fn the_image_holds_only_the_binary_its_mode_links_and_its_licence_notices_and_every_name_answers_version_inside_it()
 {
    let build = first_build();
    let dir = tempfile::tempdir().unwrap();
    let (config, rootfs) = unpack(&build.archive, dir.path());

    let expected: BTreeMap<String, String> = [
        ("csi-nodekit", "file 755"),
        ("csi-node-driver-registrar", "link -> csi-nodekit"),
        ("csi-node-server", "link -> csi-nodekit"),
        ("licenses", "dir"),
        ("livenessprobe", "link -> csi-nodekit"),
        ("node-driver-registrar", "link -> csi-nodekit"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let all = listing(&rootfs);
    let (notices, top): (BTreeMap<_, _>, BTreeMap<_, _>) = all
        .into_iter()
        .partition(|(path, _)| path.starts_with("licenses/"));
    assert_eq!(top, expected, "the image's root filesystem");
    // The notices (what they hold: `notices.rs`): plain files anyone can read, in directories.
    assert!(notices.contains_key("licenses/README"), "{notices:?}");
    for (path, what) in &notices {
        assert!(what == "dir" || what == "file 644", "{path}: {what}");
    }

    let c = &config["config"];
    assert_eq!(c["Entrypoint"], serde_json::json!(["/csi-nodekit"]));
    assert!(c["User"].as_str().unwrap_or_default().is_empty(), "{c}");
    // The Containerfile's value reaches the image (what it does: `malloc_settings`).
    let tunables = format!(
        "GLIBC_TUNABLES={}",
        super::malloc_settings::image_tunables()
    );
    assert!(
        c["Env"]
            .as_array()
            .is_some_and(|env| env.iter().any(|e| *e == tunables)),
        "the image sets {tunables}: {c}"
    );
    let labels = &c["Labels"];
    assert_eq!(labels["org.opencontainers.image.version"], VERSION);
    // The licences of everything in it, not only ours: glibc's LGPL and libgcc's GPL with its
    // runtime exception among them (the expression is the one the SBOM gives the image).
    let licences = labels["org.opencontainers.image.licenses"]
        .as_str()
        .expect("a licences label");
    for part in [
        "Apache-2.0",
        "LGPL-2.1-or-later",
        "GPL-3.0-or-later WITH GCC-exception-3.1",
        "ISC",
        "BSD-3-Clause",
        "Zlib",
        "(Apache-2.0 OR MIT)",
    ] {
        assert!(
            licences.split(" AND ").any(|p| p == part),
            "{part} in the licences label: {licences}"
        );
    }
    assert_eq!(labels["org.opencontainers.image.title"], "csi-nodekit");
    assert!(
        labels["org.opencontainers.image.source"].is_string(),
        "{labels}"
    );
    assert!(
        labels["org.opencontainers.image.description"].is_string(),
        "{labels}"
    );
    assert_eq!(config["created"], commit_date());
    assert!(
        config["history"].as_array().is_none_or(Vec::is_empty),
        "{config}"
    );

    let cases: &[(&[&str], &str)] = &[
        (&["/csi-nodekit", "--version"], "csi-nodekit"),
        (
            &["/csi-nodekit", "node-server", "--version"],
            "csi-nodekit node-server",
        ),
        (
            &["/csi-nodekit", "registrar", "--version"],
            "csi-nodekit registrar",
        ),
        (&["/csi-nodekit", "probe", "--version"], "csi-nodekit probe"),
        (
            &["/csi-nodekit", "probe", "serve", "--version"],
            "csi-nodekit probe",
        ),
        (
            &["/csi-nodekit", "probe", "once", "--version"],
            "csi-nodekit probe",
        ),
        (
            &["/csi-nodekit", "probe", "registration", "--version"],
            "csi-nodekit probe",
        ),
        (&["/csi-node-server", "--version"], "csi-node-server"),
        (
            &["/csi-node-driver-registrar", "--version"],
            "csi-node-driver-registrar",
        ),
        (
            &["/node-driver-registrar", "--version"],
            "node-driver-registrar",
        ),
        (&["/livenessprobe", "--version"], "livenessprobe"),
    ];
    for (argv, name) in cases {
        let out = run(Command::new(chroot()).env_clear().arg(&rootfs).args(*argv));
        assert_eq!(out, format!("{name} {VERSION}\n"), "{argv:?}");
    }
}

#[ignore = "needs root and buildah: builds the image and runs it under chroot"]
#[test]
fn building_the_image_again_from_the_same_binary_gives_the_same_digest_and_archive_bytes() {
    // From the binary inside the first image: the source tree may change between two builds
    // (and with it the binary); what must not change the image is building it again.
    let first = first_build();
    let dir = tempfile::tempdir().unwrap();
    let (_, rootfs) = unpack(&first.archive, dir.path());
    let second = build_image(Some(&rootfs.join("csi-nodekit")));
    assert_eq!(first.digest, second.digest, "image digest");
    assert_eq!(
        first.archive_sha256, second.archive_sha256,
        "archive checksum"
    );
    assert_eq!(
        std::fs::read(&first.archive).unwrap(),
        std::fs::read(&second.archive).unwrap()
    );
    assert_eq!(
        std::fs::read(&first.sbom).unwrap(),
        std::fs::read(&second.sbom).unwrap(),
        "the SBOM's bytes"
    );
}

/// A stand-in for the binary: all the build script asks of it is `--version`. Each `variant`
/// gives different bytes, and so a different image.
fn stand_in_binary(dir: &Path, variant: u32) -> PathBuf {
    let path = dir.join(format!("csi-nodekit-{variant}"));
    std::fs::write(
        &path,
        format!("#!/bin/sh\n# variant {variant}\necho csi-nodekit {VERSION}\n"),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn build_named(name: &str, binary: &Path, out: &Path) -> std::process::Output {
    Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-image.sh"))
        .env("IMAGE_TOOL", "buildah")
        .env("IMAGE_NAME", name)
        .env("IMAGE_BINARY", binary)
        .env("IMAGE_OUT", out)
        // A shell script carries no dependency list to make an SBOM from.
        .env("IMAGE_SBOM", "0")
        .output()
        .expect("run scripts/build-image.sh")
}

fn buildah(args: &[&str]) -> String {
    run(Command::new("buildah").args(args))
}

#[ignore = "needs root and buildah: builds images and a working container"]
#[test]
fn a_rebuild_moves_the_tag_and_keeps_an_old_image_that_a_container_still_uses() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the image test needs root (buildah); run the suite as README.md says"
    );
    // A name of its own: the other tests build the real image under the default name.
    let name = "localhost/csi-nodekit-rebuild-test";
    let tag = format!("{name}:{VERSION}");
    let dir = tempfile::tempdir().unwrap();
    let id_of = |reference: &str| buildah(&["images", "--quiet", "--no-trunc", reference]);

    let first = build_named(name, &stand_in_binary(dir.path(), 1), dir.path());
    assert!(first.status.success(), "{first:?}");
    let old = id_of(&tag);
    let container = "csi-nodekit-rebuild-test-container";
    buildah(&["from", "--pull=never", "--name", container, &tag]);

    let second = build_named(name, &stand_in_binary(dir.path(), 2), dir.path());
    let containers = buildah(&["containers", "--format", "{{.ContainerName}}"]);
    let images = buildah(&["images", "--all", "--quiet", "--no-trunc"]);
    let new = id_of(&tag);
    // Clean up before asserting, so a failure leaves nothing behind either.
    buildah(&["rm", container]);
    let third = build_named(name, &stand_in_binary(dir.path(), 3), dir.path());
    let after_third = buildah(&["images", "--all", "--quiet", "--no-trunc"]);
    let _ = Command::new("buildah").args(["rmi", &tag]).output();
    let _ = Command::new("buildah").args(["rmi", old.trim()]).output();

    assert!(second.status.success(), "{second:?}");
    assert_ne!(new, old, "the tag names the new image");
    assert!(
        containers.lines().any(|c| c == container),
        "the user's container survived the rebuild: {containers}"
    );
    assert!(
        images.contains(old.trim()),
        "the image the container uses is kept"
    );
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("still in use"),
        "the rebuild says why it kept the old image: {second:?}"
    );
    assert!(third.status.success(), "{third:?}");
    assert!(
        !after_third.contains(new.trim()),
        "an old image nothing uses is removed: {after_third}"
    );
}

#[test]
fn without_buildah_or_podman_the_build_script_says_what_to_install_and_installs_nothing() {
    // A PATH holding only what the script needs before it looks for a builder.
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for tool in ["dirname", "sh"] {
        let found = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{tool} on this machine"));
        std::os::unix::fs::symlink(found, bin.join(tool)).unwrap();
    }
    let output = Command::new("/bin/bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-image.sh"))
        .env_clear()
        .env("PATH", &bin)
        .env("IMAGE_BINARY", stand_in_binary(dir.path(), 1))
        .env("IMAGE_OUT", dir.path().join("out"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("neither buildah nor podman is installed")
            && stderr.contains("apt-get install buildah"),
        "{stderr}"
    );
    assert!(!dir.path().join("out").exists(), "nothing was built");

    let missing =
        Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-image.sh"))
            .env("IMAGE_TOOL", "no-such-builder")
            .env("IMAGE_BINARY", stand_in_binary(dir.path(), 1))
            .output()
            .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&missing.stderr)
            .contains("IMAGE_TOOL=no-such-builder is not installed"),
        "{missing:?}"
    );
}

#[ignore = "needs root and buildah: builds the image and runs it under chroot"]
#[test]
fn the_doctor_runs_inside_the_image_with_nothing_but_the_binary() {
    let build = first_build();
    let dir = tempfile::tempdir().unwrap();
    let (_, rootfs) = unpack(&build.archive, dir.path());
    // A kubelet root inside the image's filesystem, as `kubectl exec` finds it mounted.
    let registry = rootfs.join("var/lib/kubelet/plugins_registry");
    std::fs::create_dir_all(&registry).unwrap();
    drop(
        std::os::unix::net::UnixListener::bind(registry.join("gone.csi.example.io-reg.sock"))
            .unwrap(),
    );
    let argv = [
        "/csi-nodekit",
        "probe",
        "doctor",
        "--no-api",
        "--node-name=n1",
        "--output=json",
    ];
    let out = Command::new(chroot())
        .env_clear()
        .arg(&rootfs)
        .args(argv)
        .output()
        .expect("run chroot");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(report["kubeletRoot"]["path"], "/var/lib/kubelet");
    assert_eq!(report["kubeletRoot"]["source"], "known-location");
    assert_eq!(
        report["plugins"][0]["findings"][0]["check"],
        "registration.stale"
    );
}

#[ignore = "needs root, buildah and kubectl: builds an image of a stand-in binary"]
#[test]
fn each_build_gets_a_tag_naming_its_digest_and_manifests_that_pull_it_only_if_not_present() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the image test needs root (buildah); run the suite as README.md says"
    );
    let name = "localhost/csi-nodekit-build-tag-test";
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let output = build_named(name, &stand_in_binary(dir.path(), 7), &out);
    let _ = Command::new("buildah")
        .args(["rmi", &format!("{name}:{VERSION}")])
        .output();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    let field = |prefix: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} in {stdout}"))
            .trim()
            .to_owned()
    };
    let digest = field("digest:");
    let hex = digest.strip_prefix("sha256:").unwrap();
    let tag = format!("{name}:{VERSION}-{}", &hex[..12]);
    assert_eq!(field("tag:"), format!("{tag} (this build)"));
    // The rendered manifests run exactly this build, and pull it only when a node lacks it.
    let rendered = std::fs::read_to_string(out.join("manifests/csi-nodekit.yaml")).unwrap();
    let images: Vec<&str> = rendered
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image: "))
        .filter(|i| i.contains("csi-nodekit"))
        .collect();
    assert_eq!(
        images,
        [tag.as_str(); 4],
        "node-server, registrar, liveness-probe, the resizer's endpoint"
    );
    let lines: Vec<&str> = rendered.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.trim() == format!("image: {tag}") {
            assert_eq!(lines[i + 1].trim(), "imagePullPolicy: IfNotPresent");
        }
    }
    let doctor = std::fs::read_to_string(out.join("manifests/tools/doctor-pod.yaml")).unwrap();
    assert!(doctor.contains(&format!(
        "image: {tag}\n      imagePullPolicy: IfNotPresent"
    )));
}
