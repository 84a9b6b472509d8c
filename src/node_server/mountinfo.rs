//! The kernel's mount table (`/proc/self/mountinfo`), parsed: the one truth for "is it
//! mounted", "is it mounted *from this volume*" and "is anything mounted on or from this
//! directory". Nothing about mounts is cached elsewhere; every decision re-reads the table.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// One line of mountinfo, reduced to what decisions need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// `major:minor` of the filesystem.
    pub dev: (u32, u32),
    /// The directory of that filesystem that appears at the mount point (`/` unless a bind).
    pub root: PathBuf,
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
        self.dev == source.dev && self.root == source.path
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
        Self::parse(&text)
    }

    /// Parses mountinfo text; a malformed line is an error rather than a silent gap, because
    /// a missing entry could make a mounted directory look safe to delete.
    pub fn parse(text: &[u8]) -> std::io::Result<Self> {
        let entries = text
            .split(|&b| b == b'\n')
            .filter(|line| !line.is_empty())
            .map(|line| {
                parse_line(line).ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "malformed mountinfo line: {}",
                            String::from_utf8_lossy(line)
                        ),
                    )
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { entries })
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
            path: entry.root.join(rest),
        })
    }

    /// [`source_of`](Self::source_of), for a directory that must be somewhere.
    pub fn locate(&self, dir: &Path) -> Result<Source, Unlocatable> {
        self.source_of(dir)
            .ok_or_else(|| Unlocatable(dir.to_owned()))
    }

    /// Mounts that show `source` or anything inside it.
    pub fn mounts_from<'a>(&'a self, source: &'a Source) -> impl Iterator<Item = &'a MountEntry> {
        self.entries
            .iter()
            .filter(move |e| e.dev == source.dev && e.root.starts_with(&source.path))
    }

    /// Mounts whose mount point is `path` or lies below it.
    pub fn mounts_under<'a>(&'a self, path: &'a Path) -> impl Iterator<Item = &'a MountEntry> {
        self.entries
            .iter()
            .filter(move |e| e.mount_point.starts_with(path))
    }
}

/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
fn parse_line(line: &[u8]) -> Option<MountEntry> {
    let mut fields = line.split(|&b| b == b' ');
    let _id = fields.next()?;
    let _parent = fields.next()?;
    let dev = std::str::from_utf8(fields.next()?).ok()?;
    let (major, minor) = dev.split_once(':')?;
    let root = unescape(fields.next()?)?;
    let mount_point = unescape(fields.next()?)?;
    let options = std::str::from_utf8(fields.next()?).ok()?;
    // Optional fields run up to a lone "-"; the filesystem type and source follow it.
    fields.find(|f| *f == b"-")?;
    let _fs_type = fields.next()?;
    Some(MountEntry {
        dev: (major.parse().ok()?, minor.parse().ok()?),
        root,
        mount_point,
        options: options.split(',').map(str::to_owned).collect(),
    })
}

/// Undoes the kernel's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134`
/// backslash); paths are bytes, not necessarily UTF-8.
fn unescape(field: &[u8]) -> Option<PathBuf> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\' {
            let digits = field.get(i + 1..i + 4)?;
            let text = std::str::from_utf8(digits).ok()?;
            out.push(u8::from_str_radix(text, 8).ok()?);
            i += 4;
        } else {
            out.push(field[i]);
            i += 1;
        }
    }
    if out.first() != Some(&b'/') {
        return None;
    }
    Some(PathBuf::from(OsString::from_vec(out)))
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
";

    fn table() -> MountTable {
        MountTable::parse(SAMPLE.as_bytes()).unwrap()
    }

    #[test]
    fn every_line_of_a_real_shaped_table_is_parsed() {
        let table = table();
        assert_eq!(table.entries().len(), 6);
        let first = &table.entries()[0];
        assert_eq!(first.dev, (8, 1));
        assert_eq!(first.root, Path::new("/"));
        assert_eq!(first.options, ["rw", "relatime"]);
    }

    #[test]
    fn octal_escapes_in_paths_are_decoded() {
        let table = table();
        assert!(table.mounted_at(Path::new("/tmp/with space")).is_some());
        assert_eq!(
            unescape(b"/a\\011b\\012c\\134d").unwrap(),
            Path::new("/a\tb\nc\\d")
        );
    }

    #[test]
    fn a_truncated_escape_or_a_relative_path_is_malformed() {
        assert!(unescape(b"/a\\04").is_none());
        assert!(unescape(b"relative").is_none());
        assert!(MountTable::parse(b"1 2 8:1 / / rw\n").is_err());
        assert!(MountTable::parse(b"garbage\n").is_err());
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
        assert_eq!(table.mounts_under(Path::new("/var/lib/kubelet")).count(), 2);
        assert_eq!(table.mounts_under(Path::new("/tmp/stacked")).count(), 2);
        assert_eq!(table.mounts_under(Path::new("/tmp/stack")).count(), 0);
    }

    #[test]
    fn the_live_table_of_this_process_parses_and_has_a_root() {
        let table = MountTable::read().unwrap();
        assert!(table.containing(Path::new("/proc/self")).is_some());
    }
}
