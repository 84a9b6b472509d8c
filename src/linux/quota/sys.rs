//! The kernel's quota and inode-attribute interfaces, as raw calls: `quotactl(2)`,
//! `quotactl_fd(2)` and the `FS_IOC_FS{GET,SET}XATTR` ioctls. The structures mirror the UAPI
//! headers (`linux/quota.h`, `linux/dqblk_xfs.h`, `linux/fs.h`) field for field; the size
//! tests below pin their layout. Nothing here knows about volumes or errors beyond errno.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// The quota type of projects (`PRJQUOTA`).
pub const PRJQUOTA: i32 = 2;

/// `QCMD(cmd, type)`: the command word quotactl takes.
pub const fn qcmd(cmd: i32, qtype: i32) -> i32 {
    (cmd << 8) | (qtype & 0xff)
}

// Generic (VFS quota, ext4) sub-commands.
pub const Q_GETFMT: i32 = 0x80_0004;
pub const Q_GETQUOTA: i32 = 0x80_0007;
pub const Q_SETQUOTA: i32 = 0x80_0008;
pub const Q_GETNEXTQUOTA: i32 = 0x80_0009;

// XFS sub-commands: `XQM_CMD(x)` is `('X' << 8) + x`.
const fn xqm_cmd(x: i32) -> i32 {
    ((b'X' as i32) << 8) + x
}
pub const Q_XGETQUOTA: i32 = xqm_cmd(3);
pub const Q_XSETQLIM: i32 = xqm_cmd(4);
pub const Q_XGETQSTATV: i32 = xqm_cmd(8);
pub const Q_XGETNEXTQUOTA: i32 = xqm_cmd(9);

/// `if_dqblk.dqb_valid` bits: which fields a Q_SETQUOTA sets.
pub const QIF_BLIMITS: u32 = 1;
pub const QIF_ILIMITS: u32 = 4;

/// The generic interface counts block limits in 1 KiB units (`QIF_DQBLKSIZE`), usage in bytes.
pub const QIF_DQBLKSIZE: u64 = 1024;
/// The XFS interface counts blocks in 512-byte "basic blocks".
pub const XFS_BB_SIZE: u64 = 512;

/// `struct if_dqblk` (generic Q_GETQUOTA / Q_SETQUOTA).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct IfDqblk {
    pub bhardlimit: u64,
    pub bsoftlimit: u64,
    pub curspace: u64,
    pub ihardlimit: u64,
    pub isoftlimit: u64,
    pub curinodes: u64,
    pub btime: u64,
    pub itime: u64,
    pub valid: u32,
}

/// `struct if_nextdqblk` (Q_GETNEXTQUOTA): `if_dqblk`'s fields plus the ID found, which
/// fills what is padding in `if_dqblk`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct IfNextDqblk {
    pub bhardlimit: u64,
    pub bsoftlimit: u64,
    pub curspace: u64,
    pub ihardlimit: u64,
    pub isoftlimit: u64,
    pub curinodes: u64,
    pub btime: u64,
    pub itime: u64,
    pub valid: u32,
    pub id: u32,
}

pub const FS_DQUOT_VERSION: i8 = 1;
pub const FS_PROJ_QUOTA: i8 = 2;
/// `fs_disk_quota.d_fieldmask` bits.
pub const FS_DQ_ISOFT: u16 = 1 << 0;
pub const FS_DQ_IHARD: u16 = 1 << 1;
pub const FS_DQ_BSOFT: u16 = 1 << 2;
pub const FS_DQ_BHARD: u16 = 1 << 3;

/// `struct fs_disk_quota` (Q_XGETQUOTA, Q_XSETQLIM, Q_XGETNEXTQUOTA).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct FsDiskQuota {
    pub version: i8,
    pub flags: i8,
    pub fieldmask: u16,
    pub id: u32,
    pub blk_hardlimit: u64,
    pub blk_softlimit: u64,
    pub ino_hardlimit: u64,
    pub ino_softlimit: u64,
    pub bcount: u64,
    pub icount: u64,
    pub itimer: i32,
    pub btimer: i32,
    pub iwarns: u16,
    pub bwarns: u16,
    pub itimer_hi: i8,
    pub btimer_hi: i8,
    pub rtbtimer_hi: i8,
    pub padding2: i8,
    pub rtb_hardlimit: u64,
    pub rtb_softlimit: u64,
    pub rtbcount: u64,
    pub rtbtimer: i32,
    pub rtbwarns: u16,
    pub padding3: i16,
    pub padding4: [u8; 8],
}

