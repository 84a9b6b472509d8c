//! Project quotas for real, under Debian's kernel in QEMU (this machine's kernel has no XFS
//! or ext4 quota support). Two VMs boot per run, one for XFS and one for ext4, side by side;
//! inside each every case runs against a loop-backed filesystem and is reported here by name:
//! the quota layer on its own, and the real node-server binary driven through gRPC. Without
//! QEMU, virtme-ng or the kernel this test fails and says what to install — it never passes
//! silently.
//!
//! The same test binary plays every role, chosen by `CSI_NODEKIT_QUOTA_VM`: unset on the
//! host (boot and report), `suite` inside a VM (the cases of the filesystem
//! `CSI_NODEKIT_QUOTA_VM_FS` names), `case:<name>` for one case, `writer` for the unprivileged
//! writer process a case starts.

mod cases;
mod copies;
mod enforce;
mod escapes;
mod fixtures;
mod grown;
mod io_limits;
mod leftovers;
mod lifecycle;
mod modify;
mod persistent;
mod power_cut;
mod reserve;
mod served;
mod through_grpc;
pub(super) mod vm;

/// The environment variable that picks the role.
const ROLE: &str = "CSI_NODEKIT_QUOTA_VM";
/// This test's name, for re-invoking the binary on it alone.
const TEST_NAME: &str =
    "booted::quota_vm::project_quotas_hold_on_xfs_and_ext4_under_a_debian_kernel";

#[ignore = "needs root, QEMU and a Debian kernel: bash scripts/vm-kernel.sh installs them"]
#[test]
fn project_quotas_hold_on_xfs_and_ext4_under_a_debian_kernel() {
    match std::env::var(ROLE).as_deref() {
        Ok("suite") => vm::run_suite_inside(),
        Ok("writer") => fixtures::writer_main(),
        Ok("power-cut") => power_cut::one_boot_inside(),
        Ok(role) if role.starts_with("case:") => cases::run_one(&role["case:".len()..]),
        Ok(role) => panic!("unknown {ROLE}={role}"),
        Err(_) => boot_both(),
    }
}

/// XFS and ext4 each boot a VM of their own, side by side, from this one test: the cases
/// mostly wait (on TCG, on the quota check's passes), one VM in turn took most of CI's budget,
/// and one test thread for both leaves the harness's other thread to the rest of the suite.
/// After its suite each filesystem has its power cuts, a VM boot per cut.
fn boot_both() {
    let only = std::env::var(cases::ONLY).unwrap_or_default();
    let vms: Vec<_> = ["xfs", "ext4"]
        .into_iter()
        .map(|fs| {
            let vm = std::thread::spawn(move || {
                let suite = (!cases::names_on(fs).is_empty())
                    .then(|| std::thread::spawn(move || vm::boot_and_report(fs)).join());
                let cuts = power_cut::selected()
                    .then(|| std::thread::spawn(move || power_cut::cut_and_check(fs)).join());
                let failed: Vec<String> = [suite, cuts]
                    .into_iter()
                    .flatten()
                    .filter_map(|run| run.err().map(|panic| panic_text(&*panic)))
                    .collect();
                assert!(failed.is_empty(), "{}", failed.join("\n\n"));
            });
            (fs, vm)
        })
        .collect();
    let failed: Vec<String> = vms
        .into_iter()
        .filter_map(|(fs, vm)| Some(format!("{fs}: {}", panic_text(&*vm.join().err()?))))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
    assert!(
        only.is_empty(),
        "{}={only}: only the cases it names ran, and passed; the whole suite was not run",
        cases::ONLY
    );
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    (panic.downcast_ref::<String>().cloned())
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}
