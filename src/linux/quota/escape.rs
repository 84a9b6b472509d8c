//! What is wrong with one inode against the project its volume belongs to — another project
//! ID, or a directory without PROJINHERIT — and how it is put back with `FS_IOC_FSSETXATTR`;
//! and the [`Tally`] a check keeps of what it found and did. The kernel moves an inode's
//! blocks to its new project as the ID changes, so setting it back charges what was written
//! meanwhile to the project again. The walk that visits a volume's inodes is in
//! [`escape_walk`](super::escape_walk).

use std::collections::BTreeSet;
use std::os::fd::BorrowedFd;

use nix::sys::stat::FileStat;

use super::sys::{self, FS_XFLAG_PROJINHERIT, Fsxattr};

/// The owner a fenced volume's escaped inodes are handed to: no pod can be it (Kubernetes
/// refuses a `runAsUser` above 2,147,483,647, and a pod in a user namespace of its own cannot
/// change a project ID at all), so none can change their project again. It is not
/// `(uid_t)-1`, which `chown` takes as "unchanged".
pub const QUARANTINE_UID: u32 = u32::MAX - 1;

/// How many other projects a tally names (the counts cover them all).
const NAMED_PROJECTS: usize = 8;

/// What is wrong with one inode against the project it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Escape {
    /// The project it is in instead, when that differs.
    pub other_project: Option<u32>,
    /// A directory whose new entries would not inherit the project.
    pub no_inherit: bool,
}

/// Whether an inode with `attr` (a directory if `dir`) has escaped project `want`.
pub fn escape(attr: &Fsxattr, dir: bool, want: u32) -> Option<Escape> {
    let other_project = (attr.projid != want).then_some(attr.projid);
    let no_inherit = dir && attr.xflags & FS_XFLAG_PROJINHERIT == 0;
    (other_project.is_some() || no_inherit).then_some(Escape {
        other_project,
        no_inherit,
    })
}

/// `attr` set back into project `want`; a directory also gets PROJINHERIT. Every other flag
/// stays as it was.
pub fn put_back(attr: &Fsxattr, dir: bool, want: u32) -> Fsxattr {
    let mut fixed = *attr;
    fixed.projid = want;
    if dir {
        fixed.xflags |= FS_XFLAG_PROJINHERIT;
    }
    fixed
}

/// What a check found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tally {
    /// Inodes looked at.
    pub inodes: u64,
    /// Inodes found in another project.
    pub other_project: u64,
    /// Directories found without PROJINHERIT.
    pub no_inherit: u64,
    /// The bytes those inodes in another project hold (their allocated blocks).
    pub bytes: u64,
    /// Escaped inodes set back.
    pub repaired: u64,
    /// Escaped inodes that could not be set back, with the first error.
    pub unrepaired: u64,
    pub first_error: Option<String>,
    /// Entries not looked into: gone or changed while looked at, and those below.
    pub skipped: u64,
    /// Of those, the ones the check could not reach (a mount point, an error, a directory
    /// moved out from under the walk): the volume is not known to hold to its size.
    pub unreached: u64,
    /// Inodes of a fenced volume handed to the quarantine owner ([`QUARANTINE_UID`]).
    pub quarantined: u64,
    /// Symlinks, FIFOs, sockets and device nodes of escaped directories made again in the
    /// project ([`remake`](super::remake)).
    pub remade: u64,
    /// Directories found moved out of the project again while this check was in them: their
    /// pod took them out again after they were set back.
    pub again: u64,
    /// Some of the other projects found (at most a few).
    pub projects: BTreeSet<u32>,
}

impl Tally {
    /// Whether anything escaped.
    pub fn found(&self) -> bool {
        self.other_project + self.no_inherit + self.again > 0
    }

    /// Whether the volume's condition is abnormal: something escaped, or something could not
    /// be checked.
    pub fn abnormal(&self) -> bool {
        self.found() || self.unreached > 0
    }

    /// Notes an entry the check could not reach, and why (the first one).
    pub(super) fn unreached(&mut self, why: impl FnOnce() -> String) {
        self.skipped += 1;
        self.unreached += 1;
        self.error(why);
    }

    /// Adds `other`'s findings to these.
    pub fn add(&mut self, other: &Tally) {
        self.inodes += other.inodes;
        self.other_project += other.other_project;
        self.no_inherit += other.no_inherit;
        self.bytes += other.bytes;
        self.repaired += other.repaired;
        self.unrepaired += other.unrepaired;
        self.skipped += other.skipped;
        self.unreached += other.unreached;
        self.quarantined += other.quarantined;
        self.remade += other.remade;
        self.again += other.again;
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
        for id in &other.projects {
            self.name_project(*id);
        }
    }

    /// What this tally found beyond `earlier`, a tally of the same check taken part-way (so
    /// a check noted early is not counted twice when noted at its end).
    pub fn since(&self, earlier: &Tally) -> Tally {
        Tally {
            inodes: self.inodes.saturating_sub(earlier.inodes),
            other_project: self.other_project.saturating_sub(earlier.other_project),
            no_inherit: self.no_inherit.saturating_sub(earlier.no_inherit),
            bytes: self.bytes.saturating_sub(earlier.bytes),
            repaired: self.repaired.saturating_sub(earlier.repaired),
            unrepaired: self.unrepaired.saturating_sub(earlier.unrepaired),
            skipped: self.skipped.saturating_sub(earlier.skipped),
            unreached: self.unreached.saturating_sub(earlier.unreached),
            quarantined: self.quarantined.saturating_sub(earlier.quarantined),
            remade: self.remade.saturating_sub(earlier.remade),
            again: self.again.saturating_sub(earlier.again),
            first_error: self.first_error.clone(),
            projects: self.projects.clone(),
        }
    }

