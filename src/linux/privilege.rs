//! Work done without the quota override: CAP_SYS_RESOURCE lets its holder write past a
//! project's hard limit on ext4 (XFS ignores it), and node-server, as root, holds it. A
//! restore or a clone copies data the pod chose into a volume under its limit, so the copy
//! must not carry that exemption.
//!
//! Capabilities belong to a thread, not to the process (capset(2) acts on the calling
//! thread), so the work runs on a thread of its own that gives the capability up before it
//! starts: the caller's thread and every other one keep theirs, and the thread, ending, takes
//! the dropped capability with it (it leaves the permitted set too, so nothing on it can take
//! it back). Through the `caps` crate: the maintained wrapper of capget/capset, which nix does
//! not wrap and libc only exposes as raw syscalls.

use caps::{CapSet, Capability};

/// The thread could not give the capability up; nothing was run.
#[derive(Debug, thiserror::Error)]
#[error("give up CAP_SYS_RESOURCE for a copy under the volume's limit: {0}")]
pub struct PrivilegeError(String);

/// Runs `work` on a thread without CAP_SYS_RESOURCE (effective, permitted and inheritable),
/// and returns what it returns. A panic in `work` is resumed on the caller's thread.
pub fn without_quota_override<T: Send>(
    work: impl FnOnce() -> T + Send,
) -> Result<T, PrivilegeError> {
    std::thread::scope(|scope| {
        let worker = scope.spawn(|| {
            // Effective first: the kernel keeps effective within permitted.
            for set in [CapSet::Effective, CapSet::Permitted, CapSet::Inheritable] {
                caps::drop(None, set, Capability::CAP_SYS_RESOURCE)
                    .map_err(|e| PrivilegeError(e.to_string()))?;
            }
            Ok(work())
        });
        worker
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Whether the calling thread may override quota limits now.
pub fn holds_quota_override() -> bool {
    caps::has_cap(None, CapSet::Effective, Capability::CAP_SYS_RESOURCE).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    // As root with CAP_SYS_RESOURCE (the quota VM's case
    // `root_without_cap_sys_resource_on_its_thread_stops_at_the_limit`), the kernel's own
    // answer is checked: ext4 stops the thread at the limit.
    #[test]
    fn the_work_runs_without_the_override_and_the_caller_keeps_it() {
        let before = holds_quota_override();
        let inside = without_quota_override(holds_quota_override).expect("drop");
        assert!(!inside, "the copying thread holds no CAP_SYS_RESOURCE");
        assert_eq!(
            holds_quota_override(),
            before,
            "the caller's thread is untouched"
        );
    }
}
