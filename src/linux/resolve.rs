//! Paths from requests resolved the careful way: one component at a time with `lstat`,
//! following a symbolic link only where nobody but root could have put it, and the mount point
//! itself then made or removed through its parent opened with `openat2(RESOLVE_NO_SYMLINKS)`,
//! so a link swapped in after the check makes the call fail instead of landing elsewhere.
//!
//! "Only root could have put it": the link and the directory holding it are owned by root, and
//! that directory is writable by nobody else (no group or other write bit). A node whose
//! `/var/lib/kubelet` is a symlink made by its administrator keeps working; a link a pod or a
//! local user planted in a directory they can write is refused.

use std::ffi::OsStr;
use std::io::ErrorKind;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;

use crate::path_io::PathIoError;

/// The kernel's own limit on links followed in one lookup.
const MAX_LINKS: usize = 40;

/// Why a path cannot be resolved safely.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// A link in a directory others can write, or owned by someone else.
    #[error("{} is a symbolic link that root did not place (not followed)", .0.display())]
    UntrustedLink(PathBuf),
    #[error("too many symbolic links resolving {}", .0.display())]
    TooManyLinks(PathBuf),
    /// Looking at a component (`resolve /a/b: Permission denied`).
    #[error(transparent)]
    Io(#[from] PathIoError),
}

/// Whether a link at `link` (with `meta` its `lstat`) was placed by root in a directory only
/// root can write.
fn trusted(link: &Path, meta: &std::fs::Metadata) -> bool {
    let Some(dir) = link.parent() else {
        return false;
    };
    let Ok(dir_meta) = std::fs::symlink_metadata(dir) else {
        return false;
    };
    meta.uid() == 0 && dir_meta.uid() == 0 && dir_meta.mode() & 0o022 == 0
}

/// The absolute path `path` (normalised: no `..`) names, with every trusted link replaced by
/// what it points to; `Ok(None)` when a component does not exist. The result has no symbolic
/// link in it, so it can be compared with mount points and opened with
/// [`open_dir_no_symlinks`].
pub fn canonical(path: &Path) -> Result<Option<PathBuf>, ResolveError> {
    match without_links(path) {
        Some(plain) => Ok(Some(plain)),
        None => walk(path),
    }
}

/// `path` made absolute, when the kernel resolves all of it without meeting a symbolic link
/// (`openat2` with `RESOLVE_NO_SYMLINKS`): [`walk`] would return the same path, at one `lstat`
/// per prefix (nine on a kubelet's target path, every call). Anything else (a link, a missing
/// component, a kernel before 5.6) is left to the walk, and so is a path with `..`, which the
/// walk stops at a missing component before going back up.
fn without_links(path: &Path) -> Option<PathBuf> {
    let mut plain = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::Normal(part) => plain.push(part),
            Component::ParentDir => return None,
            _ => {}
        }
    }
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    nix::fcntl::openat2(nix::fcntl::AT_FDCWD, &plain, how)
        .ok()
        .map(|_| plain)
}

/// [`canonical`] the careful way: one component at a time with `lstat`.
fn walk(path: &Path) -> Result<Option<PathBuf>, ResolveError> {
    let mut pending: Vec<PathBuf> = rev_parts(path);
    let mut out = PathBuf::from("/");
    let mut links = 0;
    while let Some(part) = pending.pop() {
        if part.as_os_str() == ".." {
            out.pop();
            continue;
        }
        let next = out.join(&part);
        let meta = match std::fs::symlink_metadata(&next) {
            Ok(meta) => meta,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(PathIoError::new("resolve", &next, source).into()),
        };
        if !meta.file_type().is_symlink() {
            out = next;
            continue;
        }
        links += 1;
        if links > MAX_LINKS {
            return Err(ResolveError::TooManyLinks(path.to_owned()));
        }
        if !trusted(&next, &meta) {
            return Err(ResolveError::UntrustedLink(next));
        }
        let to = std::fs::read_link(&next).map_err(PathIoError::at("resolve", &next))?;
        if to.is_absolute() {
            out = PathBuf::from("/");
        }
        pending.extend(rev_parts(&to));
    }
    Ok(Some(out))
}

/// A path's normal components (and `..`), last first, for a stack.
fn rev_parts(path: &Path) -> Vec<PathBuf> {
    let mut parts: Vec<PathBuf> = (path.components())
        .filter_map(|c| match c {
            Component::Normal(p) => Some(PathBuf::from(p)),
            Component::ParentDir => Some(PathBuf::from("..")),
            _ => None,
        })
        .collect();
    parts.reverse();
    parts
}

/// Opens a directory (`O_PATH`) refusing any symbolic link on the way (`ELOOP`).
pub fn open_dir_no_symlinks(path: &Path) -> nix::Result<OwnedFd> {
    open_no_symlinks(path, OFlag::O_DIRECTORY)
}

/// Opens `path` (`O_PATH`, with `flags` such as `O_DIRECTORY`) refusing any symbolic link on
/// the way, in any component (`ELOOP`): what is opened is what the link-free path named at
/// that instant, and every later step acts on the descriptor. Kernels before 5.6 have no
/// `openat2`; there only a link as the last component is refused.
pub fn open_no_symlinks(path: &Path, flags: OFlag) -> nix::Result<OwnedFd> {
    open_no_symlinks_in(nix::fcntl::AT_FDCWD, path, flags)
}

