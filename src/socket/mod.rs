//! The one socket layer every mode uses: address parsing, binding with stale-socket cleanup and
//! permissions, a guard that removes only our own socket, a claim that lets one of several
//! would-be servers of a path bind it (`claim`), the wait for a path to change hands
//! (`handover_wait`), dialling with back-off (`dial`), and gRPC serving that accepts any
//! `:authority` (`authority`).
//!
//! Binding is careful because the paths are shared with other processes (the kubelet, a
//! previous instance of ourselves, an operator's files): a live socket is never stolen, a file
//! that is not a socket is never removed, and a socket that someone re-created after us is never
//! deleted by our shutdown.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::path_io::PathIoError;

mod authority;
pub mod claim;
mod dial;
mod handover_wait;
pub use authority::{AnyAuthority, MAX_BLOCK, Rewriter, frame, grpc_incoming};
pub use claim::Claim;
pub use dial::{DialError, connect, dial};
pub use handover_wait::{DirWatch, until_unserved};

/// A Unix socket address holds 108 bytes including the terminating NUL.
pub const MAX_PATH_BYTES: usize = 107;

/// Everything that can go wrong in this module; each variant names the path involved.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("socket address is empty")]
    EmptyAddress,
    #[error("socket address {0:?} is not an absolute path")]
    Relative(String),
    #[error(
        "socket path {} is {len} bytes; a Unix socket path holds at most {MAX_PATH_BYTES}",
        path.display()
    )]
    TooLong { path: PathBuf, len: usize },
    #[error("socket {} is in use by another process", .0.display())]
    InUse(PathBuf),
    #[error(
        "{} exists and is a {kind}, not a socket; refusing to replace it",
        path.display()
    )]
    NotASocket { path: PathBuf, kind: &'static str },
    #[error(transparent)]
    Io(#[from] PathIoError),
}

/// Parses `unix:///abs/path`, `unix:/abs/path` or `/abs/path` into a socket path.
pub fn parse_address(address: &str) -> Result<PathBuf, SocketError> {
    let path = address
        .strip_prefix("unix://")
        .or_else(|| address.strip_prefix("unix:"))
        .unwrap_or(address);
    if path.is_empty() {
        return Err(SocketError::EmptyAddress);
    }
    if !path.starts_with('/') {
        return Err(SocketError::Relative(address.to_owned()));
    }
    check_length(Path::new(path))?;
    Ok(PathBuf::from(path))
}

fn check_length(path: &Path) -> Result<(), SocketError> {
    let len = path.as_os_str().len();
    if len > MAX_PATH_BYTES {
        return Err(SocketError::TooLong {
            path: path.to_owned(),
            len,
        });
    }
    Ok(())
}

/// How a socket file is to be created.
#[derive(Debug, Clone, Copy)]
pub struct Permissions {
    /// File mode of the socket, e.g. 0o660.
    pub mode: u32,
    /// Group to own the socket, if not the process's.
    pub gid: Option<u32>,
}

/// Removes a stale socket at `path`, or explains why the path cannot be used.
fn clear_path(path: &Path) -> Result<(), SocketError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(PathIoError::at("inspect", path)(e).into()),
    };
    let kind = meta.file_type();
    if !kind.is_socket() {
        let kind = if kind.is_dir() {
            "directory"
        } else if kind.is_symlink() {
            "symbolic link"
        } else if kind.is_file() {
            "regular file"
        } else {
            "special file"
        };
        return Err(SocketError::NotASocket {
            path: path.to_owned(),
            kind,
        });
    }
    if has_listener(path)? {
        return Err(SocketError::InUse(path.to_owned()));
    }
    log::info!("removing stale socket {}", path.display());
    Ok(std::fs::remove_file(path).map_err(PathIoError::at("remove stale socket", path))?)
}

/// Whether a process still listens on the socket at `path`. Asked without blocking: a live
/// listener with a full backlog would otherwise hang the caller (the registrar has one thread).
fn has_listener(path: &Path) -> Result<bool, SocketError> {
    use nix::errno::Errno;
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, socket};
    use std::os::fd::AsRawFd;
    let probe_error =
        |e: Errno| SocketError::from(PathIoError::errno_at("probe existing socket", path)(e));
    let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
    let fd = socket(AddressFamily::Unix, SockType::Stream, flags, None).map_err(probe_error)?;
    let address = UnixAddr::new(path).map_err(probe_error)?;
    match connect(fd.as_raw_fd(), &address) {
        Ok(()) | Err(Errno::EAGAIN | Errno::EINPROGRESS) => Ok(true),
        Err(Errno::ECONNREFUSED) => Ok(false),
        Err(e) => Err(probe_error(e)),
    }
}

