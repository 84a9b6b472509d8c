//! The kernel's mount table (`/proc/self/mountinfo`), parsed: the one truth for "is it
//! mounted", "is it mounted *from this volume*" and "is anything mounted on or from this
//! directory". Nothing about mounts is cached elsewhere; every decision re-reads the table.
//!
//! Lines are read exactly as the kernel writes them (`proc_pid_mountinfo(5)`): space-separated
//! fields, paths with octal escapes, any number of optional fields up to a lone `-`. A root
//! that is not a path (nsfs's `net:[4026531833]` on every Kubernetes node, a deleted
//! directory's `…//deleted`) is kept: such a mount can never be a volume's source, but it is
//! still a mount at its mount point.

use std::collections::HashSet;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// One line of mountinfo, reduced to what decisions need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// `major:minor` of the filesystem.
    pub dev: (u32, u32),
    /// The directory of that filesystem that appears at the mount point (`/` unless a bind);
    /// `None` when the kernel names no path (a namespace file, a deleted directory), so that
    /// it equals no volume's source.
    pub root: Option<PathBuf>,
    pub mount_point: PathBuf,
    /// Per-mount options (`rw`/`ro`, `nosuid`, `noatime`, …), not the superblock's.
    pub options: Vec<String>,
}

impl MountEntry {
    pub fn has_option(&self, option: &str) -> bool {
        self.options.iter().any(|o| o == option)
    }

    pub fn is_readonly(&self) -> bool {
        self.has_option("ro")
    }

    /// True when this mount shows `source` (and not a subdirectory or a parent of it).
    pub fn shows(&self, source: &Source) -> bool {
        self.dev == source.dev && self.root.as_deref() == Some(source.path.as_path())
    }
}

/// Where a directory really lives: its filesystem and its path inside that filesystem.
/// Two mounts show the same directory exactly when their sources are equal, whatever their
/// mount points are; this is how a bind mount is traced back to its volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub dev: (u32, u32),
    pub path: PathBuf,
}

/// A directory that no mount in the table holds: the table and the filesystem disagree.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no mount holds {}", .0.display())]
pub struct Unlocatable(pub PathBuf);

/// The parsed mount table, in the kernel's order (a later entry at the same mount point is
/// stacked on top of an earlier one).
#[derive(Debug, Clone, Default)]
pub struct MountTable {
    entries: Vec<MountEntry>,
}

impl MountTable {
    pub fn new(entries: Vec<MountEntry>) -> Self {
        Self { entries }
    }

    /// Reads the calling process's mount table.
    pub fn read() -> std::io::Result<Self> {
        let text = std::fs::read("/proc/self/mountinfo")?;
        Ok(Self::parse(&text))
    }

    /// Parses mountinfo text. A line the kernel would never write is skipped (and logged once):
    /// one odd line must not stop every volume operation on the node.
    pub fn parse(text: &[u8]) -> Self {
        let entries = text
            .split(|&b| b == b'\n')
            .filter(|line| !line.is_empty())
            .filter_map(|line| {
                let entry = parse_line(line);
                if entry.is_none() {
                    report_unparsed(line);
                }
                entry
            })
            .collect();
        Self { entries }
    }

    pub fn entries(&self) -> &[MountEntry] {
        &self.entries
    }

    /// The mount visible at `path` if `path` is a mount point (the topmost one if stacked).
    pub fn mounted_at(&self, path: &Path) -> Option<&MountEntry> {
        self.entries.iter().rev().find(|e| e.mount_point == path)
    }

    /// The mount that `path` lies in: the longest mount point that is a prefix of it.
    pub fn containing(&self, path: &Path) -> Option<&MountEntry> {
        self.entries
            .iter()
            .rev()
            .filter(|e| path.starts_with(&e.mount_point))
            .max_by_key(|e| e.mount_point.components().count())
    }

    /// Where `path` (an absolute path without symlinks) really lives.
    pub fn source_of(&self, path: &Path) -> Option<Source> {
        let entry = self.containing(path)?;
        let rest = path.strip_prefix(&entry.mount_point).ok()?;
        Some(Source {
            dev: entry.dev,
            path: entry.root.as_ref()?.join(rest),
        })
    }

    /// [`source_of`](Self::source_of), for a directory that must be somewhere.
    pub fn locate(&self, dir: &Path) -> Result<Source, Unlocatable> {
        self.source_of(dir)
            .ok_or_else(|| Unlocatable(dir.to_owned()))
    }

    /// Mounts that show `source` or anything inside it.
    pub fn mounts_from<'a>(&'a self, source: &'a Source) -> impl Iterator<Item = &'a MountEntry> {
        self.entries.iter().filter(move |e| {
            e.dev == source.dev && e.root.as_ref().is_some_and(|r| r.starts_with(&source.path))
        })
    }

    /// Mounts whose mount point is `path` or lies below it.
    pub fn mounts_under<'a>(&'a self, path: &'a Path) -> impl Iterator<Item = &'a MountEntry> {
        self.entries
            .iter()
            .filter(move |e| e.mount_point.starts_with(path))
    }

