//! Attaching: `LOOP_CTL_GET_FREE`, then `LOOP_CONFIGURE` with everything at once (backing
//! file, block size, flags, our label), retrying when another process takes the same free
//! device first, and without direct I/O where the backing file cannot do it.

use std::fs::OpenOptions;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;

use super::ioctl::{self, LO_FLAGS_AUTOCLEAR, LO_FLAGS_DIRECT_IO, LO_FLAGS_READ_ONLY};
use super::loop_error::LoopError;
use super::{
    ATTACH_ATTEMPTS, AttachOptions, Identity, LoopDevice, Status, TAG, backing, device_node, find,
};
use crate::path_io::PathIoError;

/// `lo_file_name` for a device of ours: the tag, then as much of the path's end as fits.
fn label(file: &Path) -> [u8; ioctl::NAME_SIZE] {
    let mut name = [0u8; ioctl::NAME_SIZE];
    let path = file.as_os_str().as_encoded_bytes();
    let room = ioctl::NAME_SIZE - 1 - TAG.len();
    let tail = &path[path.len().saturating_sub(room)..];
    name[..TAG.len()].copy_from_slice(TAG.as_bytes());
    name[TAG.len()..TAG.len() + tail.len()].copy_from_slice(tail);
    name
}

/// Attaches `file` to a free loop device, always a new one (see [`find_or_attach`]).
pub fn attach(file: &Path, options: AttachOptions) -> Result<Status, LoopError> {
    let writable = !options.read_only;
    let (backing, meta) =
        backing::open_backing_file(file, OpenOptions::new().read(true).write(writable))?;
    let identity = Identity {
        dev: meta.dev(),
        ino: meta.ino(),
    };
    let mut config = ioctl::LoopConfig {
        fd: backing.as_raw_fd() as u32,
        block_size: options.block_size,
        ..Default::default()
    };
    config.info.lo_file_name = label(file);
    config.info.lo_flags = if options.read_only {
        LO_FLAGS_READ_ONLY
    } else {
        0
    } | if options.direct_io {
        LO_FLAGS_DIRECT_IO
    } else {
        0
    };
    let control = device_node::open_control()?;
    for _ in 0..ATTACH_ATTEMPTS {
        let n = ioctl::get_free(control.as_fd()).map_err(PathIoError::errno_at(
            "find a free device (LOOP_CTL_GET_FREE) with",
            Path::new(device_node::CONTROL),
        ))?;
        let device = LoopDevice(n);
        let dev = match device_node::open_device(n, OFlag::O_RDWR) {
            Ok(dev) => dev,
            // Removed (LOOP_CTL_REMOVE) by someone between the two calls.
            Err(e) if device_node::is_gone(&e) => continue,
            Err(e) => return Err(e),
        };
        match ioctl::configure(dev.as_fd(), &config) {
            Ok(()) => {}
            // Another process bound it between LOOP_CTL_GET_FREE and now.
            Err(Errno::EBUSY) => continue,
            // Direct I/O refused for this file: buffered I/O, on the same device.
            Err(Errno::EINVAL) if config.info.lo_flags & LO_FLAGS_DIRECT_IO != 0 => {
                config.info.lo_flags &= !LO_FLAGS_DIRECT_IO;
                continue;
            }
            Err(e) => {
                return Err(
                    PathIoError::errno_at("attach (LOOP_CONFIGURE)", &device.path())(e).into(),
                );
            }
        }
        // Read back what the kernel holds; a device we cannot confirm is not left attached.
        let status = match ioctl::get_status(dev.as_fd()) {
            Ok(info) => Status::from_info(device, &info),
            Err(e) => {
                let _ = ioctl::clear_fd(dev.as_fd());
                return Err(PathIoError::errno_at(
                    "get status (LOOP_GET_STATUS64) of",
                    &device.path(),
                )(e)
                .into());
            }
        };
        if !status.is_ours_for(identity) {
            let _ = ioctl::clear_fd(dev.as_fd());
            return Err(LoopError::NotOurs {
                device: device.path(),
                file: file.to_owned(),
            });
        }
        log::info!(
            "attached {} to {device}{}",
            file.display(),
            if status.direct_io {
                " (direct I/O)"
            } else {
                ""
            }
        );
        return Ok(status);
    }
    Err(LoopError::NoFreeDevice {
        attempts: ATTACH_ATTEMPTS,
    })
}

/// The device of ours backed by `file` with the same read-only setting, else a new one
/// (`true`: attached now). Refuses while someone else has the file on a writable device.
pub fn find_or_attach(file: &Path, options: AttachOptions) -> Result<(Status, bool), LoopError> {
    let found = find(file)?;
    if let Some(status) = found
        .ours
        .into_iter()
        .find(|s| s.read_only == options.read_only)
    {
        return Ok((keep(status)?, false));
    }
    if let Some(foreign) = found.foreign.iter().find(|s| !s.read_only) {
        return Err(LoopError::ForeignDevice {
            device: foreign.device.path(),
            file: file.to_owned(),
        });
    }
    attach(file, options).map(|status| (status, true))
}

/// Clears a pending autoclear on a device of ours (left by someone's `LOOP_CLR_FD` while it
/// was busy), so it does not vanish at its last close while in use again.
fn keep(status: Status) -> Result<Status, LoopError> {
    if !status.autoclear {
        return Ok(status);
    }
    let path = status.device.path();
    let dev = device_node::open_device(status.device.0, OFlag::O_RDONLY)?;
    let mut info = ioctl::get_status(dev.as_fd()).map_err(PathIoError::errno_at(
        "get status (LOOP_GET_STATUS64) of",
        &path,
    ))?;
    info.lo_flags &= !LO_FLAGS_AUTOCLEAR;
    ioctl::set_status(dev.as_fd(), &info).map_err(PathIoError::errno_at(
        "clear autoclear (LOOP_SET_STATUS64) of",
        &path,
    ))?;
    Ok(Status::from_info(status.device, &info))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_label_is_the_tag_and_the_end_of_the_path_and_always_nul_terminated() {
        let name = label(Path::new("/var/lib/csi-nodekit/volumes/pvc-1234"));
        let text = std::ffi::CStr::from_bytes_until_nul(&name)
            .expect("NUL")
            .to_str()
            .expect("UTF-8");
        assert_eq!(text, "csi-nodekit:/var/lib/csi-nodekit/volumes/pvc-1234");
        let long = format!("/{}/pvc-tail", "x".repeat(200));
        let name = label(Path::new(&long));
        let text = std::ffi::CStr::from_bytes_until_nul(&name)
            .expect("NUL")
            .to_str()
            .expect("UTF-8");
        assert!(
            text.starts_with(TAG) && text.ends_with("/pvc-tail") && text.len() == 63,
            "{text}"
        );
    }
}