pub const FS_QSTATV_VERSION1: i8 = 1;
/// `fs_quota_statv.qs_flags`: project quota accounting / enforcement is on.
pub const FS_QUOTA_PDQ_ACCT: u16 = 1 << 4;
pub const FS_QUOTA_PDQ_ENFD: u16 = 1 << 5;

/// `struct fs_qfilestatv`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct FsQfilestatv {
    pub ino: u64,
    pub nblks: u64,
    pub nextents: u32,
    pub pad: u32,
}

/// `struct fs_quota_statv` (Q_XGETQSTATV); the caller sets `version` first.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct FsQuotaStatv {
    pub version: i8,
    pub pad1: u8,
    pub flags: u16,
    pub incoredqs: u32,
    pub uquota: FsQfilestatv,
    pub gquota: FsQfilestatv,
    pub pquota: FsQfilestatv,
    pub btimelimit: i32,
    pub itimelimit: i32,
    pub rtbtimelimit: i32,
    pub bwarnlimit: u16,
    pub iwarnlimit: u16,
    pub rtbwarnlimit: u16,
    pub pad3: u16,
    pub pad4: u32,
    pub pad2: [u64; 7],
}

/// `struct fsxattr` (FS_IOC_FSGETXATTR / FS_IOC_FSSETXATTR).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct Fsxattr {
    pub xflags: u32,
    pub extsize: u32,
    pub nextents: u32,
    pub projid: u32,
    pub cowextsize: u32,
    pub pad: [u8; 8],
}

/// New entries below the directory take its project ID.
pub const FS_XFLAG_PROJINHERIT: u32 = 0x0000_0200;

nix::ioctl_read!(fs_ioc_fsgetxattr, b'X', 31, Fsxattr);
nix::ioctl_write_ptr!(fs_ioc_fssetxattr, b'X', 32, Fsxattr);

/// Reads an inode's extended attributes (flags and project ID).
pub fn get_fsxattr(fd: BorrowedFd<'_>) -> io::Result<Fsxattr> {
    let mut attr = Fsxattr::default();
    // SAFETY: `attr` is a valid, writable fsxattr for the duration of the call.
    unsafe { fs_ioc_fsgetxattr(fd.as_raw_fd(), &mut attr) }.map_err(io::Error::from)?;
    Ok(attr)
}

/// Writes an inode's extended attributes (flags and project ID).
pub fn set_fsxattr(fd: BorrowedFd<'_>, attr: &Fsxattr) -> io::Result<()> {
    // SAFETY: `attr` points to a valid fsxattr the kernel only reads.
    unsafe { fs_ioc_fssetxattr(fd.as_raw_fd(), attr) }.map_err(io::Error::from)?;
    Ok(())
}

/// Where quotactl finds the filesystem: a descriptor on it (`quotactl_fd`, Linux 5.14+) or
/// the block device it is mounted from (`quotactl`, any kernel).
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    Fd(BorrowedFd<'a>),
    Device(&'a std::ffi::CStr),
}

/// One quotactl call; `data` is the command's argument structure (or null).
///
/// # Safety
/// `data` must point to the structure `cmd` reads or writes, valid for the call.
pub unsafe fn quotactl(
    target: Target<'_>,
    cmd: i32,
    id: u32,
    data: *mut libc::c_char,
) -> io::Result<()> {
    // The kernel takes the ID as an int and treats it as the 32-bit qid it is.
    let id = id as libc::c_int;
    let rc = match target {
        // SAFETY: per this function's contract; the fd is open for the call.
        Target::Fd(fd) => unsafe {
            libc::syscall(
                libc::SYS_quotactl_fd,
                fd.as_raw_fd(),
                cmd as libc::c_uint,
                id,
                data,
            ) as libc::c_int
        },
        // SAFETY: per this function's contract; the path is NUL-terminated.
        Target::Device(path) => unsafe { libc::quotactl(cmd, path.as_ptr(), id, data) },
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A device path as quotactl wants it.
pub fn device_cstring(path: &std::path::Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "device path contains NUL"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structures_have_the_kernel_sizes() {
        assert_eq!(size_of::<IfDqblk>(), 72);
        assert_eq!(size_of::<IfNextDqblk>(), 72);
        assert_eq!(size_of::<FsDiskQuota>(), 112);
        assert_eq!(size_of::<FsQuotaStatv>(), 160);
        assert_eq!(size_of::<Fsxattr>(), 28);
    }

    #[test]
    fn command_words_match_the_kernel_encoding() {
        assert_eq!(qcmd(Q_GETQUOTA, PRJQUOTA), 0x8000_0702_u32 as i32);
        assert_eq!(Q_XGETQSTATV, 0x5808);
        assert_eq!(qcmd(Q_XSETQLIM, PRJQUOTA), 0x58_0402);
    }
}
