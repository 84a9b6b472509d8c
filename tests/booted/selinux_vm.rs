//! SELinux `context=` mounts accepted, under Debian's kernel booted with SELinux (this machine's
//! kernel has none): the guest loads Debian's reference policy (`selinux-policy-default`, from
//! this machine's `/etc/selinux`, permissive so an unlabelled guest runs) and runs
//! `node_server::selinux_mounts`'s image test, which there takes the accepted path — the label
//! on the volume's superblock, on the pod's bind, and on every file the pod makes. Without
//! QEMU, the kernel or the policy this test fails saying what to install.

use std::process::{Command, Stdio};
use std::time::Duration;

use super::quota_vm::vm::{SETUP_HINT, kernel_image, on_path, say};
use crate::node_server::selinux_mounts::{ACCEPTED, LABEL_VARIABLE};

/// The image test, run inside.
const INNER: &str = "node_server::selinux_mounts::an_image_volumes_stage_hands_the_selinux_context_to_its_filesystems_mount";
/// A file type of Debian's reference policy (it has no container module, so no
/// `container_file_t`), with an MCS pair as a container runtime gives each pod.
const DEBIAN_LABEL: &str = "system_u:object_r:svirt_image_t:s0:c12,c34";
const POLICY: &str = "/etc/selinux/default/policy/policy.33";

#[ignore = "needs root, QEMU, a Debian kernel and Debian's SELinux policy: bash scripts/vm-kernel.sh and .ci/run install them"]
#[test]
fn an_image_volume_mounted_with_an_selinux_context_labels_every_file_under_a_selinux_kernel() {
    let missing: Vec<String> = ["vng", "qemu-system-x86_64", "load_policy"]
        .iter()
        .filter(|tool| on_path(tool).is_none())
        .map(|tool| format!("{tool} not found"))
        .chain(kernel_image().err())
        .chain((!std::path::Path::new(POLICY).exists()).then(|| format!("no {POLICY}")))
        .collect();
    assert!(
        missing.is_empty(),
        "the SELinux VM test cannot run here — {}; {SETUP_HINT}, and policycoreutils and \
         selinux-policy-default",
        missing.join("; ")
    );
    let exe = std::env::current_exe().unwrap();
    let script = format!(
        "modprobe -a loop ext4 xfs && load_policy -i && echo policy-loaded \
         && {LABEL_VARIABLE}='{DEBIAN_LABEL}' '{}' --exact {INNER} --include-ignored \
         --nocapture --test-threads=1",
        exe.display()
    );
    say("SELinux VM: booting under QEMU (TCG), SELinux permissive");
    let mut vng = Command::new("vng");
    vng.arg("--run")
        .arg(kernel_image().unwrap())
        .args(["--disable-kvm", "--cpus", "1", "--memory", "512M"])
        .args(["--append", "security=selinux selinux=1 enforcing=0"])
        .args(["--exec", &format!("sh -c \"{script}\"")])
        .stdin(Stdio::null());
    let output = run_with_deadline(vng, Duration::from_secs(600));
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        text.contains("policy-loaded"),
        "the policy did not load:\n{text}"
    );
    assert!(
        text.contains("test result: ok. 1 passed"),
        "the image test failed inside:\n{text}"
    );
    assert!(
        text.contains(&format!("{ACCEPTED}: {DEBIAN_LABEL}")),
        "the test did not take the accepted path:\n{text}"
    );
    say(&format!("SELinux VM: {ACCEPTED}: {DEBIAN_LABEL}"));
}

/// Runs `command` to its end, killed if `limit` passes first.
fn run_with_deadline(mut command: Command, limit: Duration) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("start vng: {e}; {SETUP_HINT}"));
    let group = nix::unistd::Pid::from_raw(-(child.id() as i32));
    let watchdog = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(500));
            if nix::sys::signal::kill(group, None).is_err() {
                return;
            }
        }
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
    });
    let output = child.wait_with_output().expect("wait for vng");
    let _ = watchdog.join();
    output
}
