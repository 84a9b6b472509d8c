//! Files an older node-server (or a careless operator) left readable or writable by others in
//! the state directory: the records and mount notes in the record directories, and the lock
//! file. Made 0600 at start by the owner, before anything is read, beside the directories
//! [`StateDir::make_private`](super::state_dir::StateDir::make_private) tightens.
//!
//! Each file is looked at by one `lstat` (a start with 1,000 volumes makes 1,000 of them); one
//! found loose is opened without following a link and changed through that descriptor, after
//! its type and mode are read again from it.

use std::fs::{File, Permissions};
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::path_io::PathIoError;

/// Makes every regular file directly in `dirs`, and each of `files`, 0600 where group or others
/// have any right to it; returns how many it changed. A file gone meanwhile is skipped.
pub fn tighten(dirs: &[&Path], files: &[&Path]) -> Result<usize, PathIoError> {
    let mut changed = 0;
    for dir in dirs {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(PathIoError::new("list", dir, e)),
        };
        for entry in entries {
            let entry = entry.map_err(PathIoError::at("list", dir))?;
            changed += usize::from(tighten_file(&entry.path())?);
        }
    }
    for file in files {
        changed += usize::from(tighten_file(file)?);
    }
    Ok(changed)
}

fn loose(meta: &std::fs::Metadata) -> bool {
    meta.file_type().is_file() && meta.mode() & 0o077 != 0
}

/// Whether the file at `path` was loose and is 0600 now.
fn tighten_file(path: &Path) -> Result<bool, PathIoError> {
    let gone = |e: &std::io::Error| e.kind() == ErrorKind::NotFound;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if loose(&meta) => {}
        Ok(_) => return Ok(false),
        Err(e) if gone(&e) => return Ok(false),
        Err(e) => return Err(PathIoError::new("inspect", path, e)),
    }
    use nix::libc::{O_CLOEXEC, O_NOFOLLOW, O_NONBLOCK};
    let opened = (File::options().read(true))
        .custom_flags(O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        .open(path);
    let file = match opened {
        Ok(file) => file,
        Err(e) if gone(&e) => return Ok(false),
        Err(e) => return Err(PathIoError::new("open", path, e)),
    };
    let meta = file.metadata().map_err(PathIoError::at("inspect", path))?;
    if !loose(&meta) {
        return Ok(false);
    }
    (file.set_permissions(Permissions::from_mode(0o600)))
        .map_err(PathIoError::at("tighten", path))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loose_files_become_0600_and_a_link_and_what_it_points_to_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let records = dir.path().join("meta");
        std::fs::create_dir(&records).unwrap();
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
        let set =
            |p: &Path, m: u32| std::fs::set_permissions(p, Permissions::from_mode(m)).unwrap();
        let (record, private, lock) = (
            records.join("v.json"),
            records.join("w.json"),
            dir.path().join("node-server.lock"),
        );
        for (file, m) in [(&record, 0o666), (&private, 0o600), (&lock, 0o644)] {
            std::fs::write(file, b"{}").unwrap();
            set(file, m);
        }
        let outside = dir.path().join("outside");
        std::fs::write(&outside, b"not ours").unwrap();
        set(&outside, 0o666);
        std::os::unix::fs::symlink(&outside, records.join("link.json")).unwrap();
        std::fs::create_dir(records.join("sub")).unwrap();
        set(&records.join("sub"), 0o755);

        let changed = tighten(&[&records], &[&lock]).unwrap();

        assert_eq!(changed, 2);
        assert_eq!(
            (mode(&record), mode(&private), mode(&lock)),
            (0o600, 0o600, 0o600)
        );
        assert_eq!(mode(&outside), 0o666, "a link is never followed");
        assert_eq!(
            mode(&records.join("sub")),
            0o755,
            "directories are not files"
        );
        assert_eq!(
            tighten(&[&records, &dir.path().join("gone")], &[]).unwrap(),
            0
        );
    }
}
