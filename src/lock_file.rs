//! Lock files that say who holds them: opened without following a link, root-only, and signed
//! by the holder with its pid and host name, so a second process waiting on the `flock` can
//! log whom it waits for. In a pod the host name is the pod's name, and every container's pid
//! is 1.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Opens (creating, 0600) the lock file at `path`, never through a symlink.
pub fn open(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Whether `path` still names the open file `file` (by device and inode): a lock file that was
/// unlinked or replaced while it was locked is no lock any more.
pub fn still_at(path: &Path, file: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::symlink_metadata(path), file.metadata()) {
        (Ok(at_path), Ok(open)) => at_path.dev() == open.dev() && at_path.ino() == open.ino(),
        _ => false,
    }
}

/// Writes this process's signature into the lock file it now holds.
pub fn sign(file: &mut File) -> io::Result<()> {
    let me = format!("pid {} on {}", std::process::id(), host_name());
    file.set_len(0)?;
    file.rewind()?;
    file.write_all(me.as_bytes())
}

/// What the holder wrote into the lock file (bounded, control characters replaced: another
/// process wrote it).
pub fn holder(file: &mut File) -> String {
    let mut text = String::new();
    let _ = file.take(200).read_to_string(&mut text);
    match text.trim() {
        "" => "holder unknown".to_owned(),
        text => text.replace(|c: char| c.is_control(), "?"),
    }
}

fn host_name() -> String {
    crate::node_name::host_name().unwrap_or_else(|_| "an unknown host".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_lock_file_names_this_process_and_an_empty_one_an_unknown_holder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let mut file = open(&path).unwrap();
        assert_eq!(holder(&mut open(&path).unwrap()), "holder unknown");
        sign(&mut file).unwrap();
        let named = holder(&mut open(&path).unwrap());
        assert!(
            named.starts_with(&format!("pid {} on ", std::process::id())),
            "{named}"
        );
    }
}
