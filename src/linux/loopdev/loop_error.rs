//! What can go wrong with loop devices and block-volume files, each naming the operation and
//! the device or file.

use std::path::PathBuf;

use crate::path_io::PathIoError;

#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    /// A syscall or ioctl failed.
    #[error(transparent)]
    Io(#[from] PathIoError),
    #[error("{} is not a regular file", .0.display())]
    NotARegularFile(PathBuf),
    /// The device is not one this driver attached to this file; it is left alone.
    #[error("{} is not attached by csi-nodekit to {}; left alone", device.display(), file.display())]
    NotOurs { device: PathBuf, file: PathBuf },
    /// Someone else attached this file to a writable loop device: a second writer would corrupt it.
    #[error("{} is attached to {} by someone else", file.display(), device.display())]
    ForeignDevice { device: PathBuf, file: PathBuf },
    /// Mounted, held by another driver, or open: detaching it would pull it from under its user.
    #[error("{} is in use ({reason}); not detached", device.display())]
    Busy {
        device: PathBuf,
        reason: &'static str,
    },
    #[error("no free loop device after {attempts} attempts (others kept taking them)")]
    NoFreeDevice { attempts: usize },
    /// The device node at the path is not that loop device (a stale or planted node).
    #[error("{} is not the block device {major}:{minor}", path.display())]
    WrongDeviceNode {
        path: PathBuf,
        major: u32,
        minor: u32,
    },
    #[error("{} is {size} bytes; asked for {requested}", path.display())]
    SizeMismatch {
        path: PathBuf,
        size: u64,
        requested: u64,
    },
    #[error("{} is {size} bytes; it can grow, never shrink, so not to {requested}", path.display())]
    Shrink {
        path: PathBuf,
        size: u64,
        requested: u64,
    },
    #[error("{}: {size} bytes is not a positive multiple of 512, the loop device's sector size", path.display())]
    InvalidSize { path: PathBuf, size: u64 },
}