/// [`open_no_symlinks`] of `path` relative to the directory `dir` is open on.
pub fn open_no_symlinks_in(
    dir: impl AsFd,
    path: &(impl AsRef<OsStr> + ?Sized),
    flags: OFlag,
) -> nix::Result<OwnedFd> {
    let path = Path::new(path.as_ref());
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC | flags)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    match nix::fcntl::openat2(&dir, path, how) {
        Err(Errno::ENOSYS) => nix::fcntl::openat(
            &dir,
            path,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | flags,
            Mode::empty(),
        ),
        other => other,
    }
}

/// `path`'s parent opened with [`open_dir_no_symlinks`], and its last component.
fn parent_of(path: &Path) -> std::io::Result<(OwnedFd, &OsStr)> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(ErrorKind::InvalidInput.into());
    };
    Ok((open_dir_no_symlinks(parent)?, name))
}

/// `mkdir` of `path` (0750) inside its parent opened without following links.
pub fn make_dir(path: &Path) -> std::io::Result<()> {
    let (dir, name) = parent_of(path)?;
    Ok(nix::sys::stat::mkdirat(
        &dir,
        name,
        Mode::from_bits_truncate(0o750),
    )?)
}

/// Creates the empty file `path` (0600; it must not exist) inside its parent opened without
/// following links.
pub fn make_file(path: &Path) -> std::io::Result<()> {
    let (dir, name) = parent_of(path)?;
    let flags = OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW;
    nix::fcntl::openat(
        &dir,
        name,
        flags | OFlag::O_CLOEXEC,
        Mode::S_IRUSR | Mode::S_IWUSR,
    )?;
    Ok(())
}

/// Removes the empty directory (`dir`) or the file `path` inside its parent opened without
/// following links; a link there is removed itself, never what it points to.
pub fn remove(path: &Path, dir: bool) -> std::io::Result<()> {
    use nix::unistd::UnlinkatFlags;
    let (parent, name) = parent_of(path)?;
    let flag = match dir {
        true => UnlinkatFlags::RemoveDir,
        false => UnlinkatFlags::NoRemoveDir,
    };
    Ok(nix::unistd::unlinkat(&parent, name, flag)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_without_links_is_itself_and_a_missing_component_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().canonicalize().unwrap();
        std::fs::create_dir(real.join("a")).unwrap();
        assert_eq!(canonical(&real.join("a")).unwrap(), Some(real.join("a")));
        assert_eq!(canonical(&real.join("a/missing")).unwrap(), None);
    }

    #[test]
    fn the_kernels_answer_for_a_path_without_links_is_the_walks_and_a_link_is_left_to_the_walk() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(real.join("a/b")).unwrap();
        for path in [real.join("a/b"), real.join("a/./b/"), PathBuf::from("/")] {
            assert_eq!(
                without_links(&path),
                walk(&path).unwrap(),
                "{}",
                path.display()
            );
        }
        std::os::unix::fs::symlink(real.join("a"), real.join("link")).unwrap();
        assert_eq!(without_links(&real.join("link/b")), None);
        assert_eq!(without_links(&real.join("a/missing")), None);
        if nix::unistd::Uid::effective().is_root() {
            // Root's link in root's own directory is followed: by the walk.
            assert_eq!(
                canonical(&real.join("link/b")).unwrap(),
                Some(real.join("a/b"))
            );
        }
    }

    #[test]
    fn a_path_going_back_up_from_a_missing_component_is_missing_as_the_walk_finds_it() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().canonicalize().unwrap();
        std::fs::create_dir(real.join("a")).unwrap();
        assert_eq!(canonical(&real.join("missing/../a")).unwrap(), None);
        assert_eq!(
            canonical(&real.join("a/../a")).unwrap(),
            Some(real.join("a"))
        );
    }

    #[test]
    fn a_link_in_a_directory_others_can_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().canonicalize().unwrap();
        let open = real.join("open");
        std::fs::create_dir(&open).unwrap();
        std::os::unix::fs::symlink("/", open.join("link")).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::from_mode(0o777);
        std::fs::set_permissions(&open, mode).unwrap();
        let err = canonical(&open.join("link/etc")).unwrap_err();
        assert!(matches!(err, ResolveError::UntrustedLink(at) if at == open.join("link")));
    }

    #[test]
    fn a_loop_of_links_is_refused_not_followed_forever() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().canonicalize().unwrap();
        std::os::unix::fs::symlink(real.join("b"), real.join("a")).unwrap();
        std::os::unix::fs::symlink(real.join("a"), real.join("b")).unwrap();
        let owner_is_root = nix::unistd::Uid::effective().is_root();
        match canonical(&real.join("a/x")) {
            Err(ResolveError::TooManyLinks(_)) => assert!(owner_is_root),
            Err(ResolveError::UntrustedLink(_)) => assert!(!owner_is_root),
            other => panic!("{other:?}"),
        }
    }
}
