//! Reading the kubelet's directories without touching them: the entries of `plugins_registry`
//! (walked recursively, as the kubelet does) and the driver sockets under `plugins/`. Only
//! `lstat`, `stat` and `readdir`; nothing is created, and no walk crosses into another
//! filesystem (volume mounts live under `plugins/kubernetes.io/`, and a hung network mount must
//! not hang the doctor).

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::Host;

/// What a directory entry is, as `stat` (following links) sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Socket,
    Regular,
    Directory,
    /// A symbolic link whose target does not exist.
    DanglingLink,
    Fifo,
    BlockDevice,
    CharDevice,
}

impl Kind {
    pub fn describe(self) -> &'static str {
        match self {
            Self::Socket => "socket",
            Self::Regular => "regular file",
            Self::Directory => "directory",
            Self::DanglingLink => "dangling symbolic link",
            Self::Fifo => "FIFO (named pipe)",
            Self::BlockDevice => "block device",
            Self::CharDevice => "character device",
        }
    }

    /// The kind of the host path `path`, following links inside the host root only: a link
    /// whose target is not there (on the host) is dangling.
    pub fn at(host: &Host, path: &Path) -> io::Result<Option<Kind>> {
        match Self::of(&host.path(path))? {
            None if std::fs::symlink_metadata(host.entry(path)).is_ok() => {
                Ok(Some(Kind::DanglingLink))
            }
            kind => Ok(kind),
        }
    }

    /// The kind of `path`, following links; `None` if nothing is there.
    pub fn of(path: &Path) -> io::Result<Option<Kind>> {
        let meta = match std::fs::metadata(path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(std::fs::symlink_metadata(path)
                    .is_ok()
                    .then_some(Kind::DanglingLink));
            }
            Err(e) => return Err(e),
        };
        let kind = meta.file_type();
        Ok(Some(if kind.is_socket() {
            Kind::Socket
        } else if kind.is_file() {
            Kind::Regular
        } else if kind.is_dir() {
            Kind::Directory
        } else if kind.is_fifo() {
            Kind::Fifo
        } else if kind.is_block_device() {
            Kind::BlockDevice
        } else {
            Kind::CharDevice
        }))
    }
}

/// Whether `path` is named as a registration socket (`<driver>-reg.sock`).
pub fn registration_name(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| crate::plugin_registry::driver_of(&n.to_string_lossy()).is_some())
}

/// One entry of the registry, by its host path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: PathBuf,
    pub kind: Kind,
}

impl Entry {
    /// The kubelet ignores names starting with a dot.
    pub fn hidden(&self) -> bool {
        self.path
            .file_name()
            .is_some_and(|n| n.as_encoded_bytes().starts_with(b"."))
    }
}

/// How deep the walks go: the kubelet's registry is flat in practice, drivers keep their
/// socket in `plugins/<driver>/`.
const REGISTRY_DEPTH: usize = 4;
const PLUGINS_DEPTH: usize = 2;

/// Entries of a directory in lexical order, with their host paths.
fn list(host: &Host, dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut names: Vec<_> = std::fs::read_dir(host.path(dir))?
        .filter_map(|entry| entry.ok().map(|e| e.file_name()))
        .collect();
    names.sort();
    Ok(names.into_iter().map(|name| dir.join(name)).collect())
}

/// Every non-directory entry below `registry` (a host path), in walk order. Subdirectories
/// are walked (the kubelet watches recursively), links to directories are not.
pub fn registry(host: &Host, registry: &Path) -> io::Result<Vec<Entry>> {
    let device = std::fs::metadata(host.path(registry))?.dev();
    // The registry itself must be listable: an unreadable one is not an empty one.
    list(host, registry)?;
    let mut out = Vec::new();
    let mut pending = vec![(registry.to_owned(), 0)];
    while let Some((dir, depth)) = pending.pop() {
        let Ok(children) = list(host, &dir) else {
            continue;
        };
        for path in children.into_iter().rev() {
            let is_dir = std::fs::symlink_metadata(host.entry(&path))
                .is_ok_and(|m| m.is_dir() && m.dev() == device);
            if is_dir {
                // A directory with a registration socket's name stops both registrars.
                if registration_name(&path) {
                    out.push(Entry {
                        path: path.clone(),
                        kind: Kind::Directory,
                    });
                }
                if depth + 1 < REGISTRY_DEPTH {
                    pending.push((path, depth + 1));
                }
                continue;
            }
            if let Ok(Some(kind)) = Kind::at(host, &path) {
                out.push(Entry { path, kind });
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// Sockets in `plugins/` and `plugins/<dir>/` (host paths), skipping `kubernetes.io`, where the
/// kubelet keeps volume mounts, and every other filesystem.
pub fn plugin_sockets(host: &Host, plugins: &Path) -> Vec<PathBuf> {
    let Ok(meta) = std::fs::metadata(host.path(plugins)) else {
        return Vec::new();
    };
    let device = meta.dev();
    let mut out = Vec::new();
    let mut pending = vec![(plugins.to_owned(), 0)];
    while let Some((dir, depth)) = pending.pop() {
        for path in list(host, &dir).unwrap_or_default() {
            if path.file_name().is_some_and(|n| n == "kubernetes.io") {
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(host.entry(&path)) else {
                continue;
            };
            if meta.dev() != device {
                continue;
            }
            if meta.is_dir() {
                if depth + 1 < PLUGINS_DEPTH {
                    pending.push((path, depth + 1));
                }
            } else if meta.file_type().is_socket() {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Device and inode of the file at `path` (following links): the same socket reached by two
/// spellings of its path is one socket.
pub fn file_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_walk_finds_entries_in_subdirectories_in_lexical_order() {
        let dir = tempfile::tempdir().unwrap();
        let registry = dir.path().join("plugins_registry");
        std::fs::create_dir_all(registry.join("sub")).unwrap();
        let _a = std::os::unix::net::UnixListener::bind(registry.join("b-reg.sock")).unwrap();
        let _b = std::os::unix::net::UnixListener::bind(registry.join("sub/a-reg.sock")).unwrap();
        std::fs::write(registry.join("a.txt"), b"x").unwrap();
        let host = Host::default();
        let entries = super::registry(&host, &registry).unwrap();
        let seen: Vec<(String, Kind)> = entries
            .iter()
            .map(|e| {
                let rel = e.path.strip_prefix(&registry).unwrap();
                (rel.display().to_string(), e.kind)
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("a.txt".to_owned(), Kind::Regular),
                ("b-reg.sock".to_owned(), Kind::Socket),
                ("sub/a-reg.sock".to_owned(), Kind::Socket),
            ]
        );
    }

    #[test]
    fn plugin_sockets_skip_the_kubelets_volume_directory_and_deeper_levels() {
        let dir = tempfile::tempdir().unwrap();
        let plugins = dir.path().join("plugins");
        for sub in ["d1", "kubernetes.io/csi", "d2/deeper"] {
            std::fs::create_dir_all(plugins.join(sub)).unwrap();
        }
        let bind = |p: &str| std::os::unix::net::UnixListener::bind(plugins.join(p)).unwrap();
        let _l = [
            bind("d1/csi.sock"),
            bind("kubernetes.io/csi/x.sock"),
            bind("d2/deeper/y.sock"),
        ];
        assert_eq!(
            plugin_sockets(&Host::default(), &plugins),
            [plugins.join("d1/csi.sock")]
        );
    }
}
