//! Detaching only what is ours and not in use, refreshing capacity, reading sizes.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;

use super::ioctl::{self, LO_FLAGS_AUTOCLEAR};
use super::loop_error::LoopError;
use super::{BUSY_RETRIES, BUSY_WAIT, Identity, LoopDevice, Status, device_node};
use crate::path_io::PathIoError;

/// Opens `device` and proves it ours for `identity`; `None` if it is not bound.
fn open_ours(
    device: LoopDevice,
    file: &Path,
    identity: Identity,
    flags: OFlag,
) -> Result<Option<File>, LoopError> {
    let dev = match device_node::open_device(device.0, flags) {
        Ok(dev) => dev,
        Err(e) if device_node::is_gone(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    let info = match ioctl::get_status(dev.as_fd()) {
        Ok(info) => info,
        Err(Errno::ENXIO) => return Ok(None),
        Err(e) => {
            return Err(
                PathIoError::errno_at("get status (LOOP_GET_STATUS64) of", &device.path())(e)
                    .into(),
            );
        }
    };
    if !Status::from_info(device, &info).is_ours_for(identity) {
        return Err(LoopError::NotOurs {
            device: device.path(),
            file: file.to_owned(),
        });
    }
    Ok(Some(dev))
}

enum Detach {
    Done,
    Busy(&'static str),
}

/// Detaches `device` if it is ours for `file`; a device not bound is already detached.
/// [`LoopError::NotOurs`] for anyone else's device; [`LoopError::Busy`] while it is mounted,
/// held or open, with the device left as it was.
pub fn detach(device: LoopDevice, file: &Path) -> Result<(), LoopError> {
    let identity = Identity::of(file)?;
    for attempt in 1..=BUSY_RETRIES {
        match detach_once(device, file, identity)? {
            Detach::Done => {
                log::info!("detached {device} from {}", file.display());
                return Ok(());
            }
            Detach::Busy(reason) if attempt == BUSY_RETRIES => {
                return Err(LoopError::Busy {
                    device: device.path(),
                    reason,
                });
            }
            Detach::Busy(_) => std::thread::sleep(BUSY_WAIT),
        }
    }
    unreachable!("the last attempt returns")
}

fn detach_once(device: LoopDevice, file: &Path, identity: Identity) -> Result<Detach, LoopError> {
    let path = device.path();
    let dev = match open_ours(device, file, identity, OFlag::O_RDONLY | OFlag::O_EXCL) {
        Ok(Some(dev)) => dev,
        Ok(None) => return Ok(Detach::Done),
        Err(LoopError::Io(e)) if e.raw_os_error() == Some(nix::libc::EBUSY) => {
            return Ok(Detach::Busy("mounted or held by another driver"));
        }
        Err(e) => return Err(e),
    };
    match ioctl::clear_fd(dev.as_fd()) {
        Ok(()) => {}
        Err(Errno::ENXIO) => return Ok(Detach::Done),
        Err(e) => return Err(PathIoError::errno_at("detach (LOOP_CLR_FD)", &path)(e).into()),
    }
    match ioctl::get_status(dev.as_fd()) {
        // We were its only opener: the kernel is running it down and clears it as we close.
        Err(Errno::ENXIO) => Ok(Detach::Done),
        Err(e) => Err(PathIoError::errno_at("get status (LOOP_GET_STATUS64) of", &path)(e).into()),
        // Someone else has it open: the kernel only set autoclear. Take that back.
        Ok(mut info) => {
            info.lo_flags &= !LO_FLAGS_AUTOCLEAR;
            match ioctl::set_status(dev.as_fd(), &info) {
                Ok(()) => Ok(Detach::Busy("open by another process")),
                Err(Errno::ENXIO) => Ok(Detach::Done),
                Err(e) => Err(PathIoError::errno_at(
                    "clear autoclear (LOOP_SET_STATUS64) of",
                    &path,
                )(e)
                .into()),
            }
        }
    }
}

/// Makes a device of ours see its file's new size (after [`grow_backing_file`]); returns the
/// device's size in bytes.
pub fn refresh_capacity(device: LoopDevice, file: &Path) -> Result<u64, LoopError> {
    let identity = Identity::of(file)?;
    let path = device.path();
    let dev = open_ours(device, file, identity, OFlag::O_RDONLY)?
        .ok_or_else(|| PathIoError::errno_at("refresh", &path)(Errno::ENXIO))?;
    ioctl::set_capacity(dev.as_fd()).map_err(PathIoError::errno_at(
        "refresh capacity (LOOP_SET_CAPACITY) of",
        &path,
    ))?;
    Ok(ioctl::size(dev.as_fd())
        .map_err(PathIoError::errno_at("get size (BLKGETSIZE64) of", &path))?)
}

/// Writes what the device's page cache holds through to its file and the file to disk
/// (`fsync` of the block device: the loop driver syncs its backing file), so a copy of the
/// file made now has every write the device acknowledged.
pub fn flush(device: LoopDevice) -> Result<(), LoopError> {
    let path = device.path();
    let dev = device_node::open_device(device.0, OFlag::O_RDONLY)?;
    Ok(dev
        .sync_all()
        .map_err(PathIoError::at("flush (fsync)", &path))?)
}

/// Turns direct I/O on or off on a device of ours, at once (the kernel drains its queue
/// first). `Ok(false)`: the backing file cannot do direct I/O, and the device stays buffered.
pub fn set_direct_io(device: LoopDevice, file: &Path, on: bool) -> Result<bool, LoopError> {
    let identity = Identity::of(file)?;
    let path = device.path();
    let dev = open_ours(device, file, identity, OFlag::O_RDONLY)?
        .ok_or_else(|| PathIoError::errno_at("switch direct I/O of", &path)(Errno::ENXIO))?;
    match ioctl::set_direct_io(dev.as_fd(), on) {
        Ok(()) => Ok(true),
        Err(Errno::EINVAL) if on => Ok(false),
        Err(e) => {
            Err(PathIoError::errno_at("switch direct I/O (LOOP_SET_DIRECT_IO) of", &path)(e).into())
        }
    }
}

/// The size of `device` in bytes (0 when it is not bound).
pub fn size(device: LoopDevice) -> Result<u64, LoopError> {
    let path = device.path();
    let dev = device_node::open_device(device.0, OFlag::O_RDONLY)?;
    Ok(ioctl::size(dev.as_fd())
        .map_err(PathIoError::errno_at("get size (BLKGETSIZE64) of", &path))?)
}