    /// The first place a directory is mounted on or from, if any: deleting it then would
    /// delete through a mount.
    pub fn first_user(&self, dir: &Path) -> Result<Option<PathBuf>, Unlocatable> {
        let source = self.locate(dir)?;
        Ok(self
            .mounts_from(&source)
            .chain(self.mounts_under(dir))
            .map(|e| e.mount_point.clone())
            .next())
    }
}

/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
fn parse_line(line: &[u8]) -> Option<MountEntry> {
    let mut fields = line.split(|&b| b == b' ');
    let _id: u64 = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
    let _parent: u64 = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
    let dev = std::str::from_utf8(fields.next()?).ok()?;
    let (major, minor) = dev.split_once(':')?;
    let root = unescape(fields.next()?)?;
    let mount_point = unescape(fields.next()?)?;
    if mount_point.first() != Some(&b'/') {
        return None; // the kernel leaves out mounts it cannot name from our root
    }
    let options = std::str::from_utf8(fields.next()?).ok()?;
    // Optional fields run up to a lone "-"; the filesystem type and source follow it.
    fields.find(|f| *f == b"-")?;
    if fields.next()?.is_empty() {
        return None; // no filesystem type
    }
    Some(MountEntry {
        dev: (major.parse().ok()?, minor.parse().ok()?),
        root: path_root(root),
        mount_point: PathBuf::from(OsString::from_vec(mount_point)),
        options: options.split(',').map(str::to_owned).collect(),
    })
}

/// A root is a path inside its filesystem only when it starts with `/` and is not a deleted
/// directory (the kernel's dentry path ends those in `//deleted`, which `Path` would read as
/// a subdirectory named `deleted`).
fn path_root(root: Vec<u8>) -> Option<PathBuf> {
    (root.first() == Some(&b'/') && !root.ends_with(b"//deleted"))
        .then(|| PathBuf::from(OsString::from_vec(root)))
}

/// Undoes the kernel's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134`
/// backslash); paths are bytes, not necessarily UTF-8.
fn unescape(field: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\' {
            let digits = field.get(i + 1..i + 4)?;
            if !digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                return None;
            }
            let text = std::str::from_utf8(digits).ok()?;
            out.push(u8::from_str_radix(text, 8).ok()?);
            i += 4;
        } else {
            out.push(field[i]);
            i += 1;
        }
    }
    Some(out)
}

/// How many distinct unparsable lines are remembered, so each is logged once without the set
/// growing for ever.
const REMEMBERED_LINES: usize = 256;
static REPORTED: Mutex<Option<HashSet<u64>>> = Mutex::new(None);

