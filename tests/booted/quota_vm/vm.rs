//! The VM itself: on the host, boot Debian's kernel once under QEMU (virtme-ng, the host's
//! root filesystem shared read-only) and report every case by name; inside it, run each
//! case as a child process and print one protocol line per result.
//!
//! Protocol (guest stdout, one line each): `quota-vm: boot <guest uptime s>`,
//! `quota-vm: test <name> ok|FAILED <ms>`, `quota-vm: | <output line of a failed case>`,
//! `quota-vm: figure <text>`, `quota-vm: done`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{ROLE, TEST_NAME, cases};

/// How long the whole VM run may take before it is killed (CI's budget is 30 minutes).
const VM_DEADLINE: Duration = Duration::from_secs(25 * 60);
/// How long one case may take inside the VM.
const CASE_DEADLINE: Duration = Duration::from_secs(240);

pub(in crate::booted) const SETUP_HINT: &str = "`bash scripts/vm-kernel.sh` installs qemu-system-x86, busybox-static, \
     kmod, udev, xfsprogs, e2fsprogs, virtme-ng and the pinned Debian kernel";

/// Writes straight to stderr, past libtest's capture, so progress shows while the VM runs.
pub fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Finds a tool on PATH or in the sbin directories (the guest's PATH has them).
pub(in crate::booted) fn on_path(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(tool))
        .find(|candidate| candidate.is_file())
}

/// The kernel image `scripts/vm-kernel.sh` unpacked.
pub(in crate::booted) fn kernel_image() -> Result<PathBuf, String> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let boot = target.join("vm/kernel/boot");
    let image = std::fs::read_dir(&boot)
        .map_err(|e| format!("{}: {e}", boot.display()))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
        .ok_or_else(|| format!("no vmlinuz-* in {}", boot.display()))?;
    image
        .canonicalize()
        .map_err(|e| format!("{}: {e}", image.display()))
}

/// On the host: boot a VM for the cases on `fs`, relay its results, fail with every failed
/// case's output.
pub fn boot_and_report(fs: &str) {
    let only = std::env::var(cases::ONLY).unwrap_or_default();
    assert!(
        only.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_:,".contains(c)),
        "{}={only:?}: words of case names only",
        cases::ONLY
    );
    let run = boot(
        &format!("quota VM ({fs})"),
        &[(cases::ONLY, &only), (cases::FS, fs), (ROLE, "suite")],
        &[],
    );
    let report = &run.report;
    for figure in &report.figures {
        say(&format!("quota VM figure: {figure}"));
    }
    let overshoots = report.figures.iter().filter_map(|f| {
        let (_, rest) = f.split_once("overshoot=")?;
        rest.split(' ').next()?.parse::<i64>().ok()
    });
    if let Some(largest) = overshoots.max() {
        say(&format!(
            "quota VM figure: largest overshoot past a limit: {largest} bytes"
        ));
    }
    let expected = cases::names_on(fs);
    let missing: Vec<&String> = expected
        .iter()
        .filter(|n| !report.results.iter().any(|(r, _)| r == *n))
        .collect();
    let failed: Vec<&(String, bool)> = report.results.iter().filter(|(_, ok)| !ok).collect();
    let passed = report.results.len() - failed.len();
    say(&format!(
        "quota VM ({fs}): {passed} passed, {} failed, {} not run",
        failed.len(),
        missing.len()
    ));
    if failed.is_empty() && missing.is_empty() && run.succeeded() {
        return;
    }
    panic!(
        "quota VM run failed: failed {:?}, not run {:?}\n{}",
        failed.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        missing,
        run.explain()
    );
}

/// One boot of the VM, seen from the host.
pub struct Boot {
    pub report: Report,
    pub status: std::process::ExitStatus,
    pub timed_out: bool,
    pub output: String,
    pub vng_stderr: String,
}

impl Boot {
    /// The VM exited by itself, with success, before the deadline.
    pub fn succeeded(&self) -> bool {
        self.status.success() && !self.timed_out
    }

    /// Everything the guest and vng said, for a failure's message.
    pub fn explain(&self) -> String {
        format!(
            "vng {}{}\n--- failed cases' output ---\n{}\n--- guest output ---\n{}--- vng stderr ---\n{}",
            self.status,
            if self.timed_out {
                ", killed at the deadline"
            } else {
                ""
            },
            self.report.failure_output,
            self.output,
            self.vng_stderr
        )
    }
}

