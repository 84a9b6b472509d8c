//! Ext4 filesystems of a volume's own, with no mkfs anywhere: a new image starts as the blocks
//! of an empty 16 MiB ext4 that `scripts/make-ext4-template.sh` made once with mke2fs (kept in
//! `template.bin`), and the kernel grows it to the volume's size while it is mounted
//! ([`grow`], `EXT4_IOC_RESIZE_FS`; the kernel switches to `meta_bg` by itself once the one
//! reserved descriptor block is used up). Each volume gets a UUID of its own while mounted
//! ([`set_uuid`], `EXT4_IOC_SETFSUUID`, which the template's `metadata_csum_seed` allows), and
//! [`freeze`] / [`thaw`] hold its writers still for a point-in-time copy of its image.
//!
//! What the template gives: 4 KiB blocks, 8,192 inodes per block group (16 KiB per inode at
//! any size), no blocks reserved for root, a 4 MiB journal (the kernel cannot resize a
//! journal), `has_journal ext_attr resize_inode dir_index filetype extent 64bit flex_bg
//! metadata_csum_seed sparse_super large_file huge_file dir_nlink extra_isize metadata_csum`.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::FileExt;

/// The template, in the encoding the script's header describes.
const TEMPLATE: &[u8] = include_bytes!("template.bin");

/// The template's size: the smallest an image volume can be.
pub const TEMPLATE_BYTES: u64 = 16 << 20;

/// The filesystem's block size: sizes are whole blocks.
pub const BLOCK_BYTES: u64 = 4096;

/// One run of the template's non-zero bytes: where it goes and the bytes.
struct Run<'a> {
    offset: u64,
    bytes: &'a [u8],
}

/// The template's runs, read from its encoding (version 2: runs, not blocks); a malformed
/// template is a build defect, which the unit tests would meet first.
fn runs() -> impl Iterator<Item = Run<'static>> {
    let header = 4 + 4 + 8 + 4;
    assert_eq!(
        &TEMPLATE[..8],
        b"NKX4\x02\0\0\0",
        "template magic and version"
    );
    let mut rest = &TEMPLATE[header..];
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let offset = u64::from_le_bytes(rest[..8].try_into().unwrap());
        let len = u32::from_le_bytes(rest[8..12].try_into().unwrap()) as usize;
        let bytes = &rest[12..12 + len];
        rest = &rest[12 + len..];
        Some(Run { offset, bytes })
    })
}

/// Writes the empty filesystem into `image` (a new, empty file) and sizes the file to
/// [`TEMPLATE_BYTES`]; the blocks between stay holes.
pub fn write_template(image: &File) -> std::io::Result<()> {
    image.set_len(TEMPLATE_BYTES)?;
    for run in runs() {
        image.write_all_at(run.bytes, run.offset)?;
    }
    Ok(())
}

/// Writes the empty filesystem into `image` (a new, empty file) and allocates the whole file
/// to `bytes` (whole blocks, at least [`TEMPLATE_BYTES`]) with `fallocate`: a thick image,
/// whose writes never need a block of the host filesystem, which may be full by then (a
/// sparse image's writes would then fail under its filesystem as I/O errors).
pub fn write_thick(image: &File, bytes: u64) -> std::io::Result<()> {
    write_template(image)?;
    allocate(image, bytes)
}

/// Allocates every hole of `image` up to `bytes`, growing it to that size if smaller; blocks
/// a reflink shares with another file stay shared.
pub fn allocate(image: &File, bytes: u64) -> std::io::Result<()> {
    allocate_from(image, 0, bytes)
}

/// [`allocate`] from byte `from` on only (XFS reserves room for the whole range asked, holes
/// or not, so a range already allocated is better left out).
pub fn allocate_from(image: &File, from: u64, bytes: u64) -> std::io::Result<()> {
    if bytes <= from {
        return Ok(());
    }
    // 8 MiB at a time: XFS reserves room for a whole step, allocated or not, so a step stays
    // small however large the file (a 64 MiB file on a disk with 52 MB free was ENOSPC).
    const STEP: u64 = 8 << 20;
    let mut at = from;
    while at < bytes {
        let len = STEP.min(bytes - at);
        let offset = i64::try_from(at).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        let len_i = i64::try_from(len).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        nix::fcntl::fallocate(image, nix::fcntl::FallocateFlags::empty(), offset, len_i)?;
        at += len;
    }
    Ok(())
}