/// Logs a line we could not parse, once per distinct line (the table is re-read on every
/// operation). Returns whether it logged.
fn report_unparsed(line: &[u8]) -> bool {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(line);
    let mut reported = crate::mutex::lock(&REPORTED);
    let seen = reported.get_or_insert_with(HashSet::new);
    if seen.contains(&hash) {
        return false;
    }
    if seen.len() < REMEMBERED_LINES {
        seen.insert(hash);
    }
    log::warn!(
        "skipping a mountinfo line that could not be parsed: {:?}",
        String::from_utf8_lossy(line)
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 8:1 /var/lib/nk/volumes/v1 /var/lib/kubelet/staging rw,relatime shared:1 - ext4 /dev/sda1 rw
41 22 8:1 /var/lib/nk/volumes/v1 /var/lib/kubelet/pods/p1/vol ro,nosuid,relatime shared:1 - ext4 /dev/sda1 rw
42 22 0:50 / /tmp/with\\040space rw,nosuid,nodev - tmpfs tmpfs rw
43 22 0:51 / /tmp/stacked rw - tmpfs a rw
44 22 0:52 / /tmp/stacked ro - tmpfs b rw
84 22 0:4 net:[4026531833] /run/netns/cni-x rw - nsfs nsfs rw
85 41 0:4 net:[4026532567] /var/lib/kubelet/pods/p1/vol/netns rw shared:5 - nsfs nsfs rw
86 22 8:1 /var/lib/nk/volumes/v1//deleted /mnt/gone rw,relatime shared:1 - ext4 /dev/sda1 rw
87 22 0:60 / /mnt/opt rw shared:7 master:3 propagate_from:2 unbindable - tmpfs tmpfs rw
88 22 0:61 / /mnt/nosource rw - tmpfs  rw
89 22 0:62 /a\\040b\\011c\\012d\\134e /tmp/a\\040b\\011c\\012d\\134e rw - tmpfs x rw
";

    fn table() -> MountTable {
        MountTable::parse(SAMPLE.as_bytes())
    }

    #[test]
    fn every_line_of_a_real_shaped_table_is_parsed() {
        let table = table();
        assert_eq!(table.entries().len(), 12);
        let first = &table.entries()[0];
        assert_eq!(first.dev, (8, 1));
        assert_eq!(first.root.as_deref(), Some(Path::new("/")));
        assert_eq!(first.options, ["rw", "relatime"]);
        for point in ["/mnt/opt", "/mnt/nosource"] {
            assert!(table.mounted_at(Path::new(point)).is_some(), "{point}");
        }
    }

    #[test]
    fn a_network_namespace_mount_is_a_mount_whose_root_is_no_path() {
        let table = table();
        let netns = table.mounted_at(Path::new("/run/netns/cni-x")).unwrap();
        assert_eq!((netns.dev, netns.root.as_ref()), ((0, 4), None));
        assert!(table.source_of(Path::new("/run/netns/cni-x")).is_none());
        let target = Path::new("/var/lib/kubelet/pods/p1/vol");
        assert_eq!(
            table.mounts_under(target).count(),
            2,
            "a namespace file mounted below a target still counts as a mount there"
        );
    }

    #[test]
    fn a_bind_of_a_deleted_directory_is_no_mount_of_what_now_has_its_name() {
        let table = table();
        assert!(
            table
                .mounted_at(Path::new("/mnt/gone"))
                .unwrap()
                .root
                .is_none()
        );
        let v1 = table
            .source_of(Path::new("/var/lib/nk/volumes/v1"))
            .unwrap();
        assert_eq!(table.mounts_from(&v1).count(), 2, "only the two live binds");
        let deleted = Source {
            dev: (8, 1),
            path: "/var/lib/nk/volumes/v1/deleted".into(),
        };
        assert_eq!(table.mounts_from(&deleted).count(), 0);
    }

    #[test]
    fn octal_escapes_in_paths_are_decoded() {
        let table = table();
        assert!(table.mounted_at(Path::new("/tmp/with space")).is_some());
        let odd = Path::new("/tmp/a b\tc\nd\\e");
        let entry = table.mounted_at(odd).unwrap();
        assert_eq!(entry.root.as_deref(), Some(Path::new("/a b\tc\nd\\e")));
        assert_eq!(unescape(b"\\342\\202\\254").unwrap(), "€".as_bytes());
    }

    #[test]
    fn lines_the_kernel_never_writes_are_skipped_and_the_rest_kept() {
        assert!(unescape(b"/a\\04").is_none());
        assert!(unescape(b"/a\\9zz").is_none());
        let text = b"garbage\n1 2 8:1 / / rw\n3 1 8:1 / relative rw - ext4 x rw\n\
                     4 1 8:1 /a\\04 /b rw - ext4 x rw\n22 1 8:1 / / rw - ext4 /dev/sda1 rw\n";
        let table = MountTable::parse(text);
        assert_eq!(table.entries().len(), 1);
        assert_eq!(table.entries()[0].mount_point, Path::new("/"));
    }

    #[test]
    fn an_unparsable_line_is_logged_once_not_on_every_read() {
        let line = b"a line seen only by this test";
        assert!(report_unparsed(line));
        assert!(!report_unparsed(line));
        assert!(report_unparsed(b"another such line"));
    }

    #[test]
    fn the_topmost_of_stacked_mounts_is_the_visible_one() {
        let table = table();
        let top = table.mounted_at(Path::new("/tmp/stacked")).unwrap();
        assert_eq!(top.dev, (0, 52));
        assert!(top.is_readonly());
    }

    #[test]
    fn a_bind_mount_is_traced_back_to_its_source_directory() {
        let table = table();
        let source = table
            .source_of(Path::new("/var/lib/nk/volumes/v1"))
            .unwrap();
        assert_eq!(source.dev, (8, 1));
        let target = table
            .mounted_at(Path::new("/var/lib/kubelet/pods/p1/vol"))
            .unwrap();
        assert!(target.shows(&source));
        assert_eq!(table.mounts_from(&source).count(), 2);
        let sibling = table
            .source_of(Path::new("/var/lib/nk/volumes/v10"))
            .unwrap();
        assert_eq!(table.mounts_from(&sibling).count(), 0, "v10 is not v1");
    }

    #[test]
    fn the_source_of_a_path_inside_a_bind_mount_follows_the_bind() {
        let table = table();
        let source = table
            .source_of(Path::new("/var/lib/kubelet/staging/sub"))
            .unwrap();
        assert_eq!(source.path, Path::new("/var/lib/nk/volumes/v1/sub"));
    }

    #[test]
    fn mounts_under_a_directory_include_the_directory_itself() {
        let table = table();
        assert_eq!(table.mounts_under(Path::new("/var/lib/kubelet")).count(), 3);
        assert_eq!(table.mounts_under(Path::new("/tmp/stacked")).count(), 2);
        assert_eq!(table.mounts_under(Path::new("/tmp/stack")).count(), 0);
    }

    #[test]
    fn the_live_table_of_this_process_parses_and_has_a_root() {
        let table = MountTable::read().unwrap();
        assert!(table.containing(Path::new("/proc/self")).is_some());
    }
}
