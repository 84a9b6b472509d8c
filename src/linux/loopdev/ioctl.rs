//! The kernel's loop interface, from `linux/loop.h` and `linux/fs.h`: the two structs and the
//! ioctls, typed. Neither libc nor nix defines them; nix's ioctl macros give checked calls.
//! The numbers are the kernel's ABI and never change.

use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;

/// `LO_NAME_SIZE`, `LO_KEY_SIZE`.
pub const NAME_SIZE: usize = 64;
const KEY_SIZE: usize = 32;

pub const LO_FLAGS_READ_ONLY: u32 = 1;
pub const LO_FLAGS_AUTOCLEAR: u32 = 4;
pub const LO_FLAGS_PARTSCAN: u32 = 8;
pub const LO_FLAGS_DIRECT_IO: u32 = 16;

/// `struct loop_info64`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LoopInfo64 {
    /// The backing file's `st_dev` (read-only).
    pub lo_device: u64,
    /// The backing file's inode number (read-only).
    pub lo_inode: u64,
    pub lo_rdevice: u64,
    pub lo_offset: u64,
    /// Bytes; 0: the whole file.
    pub lo_sizelimit: u64,
    pub lo_number: u32,
    pub lo_encrypt_type: u32,
    pub lo_encrypt_key_size: u32,
    pub lo_flags: u32,
    /// Free text the attacher sets (losetup puts the path there).
    pub lo_file_name: [u8; NAME_SIZE],
    pub lo_crypt_name: [u8; NAME_SIZE],
    pub lo_encrypt_key: [u8; KEY_SIZE],
    pub lo_init: [u64; 2],
}

impl Default for LoopInfo64 {
    fn default() -> Self {
        Self {
            lo_device: 0,
            lo_inode: 0,
            lo_rdevice: 0,
            lo_offset: 0,
            lo_sizelimit: 0,
            lo_number: 0,
            lo_encrypt_type: 0,
            lo_encrypt_key_size: 0,
            lo_flags: 0,
            lo_file_name: [0; NAME_SIZE],
            lo_crypt_name: [0; NAME_SIZE],
            lo_encrypt_key: [0; KEY_SIZE],
            lo_init: [0; 2],
        }
    }
}

/// `struct loop_config`, for `LOOP_CONFIGURE` (Linux 5.8): backing file, block size and status
/// in one call, so the device never shows up half set up.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct LoopConfig {
    pub fd: u32,
    /// 0: the kernel's default (512, or the backing device's logical block size with direct I/O).
    pub block_size: u32,
    pub info: LoopInfo64,
    pub reserved: [u64; 8],
}

// The kernel's sizes; a mismatch would be a silent memory error in the ioctls.
const _: () = assert!(size_of::<LoopInfo64>() == 232);
const _: () = assert!(size_of::<LoopConfig>() == 304);

// The loop ioctls are "bad" ones in nix's terms: plain numbers, not _IOC-encoded.
nix::ioctl_none_bad!(loop_clr_fd, 0x4C01);
nix::ioctl_write_ptr_bad!(loop_set_status64, 0x4C04, LoopInfo64);
nix::ioctl_read_bad!(loop_get_status64, 0x4C05, LoopInfo64);
nix::ioctl_none_bad!(loop_set_capacity, 0x4C07);
nix::ioctl_write_int_bad!(loop_set_direct_io, 0x4C08);
nix::ioctl_write_ptr_bad!(loop_configure, 0x4C0A, LoopConfig);
nix::ioctl_none_bad!(loop_ctl_get_free, 0x4C82);
// BLKGETSIZE64 = _IOR(0x12, 114, size_t).
nix::ioctl_read!(blkgetsize64, 0x12, 114, u64);

// Every call below passes a descriptor borrowed for the call (so it stays open), and where the
// ioctl takes a struct, a reference to one of the kernel's size (checked above).

/// `LOOP_CTL_GET_FREE` on `/dev/loop-control`: the number of a free device (made if need be).
pub fn get_free(control: BorrowedFd<'_>) -> Result<u32, Errno> {
    // SAFETY: LOOP_CTL_GET_FREE takes no argument; `control` is open for the call.
    let n = unsafe { loop_ctl_get_free(control.as_raw_fd()) }?;
    u32::try_from(n).map_err(|_| Errno::EINVAL)
}

pub fn configure(device: BorrowedFd<'_>, config: &LoopConfig) -> Result<(), Errno> {
    // SAFETY: `config` is a live `struct loop_config` the kernel only reads; `device` is open.
    unsafe { loop_configure(device.as_raw_fd(), config) }.map(drop)
}

/// `ENXIO`: the device is not bound to a file.
pub fn get_status(device: BorrowedFd<'_>) -> Result<LoopInfo64, Errno> {
    let mut info = LoopInfo64::default();
    // SAFETY: `info` is a live, writable `struct loop_info64` of the kernel's size; `device` is
    // open.
    unsafe { loop_get_status64(device.as_raw_fd(), &mut info) }?;
    Ok(info)
}

pub fn set_status(device: BorrowedFd<'_>, info: &LoopInfo64) -> Result<(), Errno> {
    // SAFETY: `info` is a live `struct loop_info64` the kernel only reads; `device` is open.
    unsafe { loop_set_status64(device.as_raw_fd(), info) }.map(drop)
}

pub fn clear_fd(device: BorrowedFd<'_>) -> Result<(), Errno> {
    // SAFETY: LOOP_CLR_FD takes no argument; `device` is open for the call.
    unsafe { loop_clr_fd(device.as_raw_fd()) }.map(drop)
}

/// `EINVAL`: the backing file cannot do direct I/O (tmpfs), or not at this block size.
pub fn set_direct_io(device: BorrowedFd<'_>, on: bool) -> Result<(), Errno> {
    // SAFETY: LOOP_SET_DIRECT_IO takes an int by value; `device` is open for the call.
    unsafe { loop_set_direct_io(device.as_raw_fd(), nix::libc::c_int::from(on)) }.map(drop)
}

pub fn set_capacity(device: BorrowedFd<'_>) -> Result<(), Errno> {
    // SAFETY: LOOP_SET_CAPACITY takes no argument; `device` is open for the call.
    unsafe { loop_set_capacity(device.as_raw_fd()) }.map(drop)
}

/// The size of a block device in bytes.
pub fn size(device: BorrowedFd<'_>) -> Result<u64, Errno> {
    let mut size = 0u64;
    // SAFETY: BLKGETSIZE64 writes one u64 into `size`, which lives across the call; `device` is
    // open.
    unsafe { blkgetsize64(device.as_raw_fd(), &mut size) }?;
    Ok(size)
}
