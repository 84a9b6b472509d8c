//! Image volumes on the node (layout `image`): the volume's file ([`StateDir::block_image`])
//! holds an ext4 of its own. NodeCreateVolume writes it thick (see [`Driver::fill_image`]);
//! NodeStageVolume attaches it to a loop device of ours (direct I/O in 4 KiB blocks where the
//! file allows) and mounts the filesystem onto the staging path's checked descriptor, readied
//! first while no path shows it (a UUID of the volume's own, grown to the device's size, the
//! root's mode and group); NodePublishVolume binds the staging mount onto the target, as a
//! directory volume's staging mount is bound; unpublish and unstage undo it, unstage
//! detaching the device once no mount of it is left.
//!
//! As for block volumes, nothing is stored: the loop device is found by the file's identity
//! and our tag, and a mount is the volume's exactly when its root is that device's
//! filesystem's root (its device number and inode 2), which statx of the one path tells.

use std::ffi::CStr;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::errno::Errno;

use super::Driver;
use super::bind_mounts::{self, BindError, Publication, Published};
use super::content::Content;
use super::controller_error::ControllerError;
use super::image_growth::grow_to_device;
use super::node_error::NodeError;
use super::node_ops::{PublishRequest, Stats};
use crate::csi_spec::Field;
use crate::linux::ext4_image::{self, BLOCK_BYTES};
use crate::linux::loopdev::{self, AttachOptions, Found, LoopDevice, Status};
use crate::linux::mount::MountOptions;
use crate::linux::mount_options::SelinuxContext;
use crate::linux::mountpoint::Shown;
use crate::linux::resolve;
#[cfg(doc)]
use crate::node_server::state::state_dir::StateDir;
use crate::node_server::state::state_dir::block_image_in;
use crate::node_server::state::volumes::{Record, VolumeError};
use crate::path_io::PathIoError;

const EXT4: &CStr = c"ext4";

/// ext4's root directory: what every mount of the whole filesystem shows.
const ROOT_INO: u64 = 2;

fn attach_options(record: &Record) -> AttachOptions {
    AttachOptions {
        read_only: false,
        // The host filesystem caches the file already; a second cache in the device only
        // costs memory. 4 KiB blocks, the filesystem's, so that direct I/O holds on disks of
        // 4 KiB sectors too (the kernel drops it for a smaller block size there).
        direct_io: record.attributes.direct_io.unwrap_or(true),
        block_size: BLOCK_BYTES as u32,
    }
}

/// What a mount of the filesystem on `status`'s device shows at its root.
pub(super) fn root_of(status: &Status) -> Shown {
    Shown {
        dev: status.device.rdev(),
        ino: ROOT_INO,
    }
}

/// Whether a mount showing `shown` is the filesystem of one of `found`'s devices.
pub(super) fn is_ours(found: &Found, shown: Shown) -> bool {
    found.ours.iter().any(|s| root_of(s) == shown)
}

/// What tells an image volume's filesystem from any other mount.
pub(super) trait Recognises {
    /// Whether a mount showing `shown` is the root of the volume's filesystem.
    fn shows_it(&self, shown: Shown) -> Result<bool, NodeError>;
}

/// The volume's devices, found by a walk over every loop device.
impl Recognises for Found {
    fn shows_it(&self, shown: Shown) -> Result<bool, NodeError> {
        Ok(is_ours(self, shown))
    }
}

/// The one device a mount names, asked of sysfs ([`Driver::shows_its_filesystem`]): no walk,
/// for the calls a busy node makes most (publish, unpublish, stats).
struct ItsFilesystem<'a>(&'a Driver, &'a Record);

impl Recognises for ItsFilesystem<'_> {
    fn shows_it(&self, shown: Shown) -> Result<bool, NodeError> {
        self.0.shows_its_filesystem(self.1, shown)
    }
}

