//! A directory tree with every kind of thing a volume can hold, and a comparison of two trees
//! that looks at everything a copy must keep.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use nix::sys::stat::{Mode, SFlag, UtimensatFlags, mknod, utimensat};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, fchownat};

/// An access ACL (`system.posix_acl_access`, version 2): owner rw, user 1234 r, group r,
/// mask r, other none. Entries are (tag, perm, id), sorted by tag as the kernel wants.
pub fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut value = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        value.extend(tag.to_le_bytes());
        value.extend(perm.to_le_bytes());
        value.extend(id.to_le_bytes());
    }
    value
}

const UNDEFINED: u32 = u32::MAX;

pub fn access_acl() -> Vec<u8> {
    acl(&[
        (0x01, 6, UNDEFINED),
        (0x02, 4, 1234),
        (0x04, 4, UNDEFINED),
        (0x10, 4, UNDEFINED),
        (0x20, 0, UNDEFINED),
    ])
}

/// Deterministic bytes that do not compress or dedupe.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn chown(path: &Path, uid: u32, gid: u32) {
    fchownat(
        nix::fcntl::AT_FDCWD,
        path,
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
}

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    xattr::set(path, name, value)
        .unwrap_or_else(|e| panic!("set {name} on {}: {e}", path.display()));
}

/// The sparse file's layout: 64 MiB long, 1 MiB of data at 0 and at 40 MiB.
pub const SPARSE_LEN: u64 = 64 << 20;

/// Builds the tree under `root` (created). Returns the names it made that a copy must leave
/// out (the socket).
pub fn build(root: &Path) -> Vec<PathBuf> {
    fs::create_dir(root).expect("create root");
    let a = root.join("a");
    fs::create_dir_all(a.join("sticky")).expect("mkdir");
    fs::create_dir_all(a.join("sgid")).expect("mkdir");
    let file = a.join("file.txt");
    fs::write(&file, b"hello, volume\n").expect("write");
    fs::write(root.join("empty"), b"").expect("write");
    fs::write(root.join("big"), noise(3 << 20, 1)).expect("write");
    let sparse = fs::File::create(root.join("sparse.img")).expect("create");
    sparse.set_len(SPARSE_LEN).expect("size");
    sparse.write_all_at(&noise(1 << 20, 2), 0).expect("write");
    sparse
        .write_all_at(&noise(1 << 20, 3), 40 << 20)
        .expect("write");
    drop(sparse);
    // Odd names: a newline, spaces, bytes that are not UTF-8.
    fs::write(root.join(OsStr::from_bytes(b"odd name\n\xff")), b"odd").expect("write");
    let mut deep = root.join("deep");
    for level in 0..20 {
        deep.push(format!("d{level}"));
    }
    fs::create_dir_all(&deep).expect("mkdir deep");
    fs::write(deep.join("bottom"), b"bottom").expect("write");

    fs::hard_link(&file, root.join("hard1")).expect("link");
    fs::hard_link(&file, a.join("sgid/hard2")).expect("link");
    symlink("/etc", root.join("link-out")).expect("symlink");
    symlink("a/file.txt", root.join("link-rel")).expect("symlink");
    symlink("../../nowhere", root.join("dangling")).expect("symlink");
    fs::hard_link(root.join("link-rel"), root.join("link-rel-hard")).expect("link a symlink");
    mknod(
        &root.join("fifo"),
        SFlag::S_IFIFO,
        Mode::from_bits_truncate(0o640),
        0,
    )
    .expect("mkfifo");
    mknod(
        &root.join("null"),
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o600),
        nix::libc::makedev(1, 3),
    )
    .expect("mknod");
    // A block device node for a loop device that need not exist: never opened by a copy.
    mknod(
        &root.join("blk"),
        SFlag::S_IFBLK,
        Mode::from_bits_truncate(0o600),
        nix::libc::makedev(7, 250),
    )
    .expect("mknod");
    let socket = root.join("sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).expect("bind socket"));

    chown(&a, 1000, 2000);
    chown(&file, 1001, 1002);
    chown(&root.join("link-out"), 1005, 1006);
    chown(&root.join("fifo"), 1007, 1008);
    set_xattr(&file, "user.color", b"blue");
    set_xattr(&file, "trusted.origin", b"fixture");
    set_xattr(&file, "security.test", b"label");
    set_xattr(&file, "system.posix_acl_access", &access_acl());
    set_xattr(&a, "system.posix_acl_default", &access_acl());
    set_xattr(&a, "user.dir", b"");
    set_xattr(&root.join("link-out"), "trusted.on-a-link", b"1");
    set_xattr(&root.join("fifo"), "trusted.on-a-fifo", b"2");
    // After chown (which clears setuid) and the ACL (which rewrites the group bits):
    chmod(&file, 0o4745);
    chmod(&a.join("sticky"), 0o1777);
    chmod(&a.join("sgid"), 0o2750);
    chmod(&a, 0o750);
    set_times(root);
    vec![PathBuf::from("sock")]
}

