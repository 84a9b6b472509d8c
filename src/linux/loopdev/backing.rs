//! The block volume's file: sparse, exactly its size, created so that a crash leaves either
//! no file or the whole one (an `O_TMPFILE` inode, sized and synced, then linked in: there is
//! not even a temporary name to clean up), and grown, never shrunk.

use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, AtFlags, OFlag};
use nix::unistd::linkat;

use super::loop_error::LoopError;
use crate::path_io::PathIoError;

/// Loop devices count in 512-byte sectors; a tail shorter than that would be invisible.
const SECTOR: u64 = 512;

fn check_size(path: &Path, size: u64) -> Result<(), LoopError> {
    if size == 0 || !size.is_multiple_of(SECTOR) {
        return Err(LoopError::InvalidSize {
            path: path.to_owned(),
            size,
        });
    }
    Ok(())
}

/// Makes `path` a sparse file of exactly `size` bytes (mode 0600). Idempotent: an existing
/// regular file of that size is accepted (`Ok(false)`); of another size it is an error, never
/// changed. `Ok(true)`: created now, and durable.
pub fn create_backing_file(path: &Path, size: u64) -> Result<bool, LoopError> {
    create_backing_file_with(path, size, |_| Ok(()))
}

/// [`create_backing_file`], with `init` writing the new file's first content (and allocating
/// it, if it will) before it is sized, synced and given its name: a crash leaves no file or a
/// whole one.
pub fn create_backing_file_with(
    path: &Path,
    size: u64,
    init: impl FnOnce(&File) -> std::io::Result<()>,
) -> Result<bool, LoopError> {
    check_size(path, size)?;
    if existing_size(path)?.is_some() {
        return matches_existing(path, size);
    }
    let (parent, name) = match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) if !parent.as_os_str().is_empty() => (parent, name),
        _ => (Path::new("."), path.as_os_str()),
    };
    let dir = File::open(parent).map_err(PathIoError::at("open", parent))?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(OFlag::O_TMPFILE.bits() | OFlag::O_CLOEXEC.bits())
        .open(parent)
        .map_err(PathIoError::at("create an unnamed file in", parent))?;
    init(&file).map_err(PathIoError::at("write", path))?;
    file.set_len(size).map_err(PathIoError::at("size", path))?;
    file.sync_all().map_err(PathIoError::at("sync", path))?;
    // Linking the descriptor gives the inode its name atomically, and never over another.
    let fd_path = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&file)
    ));
    match linkat(
        AT_FDCWD,
        &fd_path,
        dir.as_fd(),
        name,
        AtFlags::AT_SYMLINK_FOLLOW,
    ) {
        Ok(()) => {}
        // Made meanwhile by someone else: judge it as if it had been there.
        Err(Errno::EEXIST) => return matches_existing(path, size),
        Err(e) => return Err(PathIoError::errno_at("link", path)(e).into()),
    }
    dir.sync_all().map_err(PathIoError::at("sync", parent))?;
    Ok(true)
}

/// `Ok(false)` if the file at `path` has exactly `size` bytes.
fn matches_existing(path: &Path, size: u64) -> Result<bool, LoopError> {
    match existing_size(path)? {
        Some(existing) if existing == size => Ok(false),
        Some(existing) => Err(LoopError::SizeMismatch {
            path: path.to_owned(),
            size: existing,
            requested: size,
        }),
        None => Err(PathIoError::errno_at("create", path)(Errno::ENOENT).into()),
    }
}

/// The size of the regular file at `path`; `None` if nothing is there.
fn existing_size(path: &Path) -> Result<Option<u64>, LoopError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_file() => Ok(Some(meta.size())),
        Ok(_) => Err(LoopError::NotARegularFile(path.to_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(PathIoError::at("stat", path)(e).into()),
    }
}

/// Opens the volume's file at `path` as `options` say, never through a symlink, and reads its
/// metadata: anything but a regular file is refused.
pub(super) fn open_backing_file(
    path: &Path,
    options: &mut OpenOptions,
) -> Result<(File, std::fs::Metadata), LoopError> {
    let file = options
        .custom_flags(OFlag::O_NOFOLLOW.bits() | OFlag::O_CLOEXEC.bits())
        .open(path)
        .map_err(PathIoError::at("open", path))?;
    let meta = file.metadata().map_err(PathIoError::at("stat", path))?;
    if !meta.file_type().is_file() {
        return Err(LoopError::NotARegularFile(path.to_owned()));
    }
    Ok((file, meta))
}

/// Grows the file at `path` to `size` bytes (the new part is a hole) and makes that durable;
/// returns the size before. The same size is a no-op; a smaller one is refused.
pub fn grow_backing_file(path: &Path, size: u64) -> Result<u64, LoopError> {
    check_size(path, size)?;
    let (file, meta) = open_backing_file(path, OpenOptions::new().write(true))?;
    let before = meta.size();
    if size < before {
        return Err(LoopError::Shrink {
            path: path.to_owned(),
            size: before,
            requested: size,
        });
    }
    if size > before {
        file.set_len(size).map_err(PathIoError::at("grow", path))?;
        file.sync_all().map_err(PathIoError::at("sync", path))?;
    }
    Ok(before)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_volume_file_is_sparse_exactly_its_size_and_created_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("vol");
        assert!(create_backing_file(&path, 1 << 30).expect("create"));
        let meta = std::fs::metadata(&path).expect("stat");
        assert_eq!(meta.size(), 1 << 30);
        assert!(meta.blocks() < 64, "not sparse: {} blocks", meta.blocks());
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert!(
            !create_backing_file(&path, 1 << 30).expect("again"),
            "same size: nothing to do"
        );
        let err = create_backing_file(&path, 2 << 30).expect_err("another size");
        assert!(
            matches!(err, LoopError::SizeMismatch { size, .. } if size == 1 << 30),
            "{err}"
        );
        let names: Vec<_> = std::fs::read_dir(dir.path()).expect("list").collect();
        assert_eq!(names.len(), 1, "no temporary name is ever left");
    }

    #[test]
    fn sizes_that_are_not_whole_sectors_are_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        for size in [0, 511, 4097] {
            let err = create_backing_file(&dir.path().join("vol"), size).expect_err("bad size");
            assert!(matches!(err, LoopError::InvalidSize { .. }), "{err}");
        }
        assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 0);
    }

    #[test]
    fn a_block_volume_file_grows_keeps_its_data_and_never_shrinks() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("vol");
        create_backing_file(&path, 1 << 20).expect("create");
        std::fs::write(&path, b"data").expect("write");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open")
            .set_len(1 << 20)
            .expect("size");
        assert_eq!(grow_backing_file(&path, 8 << 20).expect("grow"), 1 << 20);
        assert_eq!(std::fs::metadata(&path).expect("stat").size(), 8 << 20);
        assert_eq!(&std::fs::read(&path).expect("read")[..4], b"data");
        assert_eq!(
            grow_backing_file(&path, 8 << 20).expect("same size"),
            8 << 20
        );
        let err = grow_backing_file(&path, 4 << 20).expect_err("shrink");
        assert!(matches!(err, LoopError::Shrink { .. }), "{err}");
        assert_eq!(std::fs::metadata(&path).expect("stat").size(), 8 << 20);
    }
}