/// Opens the root of the image volume's filesystem mounted at `path` (opened through no
/// symbolic link, checked to be the root of the volume's filesystem) for changes.
pub(super) fn open_root(path: &Path, its: &impl Recognises) -> Result<File, NodeError> {
    let at = |e: std::io::Error| NodeError::Mount(PathIoError::new("open the root at", path, e));
    let fd = resolve::open_dir_no_symlinks(path).map_err(|e| at(e.into()))?;
    // The descriptor is O_PATH; reopened through /proc, it is the same inode, not the path.
    let root = File::open(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(at)?;
    let meta = root.metadata().map_err(at)?;
    let shown = Shown {
        dev: meta.dev(),
        ino: meta.ino(),
    };
    if !its.shows_it(shown)? {
        return Err(BindError::ForeignMount {
            field: Field::StagingTargetPath,
            path: path.to_owned(),
        }
        .into());
    }
    Ok(root)
}

/// A new image file at `image`: the empty filesystem, allocated in full to `bytes`, made
/// unnamed and linked once whole. A host filesystem without room for it is
/// [`VolumeError::NoSpace`] (RESOURCE_EXHAUSTED), with what it has free.
pub(super) fn create_thick<E>(image: &Path, bytes: u64) -> Result<(), E>
where
    E: From<VolumeError> + From<loopdev::LoopError>,
{
    let made = loopdev::create_backing_file_with(image, bytes, |file| {
        ext4_image::write_thick(file, bytes)
    });
    match made {
        Ok(_) => Ok(()),
        Err(loopdev::LoopError::Io(e)) if e.raw_os_error() == Some(nix::libc::ENOSPC) => {
            let dir = image.parent().unwrap_or(image);
            let available = crate::node_server::state::capacity::free_bytes(dir).unwrap_or(0);
            Err(VolumeError::NoSpace {
                asked: bytes,
                available,
            }
            .into())
        }
        Err(e) => Err(e.into()),
    }
}

/// Gives the filesystem's root `mode`, and with `group` that group, group-writable and setgid
/// (as Kubernetes does for `fsGroup`), if it has not those already.
fn set_root(id: &str, root: &File, mode: Option<u32>, group: Option<u32>) -> Result<(), NodeError> {
    let fs = |op| {
        move |source: Errno| NodeError::Filesystem {
            id: id.to_owned(),
            op,
            source: source.into(),
        }
    };
    let meta = nix::sys::stat::fstat(root).map_err(fs("inspect the root"))?;
    let mut wanted = mode.unwrap_or(meta.st_mode & 0o7777);
    if let Some(gid) = group {
        if meta.st_gid != gid {
            let gid = nix::unistd::Gid::from_raw(gid);
            nix::unistd::fchown(root, None, Some(gid))
                .map_err(fs("give the root to the volume's group"))?;
        }
        wanted |= 0o2070;
    }
    if meta.st_mode & 0o7777 != wanted {
        let mode = nix::sys::stat::Mode::from_bits_truncate(wanted);
        nix::sys::stat::fchmod(root, mode).map_err(fs("set the mode of the root"))?;
    }
    Ok(())
}

impl Driver {
    /// A new image volume's directory: private (only node-server reaches the file), holding
    /// the empty filesystem in a file allocated to its whole size, made durable before the
    /// record (as a block volume's).
    ///
    /// A restore or clone copies its source's file instead (a reflink where the state
    /// directory's filesystem shares extents), then allocates the rest of the file to
    /// `bytes`; the stage gives the filesystem a UUID of its own and grows it to the file.
    pub(super) fn fill_image(
        &self,
        dir: &Path,
        bytes: u64,
        content: Option<&Content>,
    ) -> Result<(), ControllerError> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(PathIoError::at("set the mode of", dir))
            .map_err(VolumeError::from)?;
        let image = block_image_in(dir);
        let Some(content) = content else {
            return create_thick(&image, bytes);
        };
        content.fill(dir)?;
        Ok(super::image_growth::allocate_file(&image, 0, bytes)?)
    }

    /// Readies the filesystem of `record` through its `root`, before any path shows it: its
    /// UUID (the volume's own, so that restores and clones never share one), its size (grown
    /// to the device's, if smaller), its root's mode and group.
    fn ready(
        &self,
        record: &Record,
        root: &File,
        device: LoopDevice,
        group: Option<u32>,
    ) -> Result<(), NodeError> {
        let id = &record.id;
        let fs = |op| {
            move |source| NodeError::Filesystem {
                id: id.clone(),
                op,
                source,
            }
        };
        let node = File::open(device.path()).map_err(fs("open the device"))?;
        let superblock = ext4_image::superblock(&node).map_err(fs("read the superblock"))?;
        let uuid = ext4_image::volume_uuid(id);
        if superblock.uuid != uuid {
            ext4_image::set_uuid(&root.as_fd(), uuid)
                .map_err(|e| fs("give a UUID of its own to")(e.into()))?;
        }
        let grown = grow_to_device(id, root, device, superblock.bytes)?;
        if grown > superblock.bytes {
            // As after NodeExpandVolume's growth: the grown part allocated again where the
            // growth punched it.
            let image = self.image_of(id);
            super::image_growth::allocate_file(&image, superblock.bytes, grown)?;
        }
        // Like a directory volume's, world-writable unless its rootMode says otherwise.
        let mode = record.attributes.root_mode.unwrap_or(0o777);
        set_root(id, root, Some(mode), group)
    }

    /// NodeStageVolume: the volume's file on a loop device of ours (found or attached), its
    /// filesystem readied and mounted at `staging` with `options`. Already mounted there with
    /// those options is done; a failure leaves nothing mounted, nor a device it attached.
    pub(super) fn stage_image(
        &self,
        record: &Record,
        staging: &Path,
        options: MountOptions,
        context: Option<&SelinuxContext>,
        group: Option<u32>,
    ) -> Result<(), NodeError> {
        let image = self.image_of(&record.id);
        let (device, attached) = self.loops.find_or_attach(&image, attach_options(record))?;
        let field = Field::StagingTargetPath;
        let path = staging.to_owned();
        match self.mounter.mount_at(staging)? {
            Some(top) if top.shows == root_of(&device) && options.satisfied_by(&top) => {
                return Ok(());
            }
            Some(top) if top.shows == root_of(&device) => {
                let options = top.options.join(",");
                return Err(BindError::OtherOptions {
                    field,
                    path,
                    options,
                }
                .into());
            }
            Some(_) => return Err(BindError::OtherMount { field, path }.into()),
            None => {}
        }
        let mut failed = None;
        let mounted = bind_mounts::make_mount_point(field, staging)
            .map_err(NodeError::from)
            .and_then(|_| {
                let mut prepare = |root: &File| {
                    (self.ready(record, root, device.device, group)).map_err(|e| {
                        let io = std::io::Error::other(e.to_string());
                        failed = Some(e);
                        io
                    })
                };
                let dev = device.device.path();
                (self
                    .mounter
                    .mount_device(&dev, EXT4, staging, options, context, &mut prepare))
                .map_err(NodeError::from)
            });
        if let Err(e) = mounted {
            if attached && let Err(left) = self.loops.detach(device.device, &image) {
                log::warn!("device of a failed stage stays: {left}");
            }
            return Err(failed.unwrap_or(e));
        }
        log::debug!(
            "staged image volume {} on {} at {}",
            record.id,
            device.device,
            staging.display()
        );
        Ok(())
    }

    /// The devices of ours for an image volume's file (none if the file is gone).
    pub(super) fn image_devices(&self, record: &Record) -> Result<Found, NodeError> {
        match self.image_of(&record.id).exists() {
            true => self.found(record),
            false => Ok(Found::default()),
        }
    }

    /// Unmounts every mount of the volume's filesystem stacked at `path` (refusing one that
    /// is not its); whether there was one.
    fn unmount_image(
        &self,
        its: &impl Recognises,
        field: Field,
        path: &Path,
    ) -> Result<bool, NodeError> {
        let mut unmounted = None;
        while let Some(top) = self.mounter.mount_at(path)? {
            if !its.shows_it(top.shows)? {
                let path = path.to_owned();
                return Err(BindError::ForeignMount { field, path }.into());
            }
            if unmounted == Some(top.mnt_id) {
                // The kernel said it unmounted, yet the same mount is still there.
                let busy = std::io::Error::from_raw_os_error(nix::libc::EBUSY);
                return Err(NodeError::Mount(PathIoError::new("unmount", path, busy)));
            }
            self.mounter.unmount(path, &top)?;
            unmounted = Some(top.mnt_id);
        }
        Ok(unmounted.is_some())
    }

    /// NodeUnstageVolume: the filesystem unmounted from `staging` and, once no other staging
    /// path shows it, the device detached; refused while a target (or anything but a staging
    /// path of the volume) still shows it.
    pub(super) fn unstage_image(&self, record: &Record, staging: &Path) -> Result<(), NodeError> {
        let found = self.image_devices(record)?;
        let devices: Vec<u64> = found.ours.iter().map(|s| s.device.rdev()).collect();
        let table = self.mounter.mount_table()?;
        let others: Vec<&Path> = (table.entries().iter())
            .filter(|e| devices.contains(&nix::libc::makedev(e.dev.0, e.dev.1)))
            .map(|e| e.mount_point.as_path())
            .filter(|at| *at != staging)
            .collect();
        if let Some(at) = others
            .iter()
            .find(|at| !record.staged_at.iter().any(|s| s == *at))
        {
            return Err(NodeError::Volume(VolumeError::InUse {
                id: record.id.clone(),
                at: at.to_path_buf(),
            }));
        }
        if self.unmount_image(&found, Field::StagingTargetPath, staging)? {
            log::debug!(
                "unmounted image volume {} from {}",
                record.id,
                staging.display()
            );
        }
        if others.is_empty() {
            let image = self.image_of(&record.id);
            for status in &found.ours {
                self.loops.detach(status.device, &image)?;
            }
            // Zeroing through a loop device punches holes in its file (the filesystem's
            // growth does): allocated in full again while nothing uses it. Best effort: a
            // full host filesystem must not keep a volume staged; the next stage's writes
            // then need those blocks, as a sparse file's would.
            if !found.ours.is_empty()
                && let Err(e) = super::image_growth::allocate_file(&image, 0, record.capacity)
            {
                log::warn!("volume {} stays partly unallocated: {e}", record.id);
            }
        }
        Ok(())
    }

    /// NodePublishVolume: the staged filesystem bound onto the target (read-only if asked),
    /// its root given the request's group first.
    pub(super) fn publish_image(
        &self,
        req: &PublishRequest,
        record: &Record,
        target: &Path,
        staging: Option<&Path>,
    ) -> Result<Published, NodeError> {
        let image = self.image_of(&record.id);
        let its = ItsFilesystem(self, record);
        let mut staged = None;
        if let Some(staging) = staging
            && let Some(top) = self.mounter.mount_at(staging)?
            && its.shows_it(top.shows)?
        {
            staged = Some(staging);
        }
        let Some(staging) = staged else {
            let staging = staging.unwrap_or(&image).to_owned();
            return Err(BindError::NotStaged { staging }.into());
        };
        if req.group.is_some() {
            let root = open_root(staging, &its)?;
            set_root(&record.id, &root, None, req.group)?;
        }
        let publication = Publication {
            dir: staging,
            staging: Some(staging),
            target,
            options: req.options,
            exclusive: req.exclusive,
        };
        Ok(bind_mounts::bind_target(&*self.mounter, &publication)?)
    }

    /// NodeUnpublishVolume: the filesystem's mounts at the target undone; whether any was.
    pub(super) fn unpublish_image(
        &self,
        record: &Record,
        target: &Path,
    ) -> Result<bool, NodeError> {
        self.unmount_image(&ItsFilesystem(self, record), Field::TargetPath, target)
    }

    /// NodeGetVolumeStats: bytes and inodes of the volume's own filesystem, mounted at `path`.
    pub(super) fn image_stats(&self, record: &Record, path: &Path) -> Result<Stats, NodeError> {
        let mounted = match self.mounter.mount_at(path)? {
            Some(top) => self.shows_its_filesystem(record, top.shows)?,
            None => false,
        };
        let (statvfs, abnormal) = match mounted {
            true => {
                let stat = nix::sys::statvfs::statvfs(path).map_err(|source| NodeError::Stats {
                    dir: path.to_owned(),
                    source,
                })?;
                (Some(stat), None)
            }
            false => (
                None,
                Some(format!(
                    "the filesystem of image volume {} is not mounted at {}",
                    record.id,
                    path.display()
                )),
            ),
        };
        Ok(Stats {
            statvfs,
            hold: None,
            abnormal,
            block_capacity: None,
        })
    }

    /// Whether a mount showing `shown` is the root of the volume's filesystem on a device of
    /// ours: the one device the mount names, asked of sysfs and its status, not a walk over
    /// every loop device (stats are polled for every volume; 500 staged image volumes took
    /// 16.6 ms a call that way, all of it the walk).
    fn shows_its_filesystem(&self, record: &Record, shown: Shown) -> Result<bool, NodeError> {
        if shown.ino != ROOT_INO {
            return Ok(false);
        }
        let number = (nix::libc::major(shown.dev), nix::libc::minor(shown.dev));
        let Some(status) = self.loops.with_number(number)? else {
            return Ok(false);
        };
        let Ok(file) = loopdev::Identity::of(&self.image_of(&record.id)) else {
            return Ok(false);
        };
        Ok(status.is_ours_for(file))
    }

    /// ControllerModifyVolume's `rootMode`, set at once on the root of the volume's filesystem
    /// where it is staged; every stage sets it too, so a failure here is only logged.
    pub(super) fn apply_image_root_mode(&self, record: &Record) {
        if let Err(e) = self.set_staged_root_mode(record) {
            log::warn!(
                "rootMode of volume {} is applied at its next stage: {e}",
                record.id
            );
        }
    }

    fn set_staged_root_mode(&self, record: &Record) -> Result<(), NodeError> {
        let Some(mode) = record.attributes.root_mode else {
            return Ok(());
        };
        let found = self.image_devices(record)?;
        for staging in &record.staged_at {
            let shown = self.mounter.mount_at(staging)?.map(|top| top.shows);
            if shown.is_some_and(|shown| is_ours(&found, shown)) {
                let root = open_root(staging, &found)?;
                return set_root(&record.id, &root, Some(mode), None);
            }
        }
        Ok(())
    }
}