/// Gives every entry its own atime and mtime with nanoseconds, children before parents.
fn set_times(root: &Path) {
    let mut paths = walk(root);
    paths.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for (i, rel) in paths.iter().enumerate() {
        let i = i as i64;
        let atime = TimeSpec::new(1_500_000_000 + i, 111_111_111 + i);
        let mtime = TimeSpec::new(1_600_000_000 + i, 222_222_222 + i);
        utimensat(
            nix::fcntl::AT_FDCWD,
            &root.join(rel),
            &atime,
            &mtime,
            UtimensatFlags::NoFollowSymlink,
        )
        .expect("set times");
    }
}

/// Every path under `root` (relative; the root itself as ""), without following symlinks.
pub fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![PathBuf::new()];
    let mut i = 0;
    while i < out.len() {
        let full = root.join(&out[i]);
        if fs::symlink_metadata(&full).expect("stat").is_dir() {
            let mut names: Vec<OsString> = fs::read_dir(&full)
                .expect("read dir")
                .map(|e| e.expect("entry").file_name())
                .collect();
            names.sort();
            for name in names {
                out.push(out[i].join(name));
            }
        }
        i += 1;
    }
    out
}

/// What a copy must keep of one entry, besides its data.
#[derive(Debug, PartialEq, Eq)]
pub struct Entry {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub size: u64,
    pub atime: (i64, i64),
    pub mtime: (i64, i64),
    pub link: Option<PathBuf>,
    pub xattrs: BTreeMap<OsString, Vec<u8>>,
}

/// Metadata of every entry, and which entries share an inode (by first path), without reading
/// any file's data (that would move atimes on a mount without `noatime`).
pub fn metadata(root: &Path) -> (BTreeMap<PathBuf, Entry>, BTreeMap<PathBuf, PathBuf>) {
    let mut entries = BTreeMap::new();
    let mut first_of: HashMap<u64, PathBuf> = HashMap::new();
    let mut links = BTreeMap::new();
    for rel in walk(root) {
        let full = root.join(&rel);
        let m = fs::symlink_metadata(&full).expect("stat");
        let link = m
            .file_type()
            .is_symlink()
            .then(|| fs::read_link(&full).expect("readlink"));
        let xattrs = xattr::list(&full)
            .expect("list xattrs")
            .filter(|name| !name.as_bytes().starts_with(b"security.selinux"))
            .map(|name| {
                let value = xattr::get(&full, &name)
                    .expect("get xattr")
                    .unwrap_or_default();
                (name, value)
            })
            .collect();
        if !m.is_dir() && m.nlink() > 1 {
            let first = first_of.entry(m.ino()).or_insert_with(|| rel.clone());
            links.insert(rel.clone(), first.clone());
        }
        let entry = Entry {
            mode: m.mode(),
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev(),
            size: if m.is_dir() { 0 } else { m.size() },
            atime: (m.atime(), m.atime_nsec()),
            mtime: (m.mtime(), m.mtime_nsec()),
            link,
            xattrs,
        };
        entries.insert(rel, entry);
    }
    (entries, links)
}

