//! Capacity: choosing a volume's size from a CSI range, and how much
//! is left to provision.
//!
//! Volumes are directories on one filesystem. With `--capacity` the sizes of all volumes must
//! fit in it. Without it, sizes are reserved in the filesystem's free space: what is free for a
//! new volume is the free space less what existing volumes were promised and have not written
//! yet (their size less their usage). `--overcommit` drops the reservation: each new volume
//! then only has to fit in the free space at the time it is created.
//!
//! Inodes are reserved the same way where the filesystem has a fixed number of them (ext4):
//! a new volume's inode limit must fit in the free inodes less what the other volumes' limits
//! still promise. Not on XFS, which makes inodes from free space (see [`Inodes::fixed`]).

use std::path::Path;

/// The size of a volume created without any size asked for.
pub const DEFAULT_SIZE: u64 = 1 << 30;

/// The size to give a new volume for a (required, limit) range, zero meaning unbounded.
pub fn choose_size(required: u64, limit: u64) -> u64 {
    match (required, limit) {
        (0, 0) => DEFAULT_SIZE,
        (0, limit) => limit.min(DEFAULT_SIZE),
        (required, _) => required,
    }
}

/// The size of a new volume for a range when it starts with the content of a source of
/// `source` bytes: what [`choose_size`] gives, raised to the source's size (the source's size
/// when no range is given); `None` when the range's limit is below the source.
pub fn size_with_source(required: u64, limit: u64, source: Option<u64>) -> Option<u64> {
    let Some(source) = source else {
        return Some(choose_size(required, limit));
    };
    let size = match (required, limit) {
        (0, 0) if source > 0 => source,
        _ => choose_size(required, limit).max(source),
    };
    (limit == 0 || size <= limit).then_some(size)
}

/// Whether an existing volume of `size` satisfies a repeated request for the same name.
pub fn satisfies(size: u64, required: u64, limit: u64) -> bool {
    size >= required && (limit == 0 || size <= limit)
}

/// Bytes per inode of the default inode limit: ext4's default `bytes-per-inode` (mke2fs.conf's
/// `inode_ratio`), so volumes whose sizes fit in a default ext4 get no more inodes together
/// than it has.
pub const BYTES_PER_INODE: u64 = 16 << 10;

/// The least default inode limit, so a small volume still holds a working set of files.
pub const MIN_INODES: u64 = 1024;

/// The inode limit of a volume of `size` bytes without an `inodeLimit`: one per
/// [`BYTES_PER_INODE`], at least [`MIN_INODES`].
pub fn default_inodes(size: u64) -> u64 {
    (size / BYTES_PER_INODE).max(MIN_INODES)
}

/// The inode limit a volume's project holds: its `inodeLimit` (0: none), else the default.
pub fn inode_limit(inode_limit: Option<u64>, size: u64) -> u64 {
    inode_limit.unwrap_or_else(|| default_inodes(size))
}

/// Inodes a volume limited to `limit` may still create, having `used` (0: no limit, nothing
/// that could be kept for it).
pub fn promised_inodes(limit: u64, used: u64) -> u64 {
    limit.saturating_sub(used)
}

/// The inodes of the filesystem holding the volumes, as an unprivileged user would see them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inodes {
    pub free: u64,
    /// The filesystem has a fixed number of inodes (ext4, tmpfs), so inodes promised to
    /// volumes can be kept for them. XFS makes inodes from free space as they are needed:
    /// its free count is what the free blocks could still hold (up to `imaxpct`), which the
    /// volumes' reserved sizes already keep from new volumes, and which a volume's own
    /// writes shrink, so a fixed number kept aside would mean nothing there.
    pub fixed: bool,
}

/// The filesystem's inodes, or `None` for one that reports no inode count (btrfs).
pub fn inodes(path: &Path) -> std::io::Result<Option<Inodes>> {
    let stat = nix::sys::statvfs::statvfs(path)?;
    if stat.files() == 0 {
        return Ok(None);
    }
    let kind = nix::sys::statfs::statfs(path)?.filesystem_type();
    Ok(Some(Inodes {
        free: stat.files_available(),
        fixed: kind != nix::sys::statfs::XFS_SUPER_MAGIC,
    }))
}

/// Inodes a new volume may count on: the free ones less what other volumes were `promised`,
/// where the number is fixed; all the free ones where it is not.
pub fn inodes_available(inodes: Inodes, promised: u64) -> u64 {
    match inodes.fixed {
        true => inodes.free.saturating_sub(promised),
        false => inodes.free,
    }
}

/// Bytes a volume of `size` may still write, having `used`: what the filesystem must keep free
/// for it.
pub fn promised(size: u64, used: u64) -> u64 {
    size.saturating_sub(used)
}

