//! The Linux layer under node-server and the demo: mounts, the mount table,
//! project quotas, loop devices and the tree copy engine, by syscalls and ioctls alone (the
//! image is `FROM scratch`: no `mount`, `losetup`, `xfs_quota` or `cp`). Nothing here knows
//! about CSI; errors name the operation and the path.
//!
//! - [`mount`] — bind mounts through `O_PATH` descriptors behind the [`Mounter`](mount::Mounter)
//!   trait (the real Linux implementation and a recording fake for unit tests).
//! - [`mount_options`] — the per-mount flags a bind mount can carry (`ro`, `nosuid`, …),
//!   spelled once, and a request's [`MountOptions`](mount_options::MountOptions).
//! - [`mountinfo`] — the kernel's mount table, parsed as the kernel writes it.
//! - [`mountpoint`] — what is mounted at one path, by `statx`, in O(1) (the hot paths).
//! - [`statmount`] — the mount a path lies in (device, root, mount point), by `statmount`, in
//!   O(1) on Linux 6.8+.
//! - [`quota`] — project quotas: limits, usage, the project-ID allocator, the `--quota` decision.
//! - [`loopdev`] — loop devices by ioctls: attach, recognise by inode, detach, resize.
//! - [`cgroup_io`] — a pod's cgroup v2 found by its UID under either kubelet cgroup driver,
//!   and a device's `io.max` limits written there (not wired to volumes yet).
//! - [`copy`] — directory trees and files copied with reflinks where the filesystem shares
//!   extents, sparse copies elsewhere, under crash-safe temporary names.
//! - [`extents`] — a file's extents (`FIEMAP`), walked in batches: what holds data, and
//!   where two reflinked files still share their blocks.
//! - [`dir_stack`] — the levels of a depth-first walk, at most 48 of them open: trees of any
//!   depth walked with a bounded number of descriptors.
//! - [`ext4_image`] — ext4 filesystems of a volume's own without mkfs: an empty one written
//!   from a template, grown online by the kernel; its UUID, freeze and thaw.
//! - [`inotify`] — an inotify instance for tokio: its events awaited, not polled for.
//! - [`ioprio`] — a thread's I/O (idle class) and CPU priority lowered for background work
//!   (the escape walk, removing what interrupted operations left).
//! - [`privilege`] — work on a thread of its own without CAP_SYS_RESOURCE (copies under a
//!   volume's limit).
//! - [`resolve`] — request paths resolved following only links root placed, and mount points
//!   made or removed through a parent opened without following any.

pub mod cgroup_io;
pub mod copy;
pub mod dir_stack;
pub mod ext4_image;
pub mod extents;
pub mod inotify;
pub mod ioprio;
pub mod loopdev;
pub mod mount;
pub mod mount_options;
pub mod mountinfo;
pub mod mountpoint;
pub mod privilege;
pub mod quota;
pub mod resolve;
pub mod statmount;
