//! The project ID of any inode of an XFS, by its number (`XFS_IOC_FSBULKSTAT_SINGLE`, root
//! only): the one way before Linux 6.17 to read it for a symlink, FIFO, socket or device node,
//! which no descriptor of theirs reaches `FS_IOC_FSGETXATTR` through. ext4 has none (and its
//! `file_getattr` refuses special files even on 6.18): there the walk asks by a hard link
//! instead ([`Aside::probe`](super::remake::Aside::probe)).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `struct xfs_bstat` (xfs_fs.h), as x86_64 and the other 64-bit ABIs lay it out.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct XfsBstat {
    pub ino: u64,
    pub mode: u16,
    pub nlink: u16,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: i32,
    pub size: i64,
    /// atime, mtime, ctime: `{ tv_sec: i64, tv_nsec: i32 }`, padded to 16 bytes each.
    pub times: [[i64; 2]; 3],
    pub blocks: i64,
    pub xflags: u32,
    pub extsize: i32,
    pub extents: i32,
    pub generation: u32,
    pub projid_lo: u16,
    pub forkoff: u16,
    pub projid_hi: u16,
    pub sick: u16,
    pub checked: u16,
    pub pad: [u8; 2],
    pub cowextsize: u32,
    pub dmevmask: u32,
    pub dmstate: u16,
    pub aextents: u16,
}

/// `struct xfs_fsop_bulkreq`.
#[repr(C)]
struct BulkReq {
    lastip: *mut u64,
    icount: i32,
    ubuffer: *mut XfsBstat,
    ocount: *mut i32,
}

nix::ioctl_readwrite!(xfs_ioc_fsbulkstat_single, b'X', 102, BulkReq);

/// Inode `ino`'s project ID, asked through `fs`, a descriptor on its XFS. ENOTTY: not an XFS;
/// EPERM: no CAP_SYS_ADMIN.
pub fn project_of(fs: BorrowedFd<'_>, ino: u64) -> io::Result<u32> {
    let mut stat = XfsBstat::default();
    let mut last = ino;
    let mut count = 0i32;
    let mut req = BulkReq {
        lastip: &mut last,
        icount: 1,
        ubuffer: &mut stat,
        ocount: &mut count,
    };
    // SAFETY: every pointer in `req` is to a live local of the size the kernel writes.
    unsafe { xfs_ioc_fsbulkstat_single(fs.as_raw_fd(), &mut req) }.map_err(io::Error::from)?;
    if stat.ino != ino {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    Ok(u32::from(stat.projid_hi) << 16 | u32::from(stat.projid_lo))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bulkstat_record_has_the_kernels_size_and_offsets() {
        assert_eq!(size_of::<XfsBstat>(), 136);
        assert_eq!(std::mem::offset_of!(XfsBstat, size), 32);
        assert_eq!(std::mem::offset_of!(XfsBstat, blocks), 88);
        assert_eq!(std::mem::offset_of!(XfsBstat, projid_lo), 112);
        assert_eq!(std::mem::offset_of!(XfsBstat, projid_hi), 116);
    }
}
