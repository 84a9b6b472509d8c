//! Capacity: choosing a volume's size from a CSI range, and how much
//! is left to provision.
//!
//! Volumes are directories on one filesystem, so sizes are accounted, not enforced. With
//! `--capacity` the sizes of all volumes must fit in it; without it, each new volume must fit
//! in the free space of the filesystem at the time it is created.

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

/// Bytes still available for new volumes.
pub fn available(total: Option<u64>, allocated: u64, data_dir: &Path) -> std::io::Result<u64> {
    match total {
        Some(total) => Ok(total.saturating_sub(allocated)),
        None => free_bytes(data_dir),
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
        assert_eq!(available(Some(100), 30, Path::new("/")).unwrap(), 70);
        assert_eq!(available(Some(100), 300, Path::new("/")).unwrap(), 0);
        assert!(available(None, 0, Path::new("/")).is_ok());
    }
}
