//! Loop devices for raw block volumes, through the kernel's ioctls alone (no `losetup`):
//! `LOOP_CTL_GET_FREE` + `LOOP_CONFIGURE` to attach, `LOOP_GET_STATUS64` to recognise,
//! `LOOP_CLR_FD` to detach, `LOOP_SET_CAPACITY` after the file grows; and the volume's file
//! itself ([`create_backing_file`], [`grow_backing_file`]).
//!
//! The kernel is the only record of what is attached: a device is found by the backing file's
//! identity, `(st_dev, st_ino)` as `LOOP_GET_STATUS64` reports it, never by a path (a device
//! whose file was deleted and re-created under the same name shows that name too). A node has
//! loop devices of snaps, of other drivers, of its administrator, and of the kubelet (which
//! backs one with each published block device): none of them is touched. Ours are the ones
//! whose `lo_file_name` carries [`TAG`] and that map the whole file; a device backed by our
//! file without the tag was attached by someone else and is reported, never detached.
//!
//! Detaching honestly: `LOOP_CLR_FD` on a device someone else has open does not fail, the
//! kernel just sets autoclear and detaches at the last close, which would pull the device
//! from under a volume staged again meanwhile. So [`detach`] opens the device `O_EXCL` (which
//! fails while it is mounted or held by another driver), and if the device is still bound after
//! `LOOP_CLR_FD` (another opener), it clears autoclear again and reports [`LoopError::Busy`].
//!
//! The files: `ioctl` (the kernel's structs and ioctls, typed), `device_node` (the device
//! nodes and the kernel's list of devices), `attach`, `detach`, `backing` (the volume's file);
//! [`LoopDevices`] (in `loop_seam`) puts the calls
//! node-server makes behind a trait, with a recording fake for unit tests. [`LoopError`] is in
//! `loop_error`.
//!
//! Callers serialise calls per file (node-server's per-volume lock): two concurrent
//! [`find_or_attach`] of one file could each attach a device.

mod attach;
mod backing;
mod detach;
mod device_node;
mod ioctl;
mod loop_error;
pub mod loop_seam;

use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::OFlag;

use crate::path_io::PathIoError;
pub use attach::{attach, find_or_attach};
pub use backing::{create_backing_file, create_backing_file_with, grow_backing_file};
pub use detach::{detach, flush, refresh_capacity, set_direct_io, size};
use ioctl::{LO_FLAGS_AUTOCLEAR, LO_FLAGS_DIRECT_IO, LO_FLAGS_PARTSCAN, LO_FLAGS_READ_ONLY};
pub use loop_error::LoopError;
pub use loop_seam::{KernelLoops, LoopDevices};

/// What `lo_file_name` of every device this driver attaches starts with.
pub const TAG: &str = "csi-nodekit:";

/// How often attach asks for another free device when others keep taking them.
const ATTACH_ATTEMPTS: usize = 16;
/// A device is briefly busy while udev probes it after a change; detach waits this long.
const BUSY_RETRIES: usize = 5;
const BUSY_WAIT: Duration = Duration::from_millis(20);

/// A backing file's identity: what the kernel records of it, and what a path cannot fake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Identity {
    pub dev: u64,
    pub ino: u64,
}

impl Identity {
    /// The identity of the regular file at `file` (a symlink is not followed).
    pub fn of(file: &Path) -> Result<Self, LoopError> {
        let meta = std::fs::symlink_metadata(file).map_err(PathIoError::at("stat", file))?;
        if !meta.file_type().is_file() {
            return Err(LoopError::NotARegularFile(file.to_owned()));
        }
        Ok(Self {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }
}

/// `/dev/loopN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LoopDevice(pub u32);

impl LoopDevice {
    pub fn path(self) -> PathBuf {
        device_node::path(self.0)
    }

    /// Its device number (`st_rdev` of its node, and of anything bind-mounted from it).
    pub fn rdev(self) -> u64 {
        let (major, minor) = device_node::number(self.0);
        nix::libc::makedev(major, minor)
    }
}

impl std::fmt::Display for LoopDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "/dev/loop{}", self.0)
    }
}

/// A bound loop device, as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub device: LoopDevice,
    pub backing: Identity,
    pub offset: u64,
    /// 0: the whole file.
    pub size_limit: u64,
    pub read_only: bool,
    /// Detaches at its last close (set by `LOOP_CLR_FD` on a busy device, or by its attacher).
    pub autoclear: bool,
    pub direct_io: bool,
    pub partscan: bool,
    /// The attacher's label (ours: [`TAG`] and the end of the file's path).
    pub file_name: String,
}

