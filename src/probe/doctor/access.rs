//! Could the kubelet reach a path? A kubelet running as root passes every permission check
//! (SELinux and AppArmor are out of scope), so this matters only for a kubelet that runs as
//! another user (rootless setups, user namespaces): every directory on the way needs search
//! permission, and a socket needs write permission, for its UID or one of its groups. With
//! several kubelets on a node each is checked with its own credentials.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::Host;

/// Who the kubelet is, from `/proc/<pid>/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub groups: Vec<u32>,
}

/// A kubelet process that does not run as root, whose permissions are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletUser {
    pub pid: u32,
    pub program: String,
    pub credentials: Credentials,
}

impl std::fmt::Display for KubeletUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let groups: Vec<String> = self.credentials.groups.iter().map(u32::to_string).collect();
        write!(
            f,
            "{} (pid {}) runs as UID {}",
            self.program, self.pid, self.credentials.uid
        )?;
        match groups.is_empty() {
            true => Ok(()),
            false => write!(f, " (groups {})", groups.join(",")),
        }
    }
}

/// The permission bits that apply to `who` for a file of this owner: owner, group or other.
fn applicable_bits(meta: &std::fs::Metadata, who: &Credentials) -> u32 {
    let mode = meta.mode();
    if meta.uid() == who.uid {
        (mode >> 6) & 0o7
    } else if who.groups.contains(&meta.gid()) {
        (mode >> 3) & 0o7
    } else {
        mode & 0o7
    }
}

/// What stops a kubelet that is not root: a directory it cannot search, or a socket it cannot
/// write to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {} is mode {mode:04o}, owner {uid}:{gid}", path.display())]
pub struct Blocked {
    /// `directory` or `socket`.
    pub what: &'static str,
    /// The host path.
    pub path: PathBuf,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl Blocked {
    fn new(what: &'static str, path: &Path, meta: &std::fs::Metadata) -> Self {
        Self {
            what,
            path: path.to_owned(),
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
        }
    }
}

/// Whether `who` can connect to the socket at `path` (a host path), as far as the directories
/// on the way and the socket's own mode decide.
pub fn can_connect(host: &Host, path: &Path, who: &Credentials) -> Result<(), Blocked> {
    if who.uid == 0 {
        return Ok(());
    }
    let mut dirs: Vec<&Path> = path.ancestors().skip(1).collect();
    dirs.reverse();
    for dir in dirs {
        let Ok(meta) = std::fs::metadata(host.path(dir)) else {
            continue;
        };
        if applicable_bits(&meta, who) & 0o1 == 0 {
            return Err(Blocked::new("directory", dir, &meta));
        }
    }
    match std::fs::metadata(host.path(path)) {
        Ok(meta) if applicable_bits(&meta, who) & 0o2 == 0 => {
            Err(Blocked::new("socket", path, &meta))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_closed_directory_on_the_way_stops_a_kubelet_that_is_not_root() {
        let dir = tempfile::tempdir().unwrap();
        let closed = dir.path().join("closed");
        std::fs::create_dir(&closed).unwrap();
        let socket = closed.join("csi.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        let owner = std::fs::metadata(&closed).unwrap().uid();
        let stranger = Credentials {
            uid: owner + 4242,
            groups: vec![],
        };
        let why = can_connect(&Host::default(), &socket, &stranger)
            .unwrap_err()
            .to_string();
        assert!(
            why.starts_with(&format!("directory {} is mode 0700", closed.display())),
            "{why}"
        );
        let root = Credentials {
            uid: 0,
            groups: vec![],
        };
        assert_eq!(can_connect(&Host::default(), &socket, &root), Ok(()));
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(can_connect(&Host::default(), &socket, &stranger), Ok(()));
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o755)).unwrap();
        let why = can_connect(&Host::default(), &socket, &stranger).unwrap_err();
        assert_eq!(why.what, "socket", "{why}");
    }
}