/// Asserts that `copy` holds what `original` holds (less `left_out`): metadata first, then
/// file contents, then that no file takes more blocks than its original (holes kept).
pub fn assert_same(original: &Path, copy: &Path, left_out: &[PathBuf]) {
    let (mut want, want_links) = metadata(original);
    let (got, got_links) = metadata(copy);
    for path in left_out {
        assert!(
            want.remove(path).is_some(),
            "{} is not in the original",
            path.display()
        );
    }
    let want_paths: Vec<_> = want.keys().collect();
    let got_paths: Vec<_> = got.keys().collect();
    assert_eq!(got_paths, want_paths, "the copy has other names");
    for (path, entry) in &want {
        assert_eq!(&got[path], entry, "{} differs", path.display());
    }
    assert_eq!(got_links, want_links, "hard links differ");
    for (rel, entry) in &want {
        if entry.mode & nix::libc::S_IFMT == nix::libc::S_IFREG {
            let (a, b) = (original.join(rel), copy.join(rel));
            assert!(
                fs::read(&a).expect("read") == fs::read(&b).expect("read"),
                "{} content differs",
                rel.display()
            );
            let (blocks_a, blocks_b) = (
                fs::metadata(&a).expect("stat").blocks(),
                fs::metadata(&b).expect("stat").blocks(),
            );
            assert!(
                blocks_b <= blocks_a + 8,
                "{} takes {blocks_b} blocks, its original {blocks_a}",
                rel.display()
            );
        }
    }
}

/// 32 files of 1 MiB: their copy costs space unless the extents are shared.
pub fn data_tree(root: &Path) -> u64 {
    fs::create_dir(root).expect("mkdir");
    for i in 0..32 {
        fs::write(root.join(format!("f{i}")), noise(1 << 20, i)).expect("write");
    }
    32 << 20
}

/// 20,000 small files in 100 directories: a tree that takes a while to copy, so that calls
/// (or a kill) can land while a copy of it runs.
pub fn many_files(root: &Path) {
    for d in 0..100 {
        let dir = root.join(format!("d{d:03}"));
        fs::create_dir_all(&dir).expect("mkdir");
        for f in 0..200 {
            fs::write(dir.join(format!("f{f:03}")), format!("{d}/{f}")).expect("write");
        }
    }
}

/// Nests `depth` directories named `d` under `root` (deeper than any path can name, so made
/// a level at a time from the one above) and returns the deepest, open.
pub fn nest(root: &Path, depth: usize) -> std::os::fd::OwnedFd {
    use nix::fcntl::{OFlag, open};
    use std::os::fd::AsFd;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let top = open(root, flags, Mode::empty()).expect("open the root");
    nest_at(top.as_fd(), depth)
}

/// Nests `depth` directories named `d` in the open directory `top`; the deepest, open.
pub fn nest_at(top: std::os::fd::BorrowedFd<'_>, depth: usize) -> std::os::fd::OwnedFd {
    use nix::fcntl::{OFlag, openat};
    use std::os::fd::AsFd;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut dir = openat(top, ".", flags, Mode::empty()).expect("open the top");
    for _ in 0..depth {
        nix::sys::stat::mkdirat(dir.as_fd(), "d", Mode::S_IRWXU).expect("mkdir d");
        dir = openat(dir.as_fd(), "d", flags, Mode::empty()).expect("open d");
    }
    dir
}

/// The directory `depth` levels of `d` below `root`, open; `None` if the chain is shorter.
pub fn reach(root: &Path, depth: usize) -> Option<std::os::fd::OwnedFd> {
    use nix::fcntl::{OFlag, open, openat};
    use std::os::fd::AsFd;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut dir = open(root, flags, Mode::empty()).ok()?;
    for _ in 0..depth {
        dir = openat(dir.as_fd(), "d", flags, Mode::empty()).ok()?;
    }
    Some(dir)
}

/// The contents of `name` in the open directory `dir`, if it is there.
pub fn read_at(dir: std::os::fd::BorrowedFd<'_>, name: &str) -> Option<Vec<u8>> {
    use nix::fcntl::{OFlag, openat};
    use std::io::Read;
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(dir, name, flags, Mode::empty()).ok()?;
    let mut data = Vec::new();
    fs::File::from(fd).read_to_end(&mut data).ok()?;
    Some(data)
}
