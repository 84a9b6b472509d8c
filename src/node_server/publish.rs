//! Stage, publish, unpublish and unstage as bind mounts, decided from the mount table.
//!
//! A volume's *source* is where its data directory really lives (filesystem and path inside
//! it). A mount "is this volume" exactly when it shows that source, so every answer —
//! already staged? published compatibly? still in use? — comes from the kernel, after a
//! restart as much as before it. Every function here blocks.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use tonic::Status;

use super::mount::{MountOptions, Mounter};
use super::mountinfo::{MountTable, Source};

/// The source of a volume directory.
pub fn source_of(table: &MountTable, dir: &Path) -> Result<Source, Status> {
    table
        .source_of(dir)
        .ok_or_else(|| Status::internal(format!("no mount holds {}", dir.display())))
}

/// Resolves a request path the way the kernel will see it: symlinks in the parent are
/// followed (mount points in mountinfo are canonical), a symlink as the last component is
/// refused (a mount there would land wherever it points). `Ok(None)`: the parent is missing.
pub fn resolve(field: &str, path: &Path) -> Result<Option<PathBuf>, Status> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(Status::invalid_argument(format!("{field} has no parent")));
    };
    let parent = match std::fs::canonicalize(parent) {
        Ok(parent) => parent,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Status::internal(format!(
                "resolve {field} {}: {e}",
                path.display()
            )));
        }
    };
    let resolved = parent.join(name);
    match std::fs::symlink_metadata(&resolved) {
        Ok(meta) if meta.file_type().is_symlink() => Err(Status::failed_precondition(format!(
            "{field} {} is a symbolic link",
            path.display()
        ))),
        _ => Ok(Some(resolved)),
    }
}

/// Creates the mount point itself (never its parents: those are the CO's).
fn make_mount_point(field: &str, path: &Path) -> Result<(), Status> {
    match std::fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => Ok(()),
            _ => Err(Status::failed_precondition(format!(
                "{field} {} exists and is not a directory",
                path.display()
            ))),
        },
        Err(e) => Err(Status::failed_precondition(format!(
            "create {field} {}: {e}",
            path.display()
        ))),
    }
}

/// Checks an existing mount at `path` against a request: `Ok(true)` when it is this volume
/// with compatible options (nothing to do), `Ok(false)` when nothing is mounted there.
fn already_there(
    table: &MountTable,
    field: &str,
    path: &Path,
    source: &Source,
    options: &MountOptions,
) -> Result<bool, Status> {
    match table.mounted_at(path) {
        None => Ok(false),
        Some(entry) if entry.shows(source) && options.satisfied_by(entry) => Ok(true),
        Some(entry) if entry.shows(source) => Err(Status::already_exists(format!(
            "volume is already mounted at {field} {} with other options ({})",
            path.display(),
            entry.options.join(",")
        ))),
        Some(_) => Err(Status::already_exists(format!(
            "{field} {} already holds another mount",
            path.display()
        ))),
    }
}

/// Binds the volume directory `dir` on `staging`. Returns whether anything was done.
pub fn stage(
    mounter: &dyn Mounter,
    dir: &Path,
    staging: &Path,
    options: MountOptions,
) -> Result<bool, Status> {
    let table = mounter.mount_table()?;
    let source = source_of(&table, dir)?;
    if already_there(&table, "staging_target_path", staging, &source, &options)? {
        return Ok(false);
    }
    make_mount_point("staging_target_path", staging)?;
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

/// Binds the staged volume on the target. Returns whether anything was done.
pub fn publish(mounter: &dyn Mounter, p: &Publication) -> Result<bool, Status> {
    let table = mounter.mount_table()?;
    let source = source_of(&table, p.dir)?;
    if already_there(&table, "target_path", p.target, &source, &p.options)? {
        return Ok(false);
    }
    if let Some(staging) = p.staging
        && !table.mounted_at(staging).is_some_and(|e| e.shows(&source))
    {
        return Err(Status::failed_precondition(format!(
            "volume is not staged at {}: NodeStageVolume must succeed first",
            staging.display()
        )));
    }
    if p.exclusive
        && let Some(other) = table
            .mounts_from(&source)
            .find(|e| e.shows(&source) && Some(e.mount_point.as_path()) != p.staging)
    {
        return Err(Status::failed_precondition(format!(
            "SINGLE_NODE_SINGLE_WRITER volume is already published at {}",
            other.mount_point.display()
        )));
    }
    make_mount_point("target_path", p.target)?;
    mounter.bind(p.staging.unwrap_or(p.dir), p.target, p.options)?;
    Ok(true)
}

/// Unmounts every mount of this volume stacked at `path`; refuses to touch a mount that is
/// not this volume. Returns whether anything was unmounted.
pub fn unmount_volume(
    mounter: &dyn Mounter,
    field: &str,
    path: &Path,
    dir: &Path,
) -> Result<bool, Status> {
    let table = mounter.mount_table()?;
    let source = source_of(&table, dir)?;
    // Mounts stacked at `path`, topmost first: unmounting one uncovers the next, so one read
    // of the table tells what each unmount will leave visible.
    let stacked = table
        .entries()
        .iter()
        .rev()
        .filter(|e| e.mount_point == path);
    let mut unmounted = false;
    for entry in stacked {
        if !entry.shows(&source) {
            return Err(Status::failed_precondition(format!(
                "{field} {} holds a mount that is not this volume; leaving it alone",
                path.display()
            )));
        }
        mounter.unmount(path)?;
        unmounted = true;
    }
    Ok(unmounted)
}

/// Removes the target directory publish created: only if empty, never following a symlink.
/// Leftover content means someone wrote into the bare mount point; it is kept and reported.
pub fn remove_mount_point(path: &Path) -> Result<(), Status> {
    match std::fs::remove_dir(path) {
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
        Err(e) => Err(Status::internal(format!(
            "remove target_path {}: {e}",
            path.display()
        ))),
    }
}

/// The first place a directory is mounted on or from, if any: deleting it then would
/// delete through a mount.
pub fn first_user(table: &MountTable, dir: &Path) -> Result<Option<PathBuf>, Status> {
    let source = source_of(table, dir)?;
    Ok(table
        .mounts_from(&source)
        .chain(table.mounts_under(dir))
        .map(|e| e.mount_point.clone())
        .next())
}

#[cfg(test)]
#[path = "publish_tests.rs"]
mod tests;