    pub(super) fn name_project(&mut self, id: u32) {
        if self.projects.len() < NAMED_PROJECTS {
            self.projects.insert(id);
        }
    }

    pub(super) fn error(&mut self, what: impl FnOnce() -> String) {
        if self.first_error.is_none() {
            self.first_error = Some(what());
        }
    }

    /// One inode's attributes checked against `want` and, if it escaped, set back; with
    /// `fence`, the inode is also handed to that owner (escaped or not), so its pod, no longer
    /// the owner, cannot move it out again. Whether it had escaped.
    pub(super) fn visit(
        &mut self,
        fd: BorrowedFd<'_>,
        stat: &FileStat,
        dir: bool,
        want: u32,
        fence: Option<u32>,
    ) -> bool {
        let escaped = self.check(fd, stat, dir, want);
        if let Some(uid) = fence.filter(|uid| stat.st_uid != *uid) {
            let owner = Some(nix::unistd::Uid::from_raw(uid));
            self.handed(nix::unistd::fchown(fd, owner, None));
        }
        escaped
    }

    /// A fenced volume's symlink, FIFO, socket or device node (which no descriptor of ours
    /// reaches the ioctl through) handed to `fence` by name, never following a link.
    pub(super) fn hand_over_entry(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &std::ffi::OsStr,
        stat: &FileStat,
        fence: u32,
    ) {
        if stat.st_uid != fence {
            let owner = Some(nix::unistd::Uid::from_raw(fence));
            let how = nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW;
            self.handed(nix::unistd::fchownat(dir, name, owner, None, how));
        }
    }

    fn handed(&mut self, result: nix::Result<()>) {
        match result {
            Ok(()) => self.quarantined += 1,
            // Gone meanwhile: nothing left to hand over.
            Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => self.error(|| format!("hand to the quarantine owner: {e}")),
        }
    }

    fn check(&mut self, fd: BorrowedFd<'_>, stat: &FileStat, dir: bool, want: u32) -> bool {
        let attr = match sys::get_fsxattr(fd) {
            Ok(attr) => attr,
            Err(e) => {
                self.unreached(|| format!("FS_IOC_FSGETXATTR: {e}"));
                return false;
            }
        };
        let Some(escape) = escape(&attr, dir, want) else {
            return false;
        };
        if let Some(other) = escape.other_project {
            self.other_project += 1;
            self.bytes += blocks_bytes(stat);
            self.name_project(other);
        }
        if escape.no_inherit {
            self.no_inherit += 1;
        }
        match sys::set_fsxattr(fd, &put_back(&attr, dir, want)) {
            Ok(()) => self.repaired += 1,
            Err(e) => {
                self.unrepaired += 1;
                self.error(|| format!("FS_IOC_FSSETXATTR: {e}"));
            }
        }
        true
    }
}

fn blocks_bytes(stat: &FileStat) -> u64 {
    u64::try_from(stat.st_blocks)
        .unwrap_or(0)
        .saturating_mul(512)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(projid: u32, xflags: u32) -> Fsxattr {
        Fsxattr {
            projid,
            xflags,
            ..Fsxattr::default()
        }
    }

    const INHERIT: u32 = FS_XFLAG_PROJINHERIT;

    #[test]
    fn an_inode_in_its_project_and_a_directory_with_projinherit_have_not_escaped() {
        assert_eq!(escape(&attr(7, 0), false, 7), None);
        assert_eq!(escape(&attr(7, INHERIT), true, 7), None);
    }

    #[test]
    fn another_project_is_an_escape_for_a_file_and_for_a_directory() {
        let found = Escape {
            other_project: Some(0),
            no_inherit: false,
        };
        assert_eq!(escape(&attr(0, 0), false, 7), Some(found));
        assert_eq!(escape(&attr(0, INHERIT), true, 7), Some(found));
    }

    #[test]
    fn a_directory_without_projinherit_has_escaped_and_a_file_never_needs_it() {
        let found = Escape {
            other_project: None,
            no_inherit: true,
        };
        assert_eq!(escape(&attr(7, 0), true, 7), Some(found));
        assert_eq!(escape(&attr(7, 0), false, 7), None);
    }

    #[test]
    fn putting_back_sets_the_project_and_a_directorys_projinherit_and_keeps_other_flags() {
        const IMMUTABLE: u32 = 0x8;
        let file = put_back(&attr(0, IMMUTABLE), false, 7);
        assert_eq!((file.projid, file.xflags), (7, IMMUTABLE));
        let dir = put_back(&attr(9, IMMUTABLE), true, 7);
        assert_eq!((dir.projid, dir.xflags), (7, IMMUTABLE | INHERIT));
    }

    #[test]
    fn tallies_add_up_and_name_only_a_few_projects() {
        let mut total = Tally::default();
        for id in 0..20 {
            let one = Tally {
                inodes: 2,
                other_project: 1,
                bytes: 4096,
                repaired: 1,
                projects: [id].into(),
                first_error: (id == 3).then(|| "third".to_owned()),
                ..Tally::default()
            };
            total.add(&one);
        }
        assert_eq!(
            (total.inodes, total.other_project, total.bytes),
            (40, 20, 81920)
        );
        assert_eq!(total.projects.len(), NAMED_PROJECTS);
        assert_eq!(total.first_error.as_deref(), Some("third"));
        let rest = total.since(&Tally {
            inodes: 10,
            other_project: 5,
            bytes: 4096,
            ..Tally::default()
        });
        assert_eq!(
            (rest.inodes, rest.other_project, rest.bytes),
            (30, 15, 77824)
        );
        assert!(total.found());
        assert!(!Tally::default().found());
    }
}
