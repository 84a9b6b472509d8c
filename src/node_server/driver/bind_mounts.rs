//! Stage, publish, unpublish and unstage as bind mounts, decided by the kernel.
//!
//! A mount "is this volume" exactly when its root is the volume's data directory (the same
//! device and inode, see [`mountpoint`](crate::linux::mountpoint)), so every answer —
//! already staged? published compatibly? — comes from the kernel, after a restart as much
//! as before it, asked of the one path concerned: its cost does not grow with the node's
//! mount table. Only "is this volume mounted anywhere else?" (a single-writer publish) reads
//! the whole table, as nothing in the kernel answers it per path. Every function here blocks.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::csi_spec::Field;
use crate::linux::mount::{MountError, MountOptions, Mounter};
use crate::linux::mountinfo::Unlocatable;
use crate::linux::mountpoint::Shown;
use crate::linux::resolve::{self as linux_resolve, ResolveError};

/// Why a mount point or a mount cannot be what a request asks; each names the request field
/// and the path.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("{field} has no parent")]
    NoParent { field: Field },
    #[error("{field} {} is a symbolic link", path.display())]
    Symlink { field: Field, path: PathBuf },
    #[error("{field} {} exists and is not a directory", path.display())]
    NotADirectory { field: Field, path: PathBuf },
    /// A block volume's target that is there already and is not a regular file.
    #[error("{} {} exists and is not a regular file", Field::TargetPath, path.display())]
    NotAFile { path: PathBuf },
    #[error("create {field} {}: {source}", path.display())]
    CreateMountPoint {
        field: Field,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "volume is already mounted at {field} {} with other options ({options})",
        path.display()
    )]
    OtherOptions {
        field: Field,
        path: PathBuf,
        options: String,
    },
    #[error("{field} {} already holds another mount", path.display())]
    OtherMount { field: Field, path: PathBuf },
    #[error(
        "volume is not staged at {}: NodeStageVolume must succeed first",
        staging.display()
    )]
    NotStaged { staging: PathBuf },
    #[error("SINGLE_NODE_SINGLE_WRITER volume is already published at {}", at.display())]
    PublishedElsewhere { at: PathBuf },
    #[error(
        "{field} {} holds a mount that is not this volume; leaving it alone",
        path.display()
    )]
    ForeignMount { field: Field, path: PathBuf },
    /// A symlink on the way that root did not place, or a loop of them.
    #[error("{field} {}: {source}", path.display())]
    Resolve {
        field: Field,
        path: PathBuf,
        #[source]
        source: ResolveError,
    },
    #[error(transparent)]
    Unlocatable(#[from] Unlocatable),
    #[error("{op} {field} {}: {source}", path.display())]
    Io {
        op: &'static str,
        field: Field,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Mount(#[from] MountError),
}

/// Resolves a request path the way the kernel will see it, without following a symlink out of
/// place: symlinks in the parent are followed only where root placed them (see
/// [`resolve`](crate::linux::resolve); mount points in mountinfo are canonical), a symlink as
/// the last component is refused (a mount there would land wherever it points).
/// `Ok(None)`: the parent is missing.
pub fn resolve(field: Field, path: &Path) -> Result<Option<PathBuf>, BindError> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(BindError::NoParent { field });
    };
    let Some(parent) = linux_resolve::canonical(parent).map_err(|source| BindError::Resolve {
        field,
        path: path.to_owned(),
        source,
    })?
    else {
        return Ok(None);
    };
    let resolved = parent.join(name);
    match std::fs::symlink_metadata(&resolved) {
        Ok(meta) if meta.file_type().is_symlink() => Err(BindError::Symlink {
            field,
            path: path.to_owned(),
        }),
        _ => Ok(Some(resolved)),
    }
}

/// Creates the mount point itself (never its parents: those are the CO's), through its parent
/// opened without following links. `Ok(true)`: created now.
pub(super) fn make_mount_point(field: Field, path: &Path) -> Result<bool, BindError> {
    match linux_resolve::make_dir(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.is_dir() => Ok(false),
            _ => Err(BindError::NotADirectory {
                field,
                path: path.to_owned(),
            }),
        },
        Err(source) => Err(BindError::CreateMountPoint {
            field,
            path: path.to_owned(),
            source,
        }),
    }
}

/// Checks an existing mount at `path` against a request: `Ok(true)` when it is this volume
/// with compatible options (nothing to do), `Ok(false)` when nothing is mounted there.
fn already_there(
    mounter: &dyn Mounter,
    field: Field,
    path: &Path,
    source: Shown,
    options: &MountOptions,
) -> Result<bool, BindError> {
    match mounter.mount_at(path)? {
        None => Ok(false),
        Some(top) if top.shows == source && options.satisfied_by(&top) => Ok(true),
        Some(top) if top.shows == source => Err(BindError::OtherOptions {
            field,
            path: path.to_owned(),
            options: top.options.join(","),
        }),
        Some(_) => Err(BindError::OtherMount {
            field,
            path: path.to_owned(),
        }),
    }
}

