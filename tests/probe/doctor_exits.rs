//! What the doctor's exit code says, run as a real process: 1 only for a node it checked and
//! found errors on (the report says why, with no error line of its own), 2 with the reason
//! when it could not check at all — not root, a `--host-root` or `--proc-root` that is not
//! there, a registry it cannot list — and then no report, which would read as a diagnosis.

use crate::common;

use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};

use common::doctor::{KubeletRoot, base_command, command, doctor, empty_proc, stale_socket};

async fn output(mut command: Command) -> Output {
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

/// Exit 2, one line on stderr holding `reason`, nothing on stdout.
fn could_not_check(out: &Output, reason: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(reason), "{reason:?} in {stderr}");
    assert!(out.stdout.is_empty(), "a report was printed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn a_node_with_errors_exits_1_with_the_report_and_no_failure_line() {
    let node = KubeletRoot::new();
    stale_socket(&node.reg_socket("gone.csi.example.io"));
    let out = doctor(&node.root, &[]).await;
    assert_eq!(out.code, Some(1));
    assert_eq!(out.errors(), ["registration.stale"]);
    assert!(!out.stderr.contains("failed"), "{}", out.stderr);
    assert!(!out.stderr.contains("E1"), "an error line: {}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn a_host_root_or_proc_root_that_is_not_there_exits_2_naming_it() {
    let node = KubeletRoot::new();
    let missing = node.root.join("no-such-dir");
    let host_root = format!("--host-root={}", missing.display());
    could_not_check(
        &output(base_command(&empty_proc(), &[&host_root])).await,
        &format!(
            "--host-root {}: No such file or directory",
            missing.display()
        ),
    );
    let kubelet_root = format!("--kubelet-root={}", node.root.display());
    could_not_check(
        &output(base_command(&missing, &[&kubelet_root])).await,
        &format!(
            "--proc-root {}: No such file or directory",
            missing.display()
        ),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: to run the doctor as another user"]
async fn as_another_user_it_exits_2_instead_of_calling_a_broken_node_healthy() {
    let node = KubeletRoot::new();
    stale_socket(&node.reg_socket("gone.csi.example.io"));
    let mut nobody = command(&node.root, &[]);
    nobody.uid(65534).gid(65534);
    could_not_check(&output(nobody).await, "must run as root: as uid 65534");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and setpriv: root without the capabilities that bypass permissions"]
async fn a_registry_it_cannot_list_exits_2_naming_it() {
    let node = KubeletRoot::new();
    stale_socket(&node.reg_socket("gone.csi.example.io"));
    let registry = node.registry();
    std::os::unix::fs::chown(&registry, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(
        &registry,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    // Still uid 0, but without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH: as a doctor pod
    // whose securityContext drops them.
    let doctor = command(&node.root, &[]);
    let mut unprivileged = Command::new("setpriv");
    unprivileged
        .args([
            "--inh-caps=-dac_override,-dac_read_search",
            "--bounding-set=-dac_override,-dac_read_search",
            "--",
        ])
        .arg(doctor.get_program())
        .args(doctor.get_args());
    could_not_check(
        &output(unprivileged).await,
        &format!("cannot list {}: Permission denied", registry.display()),
    );
}