impl Status {
    fn from_info(device: LoopDevice, info: &ioctl::LoopInfo64) -> Self {
        let name = &info.lo_file_name;
        let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        Self {
            device,
            backing: Identity {
                dev: info.lo_device,
                ino: info.lo_inode,
            },
            offset: info.lo_offset,
            size_limit: info.lo_sizelimit,
            read_only: info.lo_flags & LO_FLAGS_READ_ONLY != 0,
            autoclear: info.lo_flags & LO_FLAGS_AUTOCLEAR != 0,
            direct_io: info.lo_flags & LO_FLAGS_DIRECT_IO != 0,
            partscan: info.lo_flags & LO_FLAGS_PARTSCAN != 0,
            file_name: String::from_utf8_lossy(&name[..len]).into_owned(),
        }
    }

    /// Attached by this driver to the whole of the file with `identity`.
    pub fn is_ours_for(&self, identity: Identity) -> bool {
        self.backing == identity
            && self.offset == 0
            && self.size_limit == 0
            && self.file_name.starts_with(TAG)
    }
}

/// How to attach.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttachOptions {
    /// The device refuses writes (and the file is opened read-only).
    pub read_only: bool,
    /// Ask for direct I/O: no second page cache for the data, which the backing filesystem
    /// already caches. Falls back to buffered I/O where the backing file cannot do it (tmpfs).
    pub direct_io: bool,
    /// Logical block size; 0 lets the kernel choose (512, or the backing disk's with direct I/O).
    pub block_size: u32,
}

/// The loop devices backed by one file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    pub ours: Vec<Status>,
    /// Backed by the same inode, attached by someone else.
    pub foreign: Vec<Status>,
}

/// The status of `device`; `None` if it is not bound (or does not exist).
pub fn status(device: LoopDevice) -> Result<Option<Status>, LoopError> {
    let file = match device_node::open_device(device.0, OFlag::O_RDONLY) {
        Ok(file) => file,
        Err(e) if device_node::is_gone(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    match ioctl::get_status(file.as_fd()) {
        Ok(info) => Ok(Some(Status::from_info(device, &info))),
        Err(Errno::ENXIO) => Ok(None),
        Err(e) => Err(
            PathIoError::errno_at("get status (LOOP_GET_STATUS64) of", &device.path())(e).into(),
        ),
    }
}

/// The loop devices backed by the file at `file`.
pub fn find(file: &Path) -> Result<Found, LoopError> {
    find_backed_by(Identity::of(file)?)
}

/// The loop devices backed by the inode `identity` (for a file already deleted, say).
pub fn find_backed_by(identity: Identity) -> Result<Found, LoopError> {
    let mut found = Found::default();
    for n in device_node::bound()? {
        let Some(status) = status(LoopDevice(n))? else {
            continue;
        };
        if status.is_ours_for(identity) {
            found.ours.push(status);
        } else if status.backing == identity {
            found.foreign.push(status);
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(dev: u64, ino: u64, name: &str) -> ioctl::LoopInfo64 {
        let mut info = ioctl::LoopInfo64 {
            lo_device: dev,
            lo_inode: ino,
            ..Default::default()
        };
        info.lo_file_name[..name.len()].copy_from_slice(name.as_bytes());
        info
    }

    #[test]
    fn a_device_is_ours_only_when_tagged_backed_by_the_inode_and_mapping_the_whole_file() {
        let id = Identity { dev: 2049, ino: 77 };
        let ours = info(2049, 77, "csi-nodekit:/state/volumes/v1");
        assert!(Status::from_info(LoopDevice(3), &ours).is_ours_for(id));
        let cases = [
            (
                "another inode",
                info(2049, 78, "csi-nodekit:/state/volumes/v1"),
            ),
            (
                "another filesystem",
                info(2050, 77, "csi-nodekit:/state/volumes/v1"),
            ),
            ("losetup's label", info(2049, 77, "/state/volumes/v1")),
            (
                "an offset",
                ioctl::LoopInfo64 {
                    lo_offset: 512,
                    ..ours
                },
            ),
            (
                "a size limit",
                ioctl::LoopInfo64 {
                    lo_sizelimit: 4096,
                    ..ours
                },
            ),
        ];
        for (what, info) in cases {
            assert!(
                !Status::from_info(LoopDevice(3), &info).is_ours_for(id),
                "{what}"
            );
        }
    }
}
