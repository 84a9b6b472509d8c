//! What needs a kernel other than this machine's, booted under QEMU: `quota_vm`, project
//! quotas on XFS and ext4 under Debian's kernel (this machine's has no XFS or ext4 quota
//! support), the real node-server driven through gRPC inside, and its power cuts; `selinux_vm`,
//! the same kernel booted with SELinux and Debian's reference policy, for `context=` mounts.
//!
//! The folder's name sorts before every other area's on purpose: libtest starts tests in the
//! order of their names, and this one runs about eleven minutes, mostly waiting on its guests,
//! so it starts first and the rest of the suite runs beside it instead of after it.

mod quota_vm;
mod selinux_vm;