/// Whether `path` holds a socket some process is listening on (a missing path, a non-socket
/// or a stale socket: no).
pub fn is_served(path: &Path) -> bool {
    identity_of(path).is_some() && has_listener(path).unwrap_or(false)
}

/// Renames our staged socket to `path` without ever replacing what is there: whatever appeared
/// since `clear_path` looked goes through the same rules again (stale socket removed, live
/// socket or non-socket refused).
fn move_into_place(staged: &Path, path: &Path) -> Result<(), SocketError> {
    use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
    for _ in 0..3 {
        match renameat2(
            AT_FDCWD,
            staged,
            AT_FDCWD,
            path,
            RenameFlags::RENAME_NOREPLACE,
        ) {
            Ok(()) => return Ok(()),
            Err(nix::errno::Errno::EEXIST) => clear_path(path)?,
            Err(e) => {
                return Err(PathIoError::errno_at("move socket into place at", path)(e).into());
            }
        }
    }
    Err(SocketError::InUse(path.to_owned()))
}

/// Creates the directory `path` goes in (if missing) and returns it: 0755 whatever the umask,
/// since a world-writable parent would let anyone replace the socket.
fn create_parent(path: &Path) -> Result<&Path, SocketError> {
    let parent = path.parent().unwrap_or(Path::new("/"));
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o755)
        .create(parent)
        .map_err(PathIoError::at("create directory", parent))?;
    Ok(parent)
}

/// Binds a listening socket at `path` with the given permissions.
///
/// The socket is bound under a hidden temporary name in the same directory, given its mode and
/// group, and then renamed into place: the path appears only once it is listening with the
/// final permissions (a watcher such as the kubelet never sees a socket that refuses it, and no
/// process-wide umask is touched). Names starting with `.` are ignored by the kubelet.
pub fn bind(
    path: &Path,
    perms: Permissions,
) -> Result<(std::os::unix::net::UnixListener, SocketGuard), SocketError> {
    check_length(path)?;
    let parent = create_parent(path)?;
    clear_path(path)?;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Unique per process and moment: every container's main process is pid 1.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let temp = parent.join(format!(".{:x}{nanos:08x}.{file_name}", std::process::id()));
    let staged = if check_length(&temp).is_ok() {
        temp
    } else {
        path.to_owned()
    };
    clear_path(&staged)?;
    let listener = std::os::unix::net::UnixListener::bind(&staged)
        .map_err(PathIoError::at("bind", &staged))?;
    let finish = || -> Result<SocketGuard, SocketError> {
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(perms.mode))
            .map_err(PathIoError::at("set mode of", &staged))?;
        if let Some(gid) = perms.gid {
            std::os::unix::fs::lchown(&staged, None, Some(gid))
                .map_err(PathIoError::at("set group of", &staged))?;
        }
        if staged != path {
            move_into_place(&staged, path)?;
        }
        let identity = identity_of(path).ok_or_else(|| {
            let vanished = io::Error::other("socket vanished right after it was created");
            PathIoError::new("inspect", path, vanished)
        })?;
        Ok(SocketGuard::new(path.to_owned(), identity))
    };
    match finish() {
        Ok(guard) => Ok((listener, guard)),
        Err(e) => {
            let _ = std::fs::remove_file(&staged);
            Err(e)
        }
    }
}

/// Async flavour of [`bind`] for tokio servers.
pub fn bind_tokio(
    path: &Path,
    perms: Permissions,
) -> Result<(tokio::net::UnixListener, SocketGuard), SocketError> {
    let (listener, guard) = bind(path, perms)?;
    listener
        .set_nonblocking(true)
        .map_err(PathIoError::at("configure", path))?;
    let listener =
        tokio::net::UnixListener::from_std(listener).map_err(PathIoError::at("register", path))?;
    Ok((listener, guard))
}

