//! The doctor, as an operator runs it on messy nodes: a healthy node whose `/var/lib/kubelet`
//! is an absolute link (under `--host-root`, as the doctor pod runs), a registry link pointing
//! out of `--host-root` (never followed there), a directory named like a registration socket
//! (which stops every registrar: reported), and runs that cannot check — as another user, with
//! a `--host-root` or `--proc-root` that is not there — exiting 2 with the reason and no report;
//! and a report whose reader is gone before it is written (`| head`).

use std::os::unix::fs::symlink;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use super::tally::Tally;
use crate::common::doctor::{
    KubeletRoot, bait_behind_a_registry_link, base_command, behaviour, command, doctor, empty_proc,
    fake_driver, registration, stale_socket,
};
use crate::common::fake_plugin::{NodeAnswer, csi_plugin};

const D: &str = "x.csi.example.io";
const ROUNDS: usize = 3;

async fn output(mut command: Command) -> Output {
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

/// Exit 2, one line on stderr holding `reason`, no report; or what the run did instead.
fn could_not_check(out: &Output, reason: &str) -> Result<(), String> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let fine = out.status.code() == Some(2)
        && stderr.lines().count() == 1
        && stderr.contains(reason)
        && out.stdout.is_empty();
    fine.then_some(()).ok_or_else(|| {
        format!(
            "exit {:?}, stderr {stderr:?}, {} bytes of report",
            out.status.code(),
            out.stdout.len()
        )
    })
}

/// The host's `/var/lib/kubelet` → `/data/kubelet` under a `--host-root`, with a healthy plugin.
async fn linked_kubelet_root_is_healthy() -> Result<(), String> {
    let host = tempfile::tempdir().unwrap();
    let on_host = |p: &str| host.path().join(p.trim_start_matches('/'));
    std::fs::create_dir_all(on_host("/var/lib")).unwrap();
    symlink("/data/kubelet", on_host("/var/lib/kubelet")).unwrap();
    let endpoint = format!("/var/lib/kubelet/plugins/{D}/csi.sock");
    let driver_at = on_host(&format!("/data/kubelet/plugins/{D}/csi.sock"));
    let _driver = fake_driver(&driver_at, behaviour(D), NodeAnswer::new("node-a", 0, &[]));
    let reg_at = on_host(&format!("/data/kubelet/plugins_registry/{D}-reg.sock"));
    let (_reg, _) = registration(&reg_at, csi_plugin(D, &endpoint));
    let host_root = format!("--host-root={}", host.path().display());
    let out = doctor(Path::new("/var/lib/kubelet"), &[&host_root]).await;
    match (out.code, out.errors()) {
        (Some(0), errors) if errors.is_empty() => Ok(()),
        (code, errors) => Err(format!("exit {code:?}, errors {errors:?}")),
    }
}

/// A registry link to a live registration socket outside `--host-root`.
async fn link_out_of_host_root_is_not_followed() -> Result<(), String> {
    let host = tempfile::tempdir().unwrap();
    let (_outside, _bait, bait_registrar) = bait_behind_a_registry_link(host.path(), D);
    let host_root = format!("--host-root={}", host.path().display());
    let out = doctor(Path::new("/var/lib/kubelet"), &[&host_root]).await;
    let named = out.of("registry.not-socket").len() == 1;
    let called = bait_registrar.get_info_count();
    (out.code == Some(1) && named && called == 0)
        .then_some(())
        .ok_or_else(|| {
            format!(
                "exit {:?}, named {named}, bait called {called} times",
                out.code
            )
        })
}

/// A directory where a registrar would bind its socket.
async fn directory_named_like_a_socket_is_reported() -> Result<(), String> {
    let node = KubeletRoot::new();
    std::fs::create_dir(node.reg_socket(D)).unwrap();
    let out = doctor(&node.root, &[]).await;
    let saw = out.of("registry.not-socket");
    let named = saw.iter().any(|(severity, saw)| {
        severity == "error" && saw.ends_with(&format!("{D}-reg.sock is a directory, not a socket"))
    });
    (out.code == Some(1) && named)
        .then_some(())
        .ok_or_else(|| format!("exit {:?}, findings {saw:?}", out.code))
}

async fn as_nobody_exits_2() -> Result<(), String> {
    let node = KubeletRoot::new();
    stale_socket(&node.reg_socket("gone.csi.example.io"));
    let mut nobody = command(&node.root, &[]);
    nobody.uid(65534).gid(65534);
    could_not_check(&output(nobody).await, "must run as root: as uid 65534")
}

async fn missing_roots_exit_2() -> Result<(), String> {
    let node = KubeletRoot::new();
    let missing = node.root.join("no-such-dir");
    let host_root = format!("--host-root={}", missing.display());
    let reason = format!(
        "--host-root {}: No such file or directory",
        missing.display()
    );
    could_not_check(
        &output(base_command(&empty_proc(), &[&host_root])).await,
        &reason,
    )?;
    let kubelet_root = format!("--kubelet-root={}", node.root.display());
    let reason = format!(
        "--proc-root {}: No such file or directory",
        missing.display()
    );
    could_not_check(
        &output(base_command(&missing, &[&kubelet_root])).await,
        &reason,
    )
}

/// `probe doctor … | head -3`: the report's reader closes the pipe before the doctor writes.
/// The doctor stops printing and exits as it would have with the report read to the end, with
/// no panic and no backtrace.
async fn reader_gone_is_no_panic() -> Result<(), String> {
    let root = KubeletRoot::new();
    let read = output(command(&root.root, &[])).await;
    let mut gone = command(&root.root, &[]);
    gone.stdout(Stdio::piped()).stderr(Stdio::piped());
    let out = tokio::task::spawn_blocking(move || {
        let mut child = gone.spawn().unwrap();
        drop(child.stdout.take());
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let fine = out.status.code() == read.status.code() && !stderr.contains("panicked");
    fine.then_some(()).ok_or_else(|| {
        format!(
            "exit {:?} (read to the end: {:?}), stderr {stderr:?}",
            out.status.code(),
            read.status.code()
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn the_doctor_on_linked_roots_odd_registries_and_runs_it_cannot_check() {
    let mut tally = Tally::new("probe doctor on messy nodes and runs it cannot check");
    for round in 0..ROUNDS {
        let tries = [
            (
                "its reader gone before the report (`| head`): no panic, the usual exit",
                reader_gone_is_no_panic().await,
            ),
            (
                "linked /var/lib/kubelet under --host-root: healthy",
                linked_kubelet_root_is_healthy().await,
            ),
            (
                "registry link out of --host-root: not followed",
                link_out_of_host_root_is_not_followed().await,
            ),
            (
                "a directory named *-reg.sock: reported",
                directory_named_like_a_socket_is_reported().await,
            ),
            ("run as uid 65534: exit 2", as_nobody_exits_2().await),
            (
                "missing --host-root, missing --proc-root: exit 2",
                missing_roots_exit_2().await,
            ),
        ];
        for (what, result) in tries {
            let fine = result.is_ok();
            tally.check(fine, format_args!("round {round}, {what}: {result:?}"));
        }
    }
    tally.finish();
}