/// Bytes still available for new volumes: `--capacity` less everything `allocated`, or else
/// the filesystem's free space less what is `promised` (0 when overcommitting).
pub fn available(
    total: Option<u64>,
    allocated: u64,
    promised: u64,
    data_dir: &Path,
) -> std::io::Result<u64> {
    match total {
        Some(total) => Ok(total.saturating_sub(allocated)),
        None => Ok(free_bytes(data_dir)?.saturating_sub(promised)),
    }
}

/// Free bytes on the filesystem holding `path`, as an unprivileged user would see them.
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    let stat = nix::sys::statvfs::statvfs(path)?;
    Ok(stat.blocks_available().saturating_mul(stat.fragment_size()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_size_chosen_honours_both_ends_of_the_range() {
        assert_eq!(choose_size(0, 0), DEFAULT_SIZE);
        assert_eq!(choose_size(5, 0), 5);
        assert_eq!(choose_size(5, 10), 5);
        assert_eq!(choose_size(0, 1000), 1000);
        assert_eq!(choose_size(0, 10 << 30), DEFAULT_SIZE);
    }

    #[test]
    fn a_volume_from_a_source_is_never_smaller_than_the_source() {
        assert_eq!(size_with_source(5, 10, None), Some(5));
        assert_eq!(
            size_with_source(0, 0, Some(100)),
            Some(100),
            "the source's size"
        );
        assert_eq!(size_with_source(0, 0, Some(0)), Some(DEFAULT_SIZE));
        assert_eq!(size_with_source(200, 0, Some(100)), Some(200));
        assert_eq!(
            size_with_source(50, 0, Some(100)),
            Some(100),
            "raised to the source"
        );
        assert_eq!(size_with_source(50, 100, Some(100)), Some(100));
        assert_eq!(size_with_source(0, 1000, Some(100)), Some(1000));
        assert_eq!(size_with_source(50, 99, Some(100)), None, "OUT_OF_RANGE");
        assert_eq!(size_with_source(99, 99, Some(100)), None);
    }

    #[test]
    fn an_existing_size_satisfies_a_range_only_within_its_bounds() {
        assert!(satisfies(10, 10, 0));
        assert!(satisfies(10, 5, 10));
        assert!(!satisfies(10, 20, 0));
        assert!(!satisfies(10, 0, 5));
    }

    #[test]
    fn a_configured_total_is_reduced_by_what_is_allocated() {
        assert_eq!(available(Some(100), 30, 0, Path::new("/")).unwrap(), 70);
        assert_eq!(available(Some(100), 300, 0, Path::new("/")).unwrap(), 0);
        assert!(available(None, 0, 0, Path::new("/")).is_ok());
    }

    #[test]
    fn the_free_space_is_reduced_by_what_volumes_were_promised() {
        let free = free_bytes(Path::new("/")).unwrap();
        assert_eq!(available(None, 0, 10, Path::new("/")).unwrap(), free - 10);
        assert_eq!(available(None, 0, u64::MAX, Path::new("/")).unwrap(), 0);
        assert_eq!(promised(100, 30), 70);
        assert_eq!(
            promised(100, 300),
            0,
            "a volume past its size promises nothing"
        );
    }

    #[test]
    fn free_inodes_are_reduced_by_what_volumes_were_promised_only_where_their_number_is_fixed() {
        let ext4 = Inodes {
            free: 1000,
            fixed: true,
        };
        assert_eq!(inodes_available(ext4, 300), 700);
        assert_eq!(inodes_available(ext4, 3000), 0);
        let xfs = Inodes {
            free: 1000,
            fixed: false,
        };
        assert_eq!(inodes_available(xfs, 300), 1000, "made from free space");
        assert_eq!(promised_inodes(1024, 24), 1000);
        assert_eq!(promised_inodes(0, 24), 0, "no limit, nothing kept");
        assert_eq!(promised_inodes(10, 24), 0, "past its limit");
    }

    #[test]
    fn a_filesystems_inodes_say_whether_their_number_is_fixed() {
        let path = Path::new("/");
        let kind = nix::sys::statfs::statfs(path).unwrap().filesystem_type();
        match inodes(path).unwrap() {
            None => assert_eq!(nix::sys::statvfs::statvfs(path).unwrap().files(), 0),
            Some(found) => assert_eq!(found.fixed, kind != nix::sys::statfs::XFS_SUPER_MAGIC),
        }
    }

    #[test]
    fn the_default_inode_limit_is_one_per_16_kib_and_never_below_the_floor() {
        assert_eq!(default_inodes(1 << 30), 65536);
        assert_eq!(default_inodes(10 << 30), 655360);
        assert_eq!(default_inodes(8 << 20), MIN_INODES, "8 MiB would be 512");
        assert_eq!(default_inodes(0), MIN_INODES);
        assert_eq!(inode_limit(None, 1 << 30), 65536);
        assert_eq!(inode_limit(Some(0), 1 << 30), 0, "inodeLimit 0: no limit");
        assert_eq!(inode_limit(Some(7), 1 << 30), 7);
    }
}