/// A UUID of a volume's own, derived from its ID (IDs are unique on the node, and random):
/// two FNV-1a hashes of it, marked as a version 8 (custom) UUID. Stable across versions, so a
/// volume keeps its UUID from stage to stage; a clone or restore, another ID, gets another.
pub fn volume_uuid(id: &str) -> [u8; 16] {
    let fnv = |basis: u64| {
        (id.bytes()).fold(basis, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    let mut uuid = [0u8; 16];
    uuid[..8].copy_from_slice(&fnv(0xcbf2_9ce4_8422_2325).to_be_bytes());
    uuid[8..].copy_from_slice(&fnv(0x6c62_272e_07bb_0142).to_be_bytes());
    uuid[6] = (uuid[6] & 0x0f) | 0x80;
    uuid[8] = (uuid[8] & 0x3f) | 0x80;
    uuid
}

/// What a filesystem's superblock says of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    /// Its size: blocks times block size.
    pub bytes: u64,
    pub uuid: [u8; 16],
}

/// Reads the superblock of the ext4 on `device` (a block device or an image file). On a
/// device whose filesystem is mounted, a buffered read shares the page cache the mounted
/// filesystem keeps its superblock in, so it sees the size a resize just set.
pub fn superblock(device: &File) -> std::io::Result<Superblock> {
    let mut sb = [0u8; 1024];
    device.read_exact_at(&mut sb, 1024)?;
    let u32_at = |at: usize| u32::from_le_bytes([sb[at], sb[at + 1], sb[at + 2], sb[at + 3]]);
    if u16::from_le_bytes([sb[56], sb[57]]) != 0xef53 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "no ext4 superblock",
        ));
    }
    const INCOMPAT_64BIT: u32 = 0x80;
    let high = match u32_at(0x60) & INCOMPAT_64BIT {
        0 => 0,
        _ => u64::from(u32_at(0x150)),
    };
    let blocks = (high << 32) | u64::from(u32_at(4));
    let block_bytes = 1024u64 << u32_at(24).min(16);
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&sb[0x68..0x78]);
    Ok(Superblock {
        bytes: blocks * block_bytes,
        uuid,
    })
}

/// Rounds a size up to whole filesystem blocks, at least the template's size.
pub fn fs_bytes(requested: u64) -> u64 {
    requested.max(TEMPLATE_BYTES).div_ceil(BLOCK_BYTES) * BLOCK_BYTES
}

mod sys {
    use nix::libc::c_int;

    /// `struct fsuuid` with room for a 16-byte UUID (`linux/ext4.h`: a flexible array).
    #[repr(C)]
    pub struct FsUuid {
        pub len: u32,
        pub flags: u32,
        pub uuid: [u8; 16],
    }

    // `EXT4_IOC_RESIZE_FS`: grow to this many blocks. Needs CAP_SYS_RESOURCE.
    nix::ioctl_write_ptr!(ext4_resize_fs, b'f', 16, u64);
    // `EXT4_IOC_SETFSUUID`: the number encodes the struct without its array (8 bytes).
    nix::ioctl_write_ptr_bad!(
        ext4_set_fs_uuid,
        nix::request_code_write!(b'f', 44, 8),
        FsUuid
    );
    // `FIFREEZE`, `FITHAW` (`linux/fs.h`): the argument is unused.
    nix::ioctl_readwrite!(fifreeze, b'X', 119, c_int);
    nix::ioctl_readwrite!(fithaw, b'X', 120, c_int);
}

/// Grows the mounted filesystem that `root` (any file in it) lies in to `bytes` (whole
/// blocks; its device must already be that large). Needs CAP_SYS_RESOURCE.
pub fn grow(root: &impl AsFd, bytes: u64) -> nix::Result<()> {
    let blocks = bytes / BLOCK_BYTES;
    // SAFETY: the kernel reads one u64 from the pointer, which outlives the call.
    unsafe { sys::ext4_resize_fs(root.as_fd().as_raw_fd(), &blocks) }.map(drop)
}

/// Gives the mounted filesystem `root` lies in the UUID `uuid` (Linux 6.0+; EOPNOTSUPP
/// without `metadata_csum_seed`).
pub fn set_uuid(root: &impl AsFd, uuid: [u8; 16]) -> nix::Result<()> {
    let arg = sys::FsUuid {
        len: 16,
        flags: 0,
        uuid,
    };
    // SAFETY: the kernel reads the header and `len` bytes of UUID, all inside `arg`.
    unsafe { sys::ext4_set_fs_uuid(root.as_fd().as_raw_fd(), &arg) }.map(drop)
}

/// Freezes the filesystem `root` lies in: its dirty data written, new writes held until
/// [`thaw`].
pub fn freeze(root: &impl AsFd) -> nix::Result<()> {
    let mut unused = 0;
    // SAFETY: the argument is an int the kernel does not read.
    unsafe { sys::fifreeze(root.as_fd().as_raw_fd(), &mut unused) }.map(drop)
}

/// Lets the writers of a frozen filesystem go on.
pub fn thaw(root: &impl AsFd) -> nix::Result<()> {
    let mut unused = 0;
    // SAFETY: as for `freeze`.
    unsafe { sys::fithaw(root.as_fd().as_raw_fd(), &mut unused) }.map(drop)
}

#[cfg(test)]
mod tests;
