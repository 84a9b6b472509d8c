//! Device nodes and the kernel's list of loop devices. `/dev/loopN` may be missing where
//! `/dev` is a container's own tmpfs; the node is then made with `mknod`, with the device
//! number sysfs gives (minors depend on the module's `max_part`). A node that exists but is
//! not that device is refused, never used.

use std::fs::File;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::sys::stat::{Mode, SFlag, mknod};

use super::LoopDevice;
use super::loop_error::LoopError;
use crate::path_io::PathIoError;

pub const CONTROL: &str = "/dev/loop-control";
/// The loop control device is misc 10:237 everywhere (`LOOP_CTRL_MINOR`).
const CONTROL_DEV: (u32, u32) = (10, 237);
/// The loop driver's block major, for when sysfs cannot say.
const LOOP_MAJOR: u32 = 7;

pub fn path(n: u32) -> PathBuf {
    PathBuf::from(format!("/dev/loop{n}"))
}

fn sysfs(n: u32) -> PathBuf {
    PathBuf::from(format!("/sys/block/loop{n}"))
}

/// `loopN`'s device number from sysfs, else the classic `7:N`.
/// The loop device whose block device number is `dev`, if it is a loop device: sysfs names
/// the device behind each number, and only loop devices have a `loop/` directory there.
pub fn with_number((major, minor): (u32, u32)) -> Option<LoopDevice> {
    let node = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if !node.join("loop").is_dir() {
        return None;
    }
    let name = std::fs::canonicalize(&node).ok()?;
    let n = name
        .file_name()?
        .to_str()?
        .strip_prefix("loop")?
        .parse()
        .ok()?;
    Some(LoopDevice(n))
}

pub fn number(n: u32) -> (u32, u32) {
    std::fs::read_to_string(sysfs(n).join("dev"))
        .ok()
        .and_then(|text| {
            let (major, minor) = text.trim().split_once(':')?;
            Some((major.parse().ok()?, minor.parse().ok()?))
        })
        .unwrap_or((LOOP_MAJOR, n))
}

/// Opens a device node, making it first if it is missing, and checks it is the device.
fn open_node(
    path: &Path,
    kind: SFlag,
    (major, minor): (u32, u32),
    flags: OFlag,
) -> Result<File, LoopError> {
    let flags = flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
    let fd = match open(path, flags, Mode::empty()) {
        Err(Errno::ENOENT) => {
            let dev = nix::libc::makedev(major, minor);
            match mknod(path, kind, Mode::from_bits_truncate(0o660), dev) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(PathIoError::errno_at("create device node", path)(e).into()),
            }
            open(path, flags, Mode::empty())
        }
        other => other,
    }
    .map_err(PathIoError::errno_at("open", path))?;
    let file = File::from(fd);
    let meta = file.metadata().map_err(PathIoError::at("stat", path))?;
    let right_kind = if kind == SFlag::S_IFBLK {
        meta.file_type().is_block_device()
    } else {
        meta.file_type().is_char_device()
    };
    let rdev = meta.rdev();
    if !right_kind || nix::libc::major(rdev) != major || nix::libc::minor(rdev) != minor {
        return Err(LoopError::WrongDeviceNode {
            path: path.to_owned(),
            major,
            minor,
        });
    }
    Ok(file)
}

/// `/dev/loop-control`, for `LOOP_CTL_GET_FREE`.
pub fn open_control() -> Result<File, LoopError> {
    open_node(
        Path::new(CONTROL),
        SFlag::S_IFCHR,
        CONTROL_DEV,
        OFlag::O_RDWR,
    )
}

/// `/dev/loopN`. `ENXIO`/`ENOENT` in the error mean the device went away meanwhile.
pub fn open_device(n: u32, flags: OFlag) -> Result<File, LoopError> {
    open_node(&path(n), SFlag::S_IFBLK, number(n), flags)
}

/// The loop devices bound to a file right now (sysfs shows `loop/` only for those), so that
/// looking for ours opens no idle device.
pub fn bound() -> Result<Vec<u32>, LoopError> {
    let dir = Path::new("/sys/block");
    let mut numbers = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(PathIoError::at("list", dir))? {
        let entry = entry.map_err(PathIoError::at("list", dir))?;
        let name = entry.file_name();
        let Some(n) = name
            .to_str()
            .and_then(|s| s.strip_prefix("loop"))
            .and_then(|s| s.parse().ok())
        else {
            continue;
        };
        if entry.path().join("loop").exists() {
            numbers.push(n);
        }
    }
    numbers.sort_unstable();
    Ok(numbers)
}

/// Whether an error means "that device is gone or not bound" rather than a failure.
pub fn is_gone(e: &LoopError) -> bool {
    matches!(e, LoopError::Io(e) if matches!(e.raw_os_error(), Some(nix::libc::ENXIO | nix::libc::ENOENT | nix::libc::ENODEV)))
}
