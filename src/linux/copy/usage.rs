//! What a tree really holds, as a quota charges it: the blocks allocated to its inodes (holes
//! excluded, each hard-linked inode once) and the number of inodes, its root included. Walked
//! as a copy walks (relative to open directories, never following a symlink, never crossing
//! into another mount, a vanished entry skipped), so it counts what a copy of the tree would
//! be charged for. For checking a restore's or a clone's source against the size asked for
//! before anything is copied.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;

use super::copy_error::CopyError;
use super::dir_entries::{Stat, open_dir, read_names, statx};
use super::open_source_dir;
use crate::linux::dir_stack::{DirId, DirStack, OpenDir};
use crate::path_io::PathIoError;

/// A tree's allocated bytes and inodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeUsage {
    pub bytes: u64,
    pub inodes: u64,
}

/// Sums what the tree `src` (a directory) holds, however deep.
pub fn tree_usage(src: &Path) -> Result<TreeUsage, CopyError> {
    let (dir, root) = open_source_dir(src)?;
    let mut walk = Walk {
        root,
        seen: HashSet::new(),
        total: TreeUsage::default(),
    };
    walk.add(&root);
    let dir = OwnedFd::from(dir);
    let Some(first) = level(dir, OsStr::new(""), src)? else {
        return Ok(walk.total);
    };
    let mut stack = DirStack::new(first);
    while let Some(top) = stack.last_mut() {
        let next = top.names.pop();
        let Some(name) = next else {
            let shown = stack.shown(src, None);
            stack
                .pop()
                .map_err(PathIoError::errno_at("return to the parent of", &shown))?;
            continue;
        };
        let dir = stack.last().expect("a level was just looked at").fd();
        let stat = match statx(dir, &name) {
            Ok(stat) => stat,
            Err(Errno::ENOENT) => continue,
            Err(e) => {
                return Err(
                    PathIoError::errno_at("stat", &stack.shown(src, Some(&name)))(e).into(),
                );
            }
        };
        // A mount point is not copied, and what is under it is not ours to count.
        if !stat.same_mount(&walk.root) {
            continue;
        }
        if !stat.is_dir() && stat.nlink > 1 && !walk.seen.insert(stat.inode()) {
            continue;
        }
        walk.add(&stat);
        if !stat.is_dir() {
            continue;
        }
        let path = stack.shown(src, Some(&name));
        match open_dir(dir, &name) {
            Ok(fd) => {
                if let Some(below) = level(fd, &name, &path)? {
                    stack.push(below);
                }
            }
            // Gone, or swapped for something else under the name: nothing to count there.
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => {}
            Err(e) => return Err(PathIoError::errno_at("open", &path)(e).into()),
        }
    }
    Ok(walk.total)
}

/// A directory opened for the walk, with its names; `None` if it is gone already.
fn level(dir: OwnedFd, name: &OsStr, path: &Path) -> Result<Option<OpenDir>, CopyError> {
    let names = match read_names(dir.as_fd()) {
        Ok(names) => names,
        Err(Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(PathIoError::errno_at("read directory", path)(e).into()),
    };
    let id = DirId::of(dir.as_fd()).map_err(PathIoError::errno_at("stat", path))?;
    Ok(Some(OpenDir {
        dir: Some(dir),
        id,
        name: name.to_owned(),
        names,
    }))
}

struct Walk {
    root: Stat,
    /// Inodes with more than one link, counted once.
    seen: HashSet<(u64, u64)>,
    total: TreeUsage,
}

impl Walk {
    fn add(&mut self, stat: &Stat) {
        self.total.bytes = self
            .total
            .bytes
            .saturating_add(stat.blocks.saturating_mul(512));
        self.total.inodes += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn blocks(path: &Path) -> u64 {
        std::fs::symlink_metadata(path).unwrap().blocks() * 512
    }

    #[test]
    fn a_tree_counts_every_inode_once_and_its_allocated_blocks() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("tree");
        std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
        std::fs::write(root.join("a"), vec![1u8; 100_000]).unwrap();
        std::fs::write(root.join("sub/deeper/b"), vec![2u8; 5000]).unwrap();
        std::fs::hard_link(root.join("a"), root.join("sub/a-again")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
        // Sparse: a hole costs nothing.
        std::fs::File::create(root.join("sparse"))
            .unwrap()
            .set_len(1 << 30)
            .unwrap();
        let usage = tree_usage(&root).unwrap();
        let expected: u64 = [
            "",
            "a",
            "sub",
            "sub/deeper",
            "sub/deeper/b",
            "link",
            "sparse",
        ]
        .iter()
        .map(|p| blocks(&root.join(p)))
        .sum();
        assert_eq!(
            usage.inodes, 7,
            "root, a (once), sub, deeper, b, link, sparse"
        );
        assert_eq!(usage.bytes, expected);
        assert!(usage.bytes >= 100_000, "{usage:?}");
        assert!(usage.bytes < 1 << 20, "the hole is not counted: {usage:?}");
    }

    #[test]
    fn a_file_given_as_the_tree_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(
            tree_usage(&file),
            Err(CopyError::SourceNotADirectory(_))
        ));
    }
}