/// Which socket file a path holds: device and inode, plus the modification time set when the
/// socket was bound, because filesystems hand a freed inode number to the next file created (a
/// successor's socket made right after ours was deleted often gets our old number). The
/// modification time, unlike the change time, survives chmod, chown and rename.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    dev: u64,
    ino: u64,
    mtime: (i64, i64),
}

/// The identity of the socket at `path`, if it holds a socket (symlinks are not followed).
pub fn identity_of(path: &Path) -> Option<Identity> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    meta.file_type().is_socket().then(|| Identity {
        dev: meta.dev(),
        ino: meta.ino(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
    })
}

/// Sockets this process created and still owns, for the forced-exit path in `shutdown`.
static OWNED: Mutex<Vec<(PathBuf, Identity)>> = Mutex::new(Vec::new());

fn owned() -> std::sync::MutexGuard<'static, Vec<(PathBuf, Identity)>> {
    crate::mutex::lock(&OWNED)
}

/// Removes the socket file when dropped, but only if the path still holds the very socket we
/// created (same device, inode and modification time, see [`Identity`]): a successor that
/// re-created the path keeps its socket.
#[derive(Debug)]
pub struct SocketGuard {
    path: PathBuf,
    identity: Identity,
}

impl SocketGuard {
    fn new(path: PathBuf, identity: Identity) -> Self {
        owned().push((path.clone(), identity));
        Self { path, identity }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True while the path still holds our socket.
    pub fn is_ours(&self) -> bool {
        identity_of(&self.path) == Some(self.identity)
    }
}

fn remove_if_ours(path: &Path, identity: Identity) {
    if identity_of(path) != Some(identity) {
        log::debug!(
            "not removing {}: it is no longer our socket",
            path.display()
        );
        return;
    }
    match std::fs::remove_file(path) {
        Ok(()) => log::debug!("removed socket {}", path.display()),
        Err(e) => log::warn!("could not remove socket {}: {e}", path.display()),
    }
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        remove_if_ours(&self.path, self.identity);
        owned().retain(|(p, i)| !(p == &self.path && *i == self.identity));
    }
}

/// Removes every socket this process still owns; for exits that skip destructors.
pub fn remove_owned_sockets() {
    let owned = std::mem::take(&mut *owned());
    for (path, identity) in owned {
        remove_if_ours(&path, identity);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_in_every_accepted_form_parse_to_the_same_path() {
        for address in [
            "unix:///csi/csi.sock",
            "unix:/csi/csi.sock",
            "/csi/csi.sock",
        ] {
            assert_eq!(
                parse_address(address).unwrap(),
                PathBuf::from("/csi/csi.sock"),
                "{address}"
            );
        }
    }

    #[test]
    fn empty_and_relative_addresses_are_refused_by_name() {
        assert!(matches!(parse_address(""), Err(SocketError::EmptyAddress)));
        assert!(matches!(
            parse_address("unix://"),
            Err(SocketError::EmptyAddress)
        ));
        let err = parse_address("unix://csi.sock").unwrap_err().to_string();
        assert!(
            err.contains("\"unix://csi.sock\"") && err.contains("absolute"),
            "{err}"
        );
    }

    #[test]
    fn an_over_long_path_names_the_path_and_the_limit() {
        let long = format!("/{}", "a".repeat(107));
        let err = parse_address(&long).unwrap_err().to_string();
        assert!(
            err.contains(&long) && err.contains("108 bytes") && err.contains("107"),
            "{err}"
        );
        assert!(parse_address(&format!("/{}", "a".repeat(106))).is_ok());
    }

    #[test]
    fn moving_into_place_never_replaces_what_appeared_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let staged = dir.path().join(".staged");
        let path = dir.path().join("csi.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&staged).unwrap();
        std::fs::write(&path, b"someone's file").unwrap();
        let err = move_into_place(&staged, &path).unwrap_err();
        assert!(matches!(err, SocketError::NotASocket { .. }), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"someone's file");
        std::fs::remove_file(&path).unwrap();
        let live = std::os::unix::net::UnixListener::bind(&path).unwrap();
        assert!(matches!(
            move_into_place(&staged, &path),
            Err(SocketError::InUse(_))
        ));
        drop(live); // now stale: removed, and ours takes its place
        move_into_place(&staged, &path).unwrap();
        assert!(!staged.exists() && identity_of(&path).is_some());
    }
}
