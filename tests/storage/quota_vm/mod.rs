//! Project quotas for real, under Debian's kernel in QEMU (this machine's kernel has no XFS
//! or ext4 quota support). One VM boots per run; inside it every case runs against
//! loop-backed XFS and ext4 filesystems and is reported here by name: the quota layer on its
//! own, and the real node-server binary driven through gRPC. Without QEMU,
//! virtme-ng or the kernel this test fails and says what to install — it never passes
//! silently.
//!
//! The same test binary plays every role, chosen by `CSI_NODEKIT_QUOTA_VM`: unset on the
//! host (boot and report), `suite` inside the VM (for the filesystem `CSI_NODEKIT_QUOTA_VM_FS` names), `case:<name>` for one case, `writer` for
//! the unprivileged writer process a case starts.

mod cases;
mod copies;
mod enforce;
mod escapes;
mod fixtures;
mod leftovers;
mod lifecycle;
mod modify;
mod reserve;
mod served;
mod through_grpc;
mod vm;

/// The environment variable that picks the role.
const ROLE: &str = "CSI_NODEKIT_QUOTA_VM";
/// The test that plays every role inside the VM, for re-invoking the binary on it alone.
const TEST_NAME: &str = "storage::quota_vm::project_quotas_hold_on_xfs_under_a_debian_kernel";

/// XFS and ext4 each boot a VM of their own, so the two run side by side (the harness runs
/// these two tests at once on two cores): the cases mostly wait, on TCG or on the quota
/// check's passes, and one VM in turn took most of CI's budget.
#[ignore = "needs root, QEMU and a Debian kernel: bash scripts/vm-kernel.sh installs them"]
#[test]
fn project_quotas_hold_on_xfs_under_a_debian_kernel() {
    match std::env::var(ROLE).as_deref() {
        Ok("suite") => vm::run_suite_inside(),
        Ok("writer") => fixtures::writer_main(),
        Ok(role) if role.starts_with("case:") => cases::run_one(&role["case:".len()..]),
        Ok(role) => panic!("unknown {ROLE}={role}"),
        Err(_) => vm::boot_and_report("xfs"),
    }
}

#[ignore = "needs root, QEMU and a Debian kernel: bash scripts/vm-kernel.sh installs them"]
#[test]
fn project_quotas_hold_on_ext4_under_a_debian_kernel() {
    // Inside the VM every role runs under the XFS test's name (TEST_NAME).
    assert!(
        std::env::var_os(ROLE).is_none(),
        "{ROLE} is for {TEST_NAME}"
    );
    vm::boot_and_report("ext4");
}
