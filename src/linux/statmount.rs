//! "Which mount does this path lie in, and what is that mount's root?", asked of one mount in
//! O(1): `statx(2)` gives the path's mount ID, `statmount(2)` (Linux 6.8) what the mount
//! table would say of that mount (its filesystem's device, the directory of that filesystem
//! at its root, its mount point), without reading the table. Older kernels have no
//! `statmount`: there [`containing`] says `None` and the caller reads the table.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::linux::mountinfo::Source;
use crate::linux::mountpoint;

/// The mount a path lies in, as its mount table line would give it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Containing {
    /// `major:minor` of the filesystem.
    pub dev: (u32, u32),
    /// The directory of that filesystem that appears at the mount point.
    pub root: PathBuf,
    pub mount_point: PathBuf,
}

impl Containing {
    /// Where `path`, a path inside this mount without symlinks, really lives.
    pub fn source_of(&self, path: &Path) -> Option<Source> {
        let rest = path.strip_prefix(&self.mount_point).ok()?;
        Some(Source {
            dev: self.dev,
            path: self.root.join(rest),
        })
    }
}

/// `statmount(2)`'s number: syscalls since Linux 5.1 have one number on every architecture.
const SYS_STATMOUNT: nix::libc::c_long = 457;
const STATMOUNT_SB_BASIC: u64 = 0x1;
const STATMOUNT_MNT_ROOT: u64 = 0x8;
const STATMOUNT_MNT_POINT: u64 = 0x10;
/// `struct statmount`'s fixed part; its strings follow, at offsets the fixed part gives.
const HEADER: usize = 512;

/// `struct mnt_id_req`, its first version (24 bytes): the mount and what to ask of it.
#[repr(C)]
struct MntIdReq {
    size: u32,
    spare: u32,
    mnt_id: u64,
    param: u64,
}

/// The mount `path` (which must exist) lies in; `None` where this kernel cannot say without
/// the mount table (no unique mount IDs or no `statmount`: before Linux 6.8).
pub fn containing(path: &Path) -> std::io::Result<Option<Containing>> {
    let Some(mnt_id) = mountpoint::unique_mount_id(path)? else {
        return Ok(None);
    };
    let request = MntIdReq {
        size: std::mem::size_of::<MntIdReq>() as u32,
        spare: 0,
        mnt_id,
        param: STATMOUNT_SB_BASIC | STATMOUNT_MNT_ROOT | STATMOUNT_MNT_POINT,
    };
    let mut buf = vec![0u8; HEADER + 1024];
    loop {
        // SAFETY: the request is a valid mnt_id_req of the size it states; the kernel writes
        // at most `buf.len()` bytes into `buf`.
        let rc = unsafe {
            nix::libc::syscall(
                SYS_STATMOUNT,
                &request as *const MntIdReq,
                buf.as_mut_ptr(),
                buf.len(),
                0u32,
            )
        };
        if rc == 0 {
            break;
        }
        let error = std::io::Error::last_os_error();
        match error.raw_os_error() {
            Some(nix::libc::ENOSYS) => return Ok(None),
            // The paths did not fit: a larger buffer, up to two whole paths.
            Some(nix::libc::EOVERFLOW) if buf.len() < HEADER + 2 * 4096 => {
                buf.resize(HEADER + 2 * 4096 + 64, 0)
            }
            _ => return Err(error),
        }
    }
    let u32_at = |at: usize| u32::from_ne_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
    let mask = u64::from_ne_bytes(buf[8..16].try_into().expect("8 bytes"));
    let wanted = STATMOUNT_SB_BASIC | STATMOUNT_MNT_ROOT | STATMOUNT_MNT_POINT;
    if mask & wanted != wanted {
        return Ok(None);
    }
    let string = |offset: u32| -> PathBuf {
        let tail = buf.get(HEADER + offset as usize..).unwrap_or_default();
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        PathBuf::from(OsStr::from_bytes(&tail[..end]))
    };
    Ok(Some(Containing {
        dev: (u32_at(16), u32_at(20)),
        root: string(u32_at(104)),
        mount_point: string(u32_at(108)),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_lies_in_the_mount_the_mount_table_says_it_does() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().canonicalize().unwrap();
        let found = containing(&real)
            .unwrap()
            .expect("Linux 6.8+ has statmount");
        let table = crate::linux::mountinfo::MountTable::read().unwrap();
        let entry = table.containing(&real).unwrap();
        assert_eq!(found.dev, entry.dev);
        assert_eq!(Some(&found.root), entry.root.as_ref());
        assert_eq!(found.mount_point, entry.mount_point);
        assert_eq!(found.source_of(&real), table.source_of(&real));
    }
}