/// Boots the test binary under Debian's kernel with `env` set for it inside, and `disks`
/// (`name=path`) attached as virtio-scsi disks; relays progress as it comes.
pub fn boot(label: &str, env: &[(&str, &str)], disks: &[String]) -> Boot {
    let missing: Vec<String> = [
        "vng",
        "qemu-system-x86_64",
        "busybox",
        "mkfs.xfs",
        "mkfs.ext4",
    ]
    .iter()
    .filter(|tool| on_path(tool).is_none())
    .map(|tool| format!("{tool} not found on PATH"))
    .chain(kernel_image().err())
    .collect();
    assert!(
        missing.is_empty(),
        "the quota VM test cannot run on this machine — {}; {SETUP_HINT}",
        missing.join("; ")
    );
    let kernel = kernel_image().unwrap();
    let exe = std::env::current_exe().expect("current exe");
    let env: String = env.iter().map(|(k, v)| format!("{k}='{v}' ")).collect();
    let inner = format!(
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin {env}'{}' --exact {TEST_NAME} --include-ignored --nocapture --test-threads=1",
        exe.display()
    );
    let mut vng = Command::new("vng");
    vng.arg("--run")
        .arg(&kernel)
        .args([
            // These machines' /dev/kvm is nested virtualisation: it opens and creates VMs, but
            // a guest under it made no progress in 3 minutes at 100% system time (tried
            // 2026-12-04), where TCG runs the whole suite in about 11.
            "--disable-kvm",
            "--cpus",
            "1",
            "--memory",
            "512M",
            "--exec",
            &inner,
        ])
        .args(disks.iter().flat_map(|d| ["--disk", d.as_str()]))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    say(&format!(
        "{label}: booting {} under QEMU (TCG)",
        kernel.display()
    ));
    let started = Instant::now();
    let mut child = vng
        .spawn()
        .unwrap_or_else(|e| panic!("start vng: {e}; {SETUP_HINT}"));
    let pgid = child.id() as i32;
    let stderr = child.stderr.take().expect("stderr");
    let err_thread = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    // Kill the whole process group (vng and its qemu) if the deadline passes.
    let watchdog = std::thread::spawn(move || {
        let deadline = Instant::now() + VM_DEADLINE;
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(500));
            if nix::sys::signal::kill(nix::unistd::Pid::from_raw(-pgid), None).is_err() {
                return false;
            }
        }
        let _ =
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(-pgid), nix::sys::signal::SIGKILL);
        true
    });
    let mut report = Report::default();
    let mut output = String::new();
    for line in BufReader::new(child.stdout.take().expect("stdout"))
        .lines()
        .map_while(Result::ok)
    {
        output.push_str(&line);
        output.push('\n');
        report.take(&line, started.elapsed());
    }
    let status = child.wait().expect("wait for vng");
    let timed_out = watchdog.join().unwrap_or(false);
    let vng_stderr = err_thread.join().unwrap_or_default();
    say(&format!(
        "{label}: boot {} (host, to the first line from inside; guest uptime {}), whole run {:.1} s",
        report
            .boot_host
            .map_or("?".into(), |d| format!("{:.1} s", d.as_secs_f64())),
        report.boot_guest.as_deref().unwrap_or("?"),
        started.elapsed().as_secs_f64()
    ));
    Boot {
        report,
        status,
        timed_out,
        output,
        vng_stderr,
    }
}

/// What the guest reported.
#[derive(Default)]
pub struct Report {
    boot_host: Option<Duration>,
    boot_guest: Option<String>,
    pub results: Vec<(String, bool)>,
    pub figures: Vec<String>,
    failure_output: String,
    pub done: bool,
}

impl Report {
    fn take(&mut self, line: &str, at: Duration) {
        // libtest prints "test … ... " before the first line of output, on the same line.
        let Some((_, rest)) = line.trim_end_matches('\r').split_once("quota-vm: ") else {
            return;
        };
        if let Some(uptime) = rest.strip_prefix("boot ") {
            self.boot_host = Some(at);
            self.boot_guest = Some(format!("{uptime} s"));
        } else if let Some(test) = rest.strip_prefix("test ") {
            let mut words = test.split(' ');
            let (name, verdict, ms) = (
                words.next().unwrap_or(""),
                words.next().unwrap_or(""),
                words.next().unwrap_or("?"),
            );
            say(&format!("quota VM: {name} ... {verdict} ({ms} ms)"));
            self.results.push((name.to_owned(), verdict == "ok"));
        } else if let Some(out) = rest.strip_prefix("| ") {
            self.failure_output.push_str(out);
            self.failure_output.push('\n');
        } else if let Some(figure) = rest.strip_prefix("figure ") {
            self.figures.push(figure.to_owned());
        } else if rest == "done" {
            self.done = true;
        }
    }
}

/// Inside the VM: load the modules, run every case in its own process, print the protocol.
pub fn run_suite_inside() {
    let uptime = std::fs::read_to_string("/proc/uptime").unwrap_or_default();
    println!("quota-vm: boot {}", uptime.split(' ').next().unwrap_or("?"));
    let modprobe = Command::new("modprobe")
        .args(["-a", "loop", "xfs", "ext4", "quota_v2"])
        .output();
    match modprobe {
        Ok(out) if out.status.success() => {}
        other => panic!("modprobe loop xfs ext4 quota_v2 failed: {other:?}"),
    }
    let exe = std::env::current_exe().expect("current exe");
    let mut failed = Vec::new();
    for name in cases::names() {
        let started = Instant::now();
        let (ok, text) = run_case(&exe, &name);
        let ms = started.elapsed().as_millis();
        println!(
            "quota-vm: test {name} {} {ms}",
            if ok { "ok" } else { "FAILED" }
        );
        for line in text.lines() {
            if let Some((_, figure)) = line.split_once("quota-vm-figure: ") {
                println!("quota-vm: figure {figure}");
            } else if !ok {
                println!("quota-vm: | {line}");
            }
        }
        if !ok {
            failed.push(name);
        }
    }
    println!("quota-vm: done");
    assert!(failed.is_empty(), "failed inside the VM: {failed:?}");
}

/// Runs one case as a child process; its verdict and its whole output.
fn run_case(exe: &Path, name: &str) -> (bool, String) {
    let child = Command::new(exe)
        .args([
            "--exact",
            TEST_NAME,
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, format!("case:{name}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let child = match child {
        Ok(child) => child,
        Err(e) => return (false, format!("spawn {}: {e}", exe.display())),
    };
    let pid = child.id() as i32;
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let out = child.wait_with_output();
        let _ = done_tx.send(());
        out
    });
    let timed_out = done_rx.recv_timeout(CASE_DEADLINE).is_err();
    if timed_out {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
    }
    match waiter.join() {
        Ok(Ok(out)) => {
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            if timed_out {
                text.push_str(&format!("killed after {CASE_DEADLINE:?}\n"));
            }
            (out.status.success() && !timed_out, text)
        }
        other => (false, format!("waiting for the case failed: {other:?}")),
    }
}
