//! How the doctor finds the kubelet's root — a kubelet's `--root-dir` in a staged `/proc`
//! (kubelet, MicroK8s' kubelite), known locations under `--host-root` — and what follows from
//! the kubelet it finds: sockets in another root's registry, and the permissions of a kubelet
//! that does not run as root.

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use common::doctor::{KubeletRoot, base_command, fake_plugin, registration, run};
use common::fake_plugin::csi_plugin;

/// A process in a staged `/proc`: its argv, environment and `Uid:` line.
fn process(proc_root: &Path, pid: u32, argv: &[&str], environ: &[&str], uid: u32) {
    let dir = proc_root.join(pid.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let nul = |items: &[&str]| items.iter().map(|a| format!("{a}\0")).collect::<String>();
    std::fs::write(dir.join("cmdline"), nul(argv)).unwrap();
    std::fs::write(dir.join("environ"), nul(environ)).unwrap();
    let status = format!(
        "Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t{uid}\t{uid}\t{uid}\nGroups:\t\n"
    );
    std::fs::write(dir.join("status"), status).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn the_running_kubelets_root_dir_is_found_in_proc() {
    let node = KubeletRoot::new();
    let _plugin = fake_plugin(&node, "x.csi.example.io");
    let procs = tempfile::tempdir().unwrap();
    process(procs.path(), 1, &["/sbin/init"], &[], 0);
    let root_flag = format!("--root-dir={}", node.root.display());
    process(
        procs.path(),
        812,
        &["/usr/bin/kubelet", "--v=2", &root_flag],
        &[],
        0,
    );
    let out = run(base_command(procs.path(), &[])).await;
    assert_eq!(out.code, Some(0), "{:#}", out.report);
    assert_eq!(
        out.report["kubeletRoot"]["path"],
        node.root.display().to_string()
    );
    assert_eq!(out.report["kubeletRoot"]["source"], "process");
    assert_eq!(
        out.report["kubeletRoot"]["reason"],
        "--root-dir of kubelet (pid 812)"
    );
    assert_eq!(out.report["summary"]["plugins"], 1);

    // Told otherwise, the doctor follows the flag and says that the kubelet disagrees.
    let other = tempfile::tempdir().unwrap();
    std::fs::create_dir(other.path().join("plugins_registry")).unwrap();
    let flag = format!("--kubelet-root={}", other.path().display());
    let out = run(base_command(procs.path(), &[&flag])).await;
    let mismatch = out.of("root.mismatch");
    assert_eq!(mismatch[0].0, "warning");
    assert!(
        mismatch[0]
            .1
            .contains(&format!("the running kubelet uses {}", node.root.display())),
        "{mismatch:?}"
    );
}

/// A host filesystem under a temporary `--host-root`.
struct HostFs {
    dir: tempfile::TempDir,
}

impl HostFs {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn path(&self, host_path: &str) -> PathBuf {
        self.dir.path().join(host_path.trim_start_matches('/'))
    }
    fn flag(&self) -> String {
        format!("--host-root={}", self.dir.path().display())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn microk8s_sockets_in_the_default_root_are_an_error_naming_the_kubelets_root() {
    let host = HostFs::new();
    let microk8s = "/var/snap/microk8s/common/var/lib/kubelet";
    std::fs::create_dir_all(host.path(&format!("{microk8s}/plugins_registry"))).unwrap();
    let args = host.path("/var/snap/microk8s/current/args/kubelet");
    std::fs::create_dir_all(args.parent().unwrap()).unwrap();
    std::fs::write(&args, "--kubeconfig=${SNAP_DATA}/credentials/kubelet.config\n--root-dir=${SNAP_COMMON}/var/lib/kubelet\n").unwrap();
    let procs = tempfile::tempdir().unwrap();
    let environ = [
        "SNAP_COMMON=/var/snap/microk8s/common",
        "SNAP_DATA=/var/snap/microk8s/123",
    ];
    process(
        procs.path(),
        4000,
        &["/snap/microk8s/123/kubelite"],
        &environ,
        0,
    );
    // A DaemonSet written for /var/lib/kubelet: its registrar's socket lands where no kubelet looks.
    let wrong = host.path("/var/lib/kubelet/plugins_registry/x.csi.example.io-reg.sock");
    let endpoint = "/var/lib/kubelet/plugins/x.csi.example.io/csi.sock";
    let (_reg, _) = registration(&wrong, csi_plugin("x.csi.example.io", endpoint));
    let out = run(base_command(procs.path(), &[&host.flag()])).await;
    assert_eq!(out.code, Some(1), "{:#}", out.report);
    assert_eq!(out.report["kubeletRoot"]["path"], microk8s);
    assert_eq!(
        out.report["kubeletRoot"]["reason"],
        "--root-dir of kubelite (pid 4000)"
    );
    let other = out.of("root.other-registry");
    assert!(
        other[0].1.starts_with(
            "/var/lib/kubelet/plugins_registry has registration sockets (x.csi.example.io-reg.sock)"
        ),
        "{other:?}"
    );
    assert_eq!(out.errors(), ["root.other-registry"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn without_a_visible_kubelet_a_known_location_is_used_and_said_so() {
    let host = HostFs::new();
    std::fs::create_dir_all(host.path("/var/lib/k0s/kubelet/plugins_registry")).unwrap();
    let procs = tempfile::tempdir().unwrap();
    process(procs.path(), 1, &["/pause"], &[], 0);
    let out = run(base_command(procs.path(), &[&host.flag()])).await;
    assert_eq!(out.code, Some(0), "{:#}", out.report);
    assert_eq!(out.report["kubeletRoot"]["path"], "/var/lib/k0s/kubelet");
    assert_eq!(out.report["kubeletRoot"]["source"], "known-location");
    let reason = out.report["kubeletRoot"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("hostPID") && reason.ends_with("(k0s)"),
        "{reason}"
    );

    let empty = HostFs::new();
    let out = run(base_command(procs.path(), &[&empty.flag()])).await;
    assert_eq!(out.code, Some(1));
    assert_eq!(out.errors(), ["root.not-found"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn a_kubelet_that_is_not_root_is_checked_for_the_permissions_it_needs() {
    let node = KubeletRoot::new();
    let open = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    open(&node.root, 0o755); // a tempdir is 0700
    let plugin = fake_plugin(&node, "x.csi.example.io");
    open(&plugin.registration.socket, 0o777);
    open(&plugin.driver.socket, 0o777);
    let closed = plugin.driver.socket.parent().unwrap().to_owned();
    open(&closed, 0o700);
    let procs = tempfile::tempdir().unwrap();
    let root_flag = format!("--root-dir={}", node.root.display());
    process(procs.path(), 812, &["kubelet", &root_flag], &[], 4242);
    let out = run(base_command(procs.path(), &[])).await;
    assert_eq!(out.code, Some(1), "{:#}", out.report);
    assert_eq!(out.errors(), ["endpoint.permissions"]);
    let (_, saw) = &out.of("endpoint.permissions")[0];
    let owner = std::fs::metadata(&closed).unwrap();
    assert_eq!(
        saw,
        &format!(
            "kubelet (pid 812) runs as UID 4242 (groups 4242) and cannot pass: directory {} is \
             mode 0700, owner {}:{}",
            closed.display(),
            owner.uid(),
            owner.gid()
        )
    );
    // The same node with a root kubelet: nothing to say.
    process(procs.path(), 812, &["kubelet", &root_flag], &[], 0);
    assert_eq!(run(base_command(procs.path(), &[])).await.code, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn with_several_kubelets_each_ones_user_is_checked_and_each_blocked_one_is_named() {
    let node = KubeletRoot::new();
    let open = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    open(&node.root, 0o755); // a tempdir is 0700
    let plugin = fake_plugin(&node, "x.csi.example.io");
    open(&plugin.registration.socket, 0o777);
    // The driver socket is open to its group only: a kubelet in that group passes.
    let group = 5151;
    std::os::unix::fs::lchown(&plugin.driver.socket, None, Some(group)).unwrap();
    open(&plugin.driver.socket, 0o770);
    let procs = tempfile::tempdir().unwrap();
    let root_flag = format!("--root-dir={}", node.root.display());
    let argv = ["kubelet", root_flag.as_str()];
    process(procs.path(), 700, &argv, &[], 0);
    process(procs.path(), 800, &argv, &[], group);
    process(procs.path(), 900, &argv, &[], 4242);
    process(procs.path(), 950, &argv, &[], 4343);
    let out = run(base_command(procs.path(), &[])).await;
    assert_eq!(out.code, Some(1), "{:#}", out.report);
    let blocked = out.of("endpoint.permissions");
    let socket = plugin.driver.socket.display();
    let saw: Vec<&str> = blocked.iter().map(|(_, saw)| saw.as_str()).collect();
    assert_eq!(
        saw,
        [
            format!(
                "kubelet (pid 900) runs as UID 4242 (groups 4242) and cannot pass: socket \
                 {socket} is mode 0770, owner 0:{group}"
            ),
            format!(
                "kubelet (pid 950) runs as UID 4343 (groups 4343) and cannot pass: socket \
                 {socket} is mode 0770, owner 0:{group}"
            ),
        ],
        "the root kubelet and the one in the socket's group pass, each other is named"
    );
    assert!(
        out.of("registration.permissions").is_empty(),
        "{:#}",
        out.report
    );
    // A kubelet with another root does not dial these sockets: it is not checked.
    process(
        procs.path(),
        950,
        &["kubelet", "--root-dir=/elsewhere"],
        &[],
        4343,
    );
    let out = run(base_command(procs.path(), &[])).await;
    let blocked = out.of("endpoint.permissions");
    assert_eq!(blocked.len(), 1, "{blocked:?}");
    assert!(
        blocked[0].1.starts_with("kubelet (pid 900) "),
        "{blocked:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn several_kubelets_are_each_listed_with_their_root_and_the_one_checked_said() {
    let node = KubeletRoot::new();
    let _plugin = fake_plugin(&node, "x.csi.example.io");
    let procs = tempfile::tempdir().unwrap();
    let root_flag = format!("--root-dir={}", node.root.display());
    process(procs.path(), 700, &["/usr/bin/kubelet", &root_flag], &[], 0);
    process(procs.path(), 900, &["/usr/local/bin/kubelet"], &[], 0);
    let out = run(base_command(procs.path(), &[])).await;
    let several = out.of("root.several-kubelets");
    assert_eq!(several.len(), 1, "{:#}", out.report);
    assert_eq!(several[0].0, "warning");
    assert_eq!(
        several[0].1,
        format!(
            "2 kubelet processes run: kubelet (pid 700, root {}); kubelet (pid 900, root \
             /var/lib/kubelet)",
            node.root.display()
        )
    );
    let finding = out.report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "root.several-kubelets")
        .unwrap();
    let means = finding["means"].as_str().unwrap();
    assert!(
        means.ends_with(&format!(
            "the doctor checks {}, not /var/lib/kubelet",
            node.root.display()
        )),
        "{means}"
    );
    assert!(
        finding["fix"]
            .as_str()
            .unwrap()
            .ends_with("run the doctor again with --kubelet-root=/var/lib/kubelet"),
        "{finding}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn a_kubelet_root_under_a_prefix_gets_the_host_root_hint_not_a_registrar_fix() {
    // The host's / seen at a prefix, and --kubelet-root given with it instead of --host-root.
    let host = tempfile::tempdir().unwrap();
    let microk8s = "/var/snap/microk8s/common/var/lib/kubelet";
    let under = |p: &str| host.path().join(p.trim_start_matches('/'));
    let endpoint = format!("{microk8s}/plugins/x.csi.example.io/csi.sock");
    let _driver = common::doctor::fake_driver(
        &under(&endpoint),
        common::doctor::behaviour("x.csi.example.io"),
        common::fake_plugin::NodeAnswer::new("node-a", 0, &[]),
    );
    let reg = format!("{microk8s}/plugins_registry/x.csi.example.io-reg.sock");
    let (_reg, _) = registration(&under(&reg), csi_plugin("x.csi.example.io", &endpoint));
    let given = format!("--kubelet-root={}", under(microk8s).display());
    let out = run(base_command(&common::doctor::empty_proc(), &[&given])).await;
    let prefixed = out.of("root.prefixed");
    assert_eq!(prefixed.len(), 1, "{:#}", out.report);
    assert_eq!(
        prefixed[0].1,
        format!(
            "--kubelet-root {} is the host's {microk8s} seen under {}",
            under(microk8s).display(),
            host.path().display()
        )
    );
    let text = out.report.to_string();
    assert!(
        text.contains(&format!(
            "run the doctor with --host-root={} --kubelet-root={microk8s} instead",
            host.path().display()
        )),
        "{text}"
    );
    assert!(
        !text.contains("pass that to the registrar"),
        "a fix that would break the driver: {text}"
    );
    let endpoint_hint = out.of("endpoint.under-prefix");
    assert_eq!(endpoint_hint.len(), 1, "{:#}", out.report);
    assert_eq!(endpoint_hint[0].0, "warning");
    assert!(out.of("endpoint.missing").is_empty(), "{:#}", out.report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn a_skipped_api_comparison_is_stated_with_the_reason() {
    let node = KubeletRoot::new();
    let _plugin = fake_plugin(&node, "x.csi.example.io");
    let out = common::doctor::doctor(&node.root, &[]).await;
    assert_eq!(out.code, Some(0), "{:#}", out.report);
    let skipped = out.of("api.skipped");
    assert_eq!(skipped.len(), 1, "{:#}", out.report);
    assert_eq!(skipped[0].0, "info");
    let finding = out.report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "api.skipped")
        .unwrap();
    assert_eq!(
        finding["means"],
        "the Kubernetes API was not read: --no-api was given"
    );
}