/// Binds the volume directory `dir` on `staging`. Returns whether anything was done.
pub fn bind_staging(
    mounter: &dyn Mounter,
    dir: &Path,
    staging: &Path,
    options: MountOptions,
) -> Result<bool, BindError> {
    let source = mounter.identity(dir)?;
    if already_there(mounter, Field::StagingTargetPath, staging, source, &options)? {
        return Ok(false);
    }
    make_mount_point(Field::StagingTargetPath, staging)?;
    mounter.bind(dir, staging, options)?;
    Ok(true)
}

/// What to publish and how.
#[derive(Debug)]
pub struct Publication<'a> {
    /// The volume's data directory.
    pub dir: &'a Path,
    /// Where the volume is staged; `None` binds the data directory itself (ephemeral).
    pub staging: Option<&'a Path>,
    pub target: &'a Path,
    pub options: MountOptions,
    /// SINGLE_NODE_SINGLE_WRITER: no other target may hold the volume.
    pub exclusive: bool,
}

/// What a publish did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// The volume was there already, as asked.
    Already,
    /// Mounted now; `created`: publish made the mount point too.
    Mounted { created: bool },
}

/// Binds the staged volume (an ephemeral one's directory) on the target.
pub fn bind_target(mounter: &dyn Mounter, p: &Publication) -> Result<Published, BindError> {
    let source = mounter.identity(p.dir)?;
    if already_there(mounter, Field::TargetPath, p.target, source, &p.options)? {
        return Ok(Published::Already);
    }
    if let Some(staging) = p.staging
        && !(mounter.mount_at(staging)?).is_some_and(|top| top.shows == source)
    {
        return Err(BindError::NotStaged {
            staging: staging.to_owned(),
        });
    }
    if p.exclusive
        && let Some(at) = published_elsewhere(mounter, p.dir, p.staging)?
    {
        return Err(BindError::PublishedElsewhere { at });
    }
    let created = make_mount_point(Field::TargetPath, p.target)?;
    if let Err(e) = mounter.bind(p.staging.unwrap_or(p.dir), p.target, p.options) {
        if created && let Err(left) = remove_mount_point(p.target) {
            log::warn!("mount point of a failed publish stays: {left}");
        }
        return Err(e.into());
    }
    Ok(Published::Mounted { created })
}

/// Where else than `staging` the volume directory `dir` is mounted, if anywhere. The one
/// question here that reads the whole mount table: the kernel finds mounts by their mount
/// point, never by what they show.
fn published_elsewhere(
    mounter: &dyn Mounter,
    dir: &Path,
    staging: Option<&Path>,
) -> Result<Option<PathBuf>, BindError> {
    let table = mounter.mount_table()?;
    let source = table.locate(dir)?;
    Ok(table
        .mounts_from(&source)
        .find(|e| e.shows(&source) && Some(e.mount_point.as_path()) != staging)
        .map(|e| e.mount_point.clone()))
}

/// Unmounts every mount of this volume stacked at `path`, topmost first (unmounting one
/// uncovers the next); refuses to touch a mount that is not this volume. Returns whether
/// anything was unmounted.
pub fn unmount_volume(
    mounter: &dyn Mounter,
    field: Field,
    path: &Path,
    dir: &Path,
) -> Result<bool, BindError> {
    let foreign = || BindError::ForeignMount {
        field,
        path: path.to_owned(),
    };
    let mut source = None;
    let mut unmounted = None;
    while let Some(top) = mounter.mount_at(path)? {
        let source = match source {
            Some(source) => source,
            // A volume directory that is gone can be shown by no mount.
            None => match mounter.identity(dir) {
                Ok(shown) => *source.insert(shown),
                Err(e) if e.source.kind() == ErrorKind::NotFound => return Err(foreign()),
                Err(e) => return Err(e.into()),
            },
        };
        if top.shows != source {
            return Err(foreign());
        }
        if unmounted == Some(top.mnt_id) {
            // The kernel said it unmounted, yet the same mount is still there.
            return Err(BindError::Mount(crate::path_io::PathIoError::at(
                "unmount", path,
            )(
                std::io::Error::from_raw_os_error(nix::libc::EBUSY),
            )));
        }
        mounter.unmount(path, &top)?;
        unmounted = Some(top.mnt_id);
    }
    Ok(unmounted.is_some())
}

/// Removes the target directory publish created: only if empty, never following a symlink
/// (its parent is opened without following any). Leftover content means someone wrote into
/// the bare mount point; it is kept and reported.
pub fn remove_mount_point(path: &Path) -> Result<(), BindError> {
    match linux_resolve::remove(path, true) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::DirectoryNotEmpty | ErrorKind::NotADirectory
            ) =>
        {
            log::warn!("leaving {} in place: {e}", path.display());
            Ok(())
        }
        Err(source) => Err(BindError::Io {
            op: "remove",
            field: Field::TargetPath,
            path: path.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests;
