//! The quota check's walk making an escaped directory's symlinks, FIFOs, sockets and device
//! nodes again in the volume's project, on a real XFS. XFS keeps project IDs without quota
//! enforcement, so this kernel (which has no project quotas) can run it; what the limits then
//! do is `booted::quota_vm`'s. A special inode's project is read with `file_getattr`
//! (Linux 6.17): the walk itself never needs it.

use std::ffi::CString;
use std::ops::ControlFlow;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt, symlink};
use std::path::Path;

use csi_nodekit::linux::quota::escape_walk::{self, Remakes};
use csi_nodekit::linux::quota::sys::{self, FS_XFLAG_PROJINHERIT};

use crate::common::scratch_fs::{Kind, ScratchFs};

const WANT: u32 = 7;

/// `file_getattr(2)` or `file_setattr(2)` (`nr`) of `path`, never following a symlink, with
/// `attr` as its `struct file_attr` (fa_xflags (u64), fa_extsize, fa_nextents, fa_projid,
/// fa_cowextsize); its result, or the error.
fn file_attr(nr: libc::c_long, path: &Path, attr: *mut u32) -> std::io::Result<()> {
    let dir = std::fs::File::open(path.parent().unwrap()).unwrap();
    let name = CString::new(path.file_name().unwrap().as_encoded_bytes()).unwrap();
    // SAFETY: a valid descriptor, a NUL-terminated name and a buffer of the size passed
    // (callers pass six u32s).
    let r = unsafe {
        libc::syscall(
            nr,
            dir.as_raw_fd(),
            name.as_ptr(),
            attr,
            24usize,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    match r {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// `file_getattr(2)`'s project ID of `path` (Linux 6.17: the one way to read a special inode's).
fn project_of_any(path: &Path) -> u32 {
    let mut attr = [0u32; 6];
    file_attr(468, path, attr.as_mut_ptr()).unwrap_or_else(|e| {
        panic!(
            "file_getattr of {} (needs Linux 6.17 or later to read a special inode's project): {e}",
            path.display()
        )
    });
    attr[4]
}

/// Sets a directory's (or file's) project, and PROJINHERIT on or off.
pub(super) fn set_project(dir: &Path, projid: u32, inherit: bool) {
    let file = std::fs::File::open(dir).unwrap();
    let mut attr = sys::get_fsxattr(std::os::fd::AsFd::as_fd(&file)).unwrap();
    attr.projid = projid;
    attr.xflags = match inherit {
        true => attr.xflags | FS_XFLAG_PROJINHERIT,
        false => attr.xflags & !FS_XFLAG_PROJINHERIT,
    };
    sys::set_fsxattr(std::os::fd::AsFd::as_fd(&file), &attr).unwrap();
}

fn walk_with_remakes(vol: &Path, aside: &Path) -> escape_walk::Walk {
    walk_for(vol, aside, &mut Default::default(), u64::MAX)
}

/// A walk with the directories `pending` from earlier walks, stopped after `inodes`.
fn walk_for(
    vol: &Path,
    aside: &Path,
    pending: &mut escape_walk::Pending,
    inodes: u64,
) -> escape_walk::Walk {
    let lift = || false;
    let mut remakes = Remakes {
        aside,
        lift: &lift,
        pending: std::mem::take(pending),
    };
    let walk = escape_walk::walk(vol, WANT, None, Some(&mut remakes), &mut |t| match t.inodes
        >= inodes
    {
        true => ControlFlow::Break(()),
        false => ControlFlow::Continue(()),
    })
    .expect("walk");
    *pending = remakes.pending;
    walk
}

#[test]
#[ignore = "needs root: mounts an XFS on a loop device"]
fn an_escaped_directorys_symlinks_fifos_sockets_and_devices_are_made_again_in_the_volumes_project()
{
    let (_fs, vol, aside) = volume_on_xfs();
    // A directory the pod moved to project 0, and what it made there meanwhile.
    let out = vol.join("out");
    std::fs::create_dir(&out).unwrap();
    set_project(&out, 0, false);
    symlink("/nowhere/at/all", out.join("link")).unwrap();
    nix::unistd::mkfifo(
        &out.join("fifo"),
        nix::sys::stat::Mode::from_bits(0o640).unwrap(),
    )
    .unwrap();
    std::fs::set_permissions(out.join("fifo"), std::fs::Permissions::from_mode(0o640)).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(out.join("sock")).unwrap();
    let null = nix::sys::stat::makedev(1, 3);
    let kind = nix::sys::stat::SFlag::S_IFCHR;
    nix::sys::stat::mknod(&out.join("null"), kind, nix::sys::stat::Mode::S_IRUSR, null).unwrap();
    for name in ["link", "fifo", "sock", "null"] {
        let path = out.join(name);
        let owner = nix::unistd::Uid::from_raw(1000);
        nix::unistd::fchownat(
            nix::fcntl::AT_FDCWD,
            &path,
            Some(owner),
            Some(nix::unistd::Gid::from_raw(1001)),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .unwrap();
        let t = nix::sys::time::TimeSpec::new(1_000_000_000, 5);
        nix::sys::stat::utimensat(
            nix::fcntl::AT_FDCWD,
            &path,
            &t,
            &t,
            nix::sys::stat::UtimensatFlags::NoFollowSymlink,
        )
        .unwrap();
        assert_eq!(project_of_any(&path), 0, "{name} starts outside");
    }
    // A hard-linked FIFO cannot be made again without splitting its names: said, not done.
    nix::unistd::mkfifo(&out.join("linked"), nix::sys::stat::Mode::S_IRUSR).unwrap();
    std::fs::hard_link(out.join("linked"), vol.join("other-name")).unwrap();
    // A symlink in a directory that never escaped is left alone.
    symlink("/elsewhere", vol.join("kept")).unwrap();
    let kept_ino = std::fs::symlink_metadata(vol.join("kept")).unwrap().ino();
    let before: Vec<_> = ["link", "fifo", "sock", "null"]
        .iter()
        .map(|n| std::fs::symlink_metadata(out.join(n)).unwrap())
        .collect();

    let walk = walk_with_remakes(&vol, &aside);

    assert_eq!(walk.tally.remade, 4, "{:?}", walk.tally);
    // The hard-linked FIFO, under both its names: in the escaped directory, and (XFS tells
    // its project) in the volume's root.
    assert_eq!(
        walk.tally.unreached, 2,
        "the hard-linked FIFO: {:?}",
        walk.tally
    );
    let said = walk.tally.first_error.clone().unwrap_or_default();
    assert!(said.contains("hard-linked"), "{said}");
    for (name, was) in ["link", "fifo", "sock", "null"].iter().zip(&before) {
        let path = out.join(name);
        let now = std::fs::symlink_metadata(&path).unwrap();
        assert_ne!(now.ino(), was.ino(), "{name} is a new inode");
        assert_eq!(
            project_of_any(&path),
            WANT,
            "{name} is in the volume's project"
        );
        assert_eq!(
            (now.mode(), now.uid(), now.gid(), now.rdev()),
            (was.mode(), was.uid(), was.gid(), was.rdev()),
            "{name} keeps its kind, mode, owner and device"
        );
        assert_eq!(
            (now.mtime(), now.mtime_nsec()),
            (1_000_000_000, 5),
            "{name}"
        );
        assert_eq!(
            (now.atime(), now.atime_nsec()),
            (1_000_000_000, 5),
            "{name}"
        );
    }
    assert_eq!(
        std::fs::read_link(out.join("link")).unwrap(),
        Path::new("/nowhere/at/all")
    );
    let kinds = |n: &str| std::fs::symlink_metadata(out.join(n)).unwrap().file_type();
    assert!(kinds("fifo").is_fifo() && kinds("sock").is_socket() && kinds("null").is_char_device());
    assert_eq!(
        project_of_any(&out.join("linked")),
        0,
        "the hard-linked FIFO stays"
    );
    let kept = std::fs::symlink_metadata(vol.join("kept")).unwrap();
    assert_eq!(
        kept.ino(),
        kept_ino,
        "a symlink in a directory that never escaped"
    );
    assert!(
        !aside.exists(),
        "the private directory is removed after the walk"
    );

    // Nothing is made again once nothing escaped.
    assert_eq!(walk_with_remakes(&vol, &aside).tally.remade, 0);
}

/// A fresh XFS with a volume `vol` in project [`WANT`] (with PROJINHERIT), and a path beside
/// it for the walk's private directory.
fn volume_on_xfs() -> (ScratchFs, std::path::PathBuf, std::path::PathBuf) {
    let fs = ScratchFs::new(Kind::Xfs);
    let vol = fs.path().join("vol");
    let aside = fs.path().join(".aside");
    std::fs::create_dir(&vol).unwrap();
    set_project(&vol, WANT, true);
    (fs, vol, aside)
}

/// A volume in project [`WANT`] on a fresh XFS, and its directory `out` moved to project 0
/// with ten symlinks made there meanwhile.
fn ten_symlinks_out_of_the_project() -> (ScratchFs, std::path::PathBuf, std::path::PathBuf) {
    let (fs, vol, _) = volume_on_xfs();
    let out = vol.join("out");
    std::fs::create_dir(&out).unwrap();
    set_project(&out, 0, false);
    for i in 0..10 {
        symlink("/nowhere", out.join(format!("l{i}"))).unwrap();
    }
    (fs, vol, out)
}

#[test]
#[ignore = "needs root: mounts an XFS on a loop device"]
fn a_walk_cut_short_leaves_the_escaped_directory_to_the_next_which_makes_its_entries_again() {
    let (fs, vol, out) = ten_symlinks_out_of_the_project();
    let aside = fs.path().join(".aside");
    let mut pending = Default::default();
    // Stopped once it has set the directory back and made a few of its entries again.
    let first = walk_for(&vol, &aside, &mut pending, 5);
    assert!(first.stopped && first.tally.found(), "{:?}", first.tally);
    assert!(first.tally.remade < 10, "{:?}", first.tally);
    let out_ino = std::fs::metadata(&out).unwrap().ino();
    assert!(pending.dirs.contains(u128::from(out_ino)), "{pending:?}");
    // The directory is no longer found escaped; the next walk makes the rest again anyway.
    let second = walk_for(&vol, &aside, &mut pending, u64::MAX);
    assert!(!second.tally.found(), "{:?}", second.tally);
    assert_eq!(
        first.tally.remade + second.tally.remade,
        10,
        "each made again once: {:?}",
        second.tally
    );
    for i in 0..10 {
        assert_eq!(project_of_any(&out.join(format!("l{i}"))), WANT, "l{i}");
    }
    assert!(pending.dirs.is_empty(), "nothing left: {pending:?}");
}

#[test]
#[ignore = "needs root: mounts an XFS on a loop device"]
fn a_directory_moved_out_again_while_its_entries_are_made_again_is_set_back_and_counted() {
    let (fs, vol, out) = ten_symlinks_out_of_the_project();
    let aside = fs.path().join(".aside");
    let lift = || false;
    let mut remakes = Remakes {
        aside: &aside,
        lift: &lift,
        pending: Default::default(),
    };
    // The pod's move, once the walk has set the directory back and made a few entries again.
    let mut moved = false;
    let walk = escape_walk::walk(&vol, WANT, None, Some(&mut remakes), &mut |t| {
        if t.inodes == 5 && !moved {
            set_project(&out, 0, false);
            moved = true;
        }
        ControlFlow::Continue(())
    })
    .expect("walk");
    assert!(moved);
    assert_eq!(walk.tally.again, 1, "{:?}", walk.tally);
    assert_eq!(walk.tally.remade, 10, "{:?}", walk.tally);
    for i in 0..10 {
        assert_eq!(project_of_any(&out.join(format!("l{i}"))), WANT, "l{i}");
    }
    let file = std::fs::File::open(&out).unwrap();
    let attr = sys::get_fsxattr(std::os::fd::AsFd::as_fd(&file)).unwrap();
    assert_eq!(attr.projid, WANT, "the directory is back in the project");
}

/// `file_setattr(2)` of `path`'s project ID, never following a symlink: what a pod's directory
/// moved out and back leaves in its entries.
fn set_project_of_any(path: &Path, projid: u32) {
    let mut attr: [u32; 6] = [0, 0, 0, 0, projid, 0];
    file_attr(469, path, attr.as_mut_ptr()).expect("file_setattr");
}

#[test]
#[ignore = "needs root: mounts an XFS on a loop device"]
fn on_xfs_a_symlink_or_fifo_out_of_the_project_in_a_directory_that_is_back_is_found_and_made_again()
{
    let (_fs, vol, aside) = volume_on_xfs();
    let dir = vol.join("d");
    std::fs::create_dir(&dir).unwrap();
    symlink("/nowhere", dir.join("out-link")).unwrap();
    nix::unistd::mkfifo(&dir.join("out-fifo"), nix::sys::stat::Mode::S_IRUSR).unwrap();
    symlink("/elsewhere", dir.join("in-link")).unwrap();
    // Made while the directory was out of the project; the directory itself is back in it.
    set_project_of_any(&dir.join("out-link"), 0);
    set_project_of_any(&dir.join("out-fifo"), 0);
    assert_eq!(project_of_any(&dir.join("in-link")), WANT);
    let in_ino = std::fs::symlink_metadata(dir.join("in-link"))
        .unwrap()
        .ino();

    let walk = walk_with_remakes(&vol, &aside);

    assert_eq!(walk.tally.other_project, 2, "{:?}", walk.tally);
    assert_eq!(
        (walk.tally.remade, walk.tally.repaired),
        (2, 2),
        "{:?}",
        walk.tally
    );
    assert!(walk.tally.found() && walk.tally.projects.contains(&0));
    for name in ["out-link", "out-fifo"] {
        assert_eq!(project_of_any(&dir.join(name)), WANT, "{name}");
    }
    let in_now = std::fs::symlink_metadata(dir.join("in-link"))
        .unwrap()
        .ino();
    assert_eq!(in_now, in_ino, "an entry in the project is left alone");
}

/// Sets a regular file's project (it can be opened), as a pod moving it out does.
fn set_file_project(path: &Path, projid: u32) {
    let file = std::fs::File::open(path).unwrap();
    let mut attr = sys::get_fsxattr(std::os::fd::AsFd::as_fd(&file)).unwrap();
    attr.projid = projid;
    sys::set_fsxattr(std::os::fd::AsFd::as_fd(&file), &attr).unwrap();
}

#[test]
#[ignore = "needs root: mounts an XFS on a loop device"]
fn a_pod_swapping_names_while_entries_are_made_again_loses_nothing_in_a_thousand_rounds() {
    const ROUNDS: usize = 1_000;
    let (_fs, vol, aside) = volume_on_xfs();
    let dir = vol.join("d");
    std::fs::create_dir(&dir).unwrap();
    let (link, file) = (dir.join("s"), dir.join("x"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swaps = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (mut swapped_rounds, mut remade) = (0, 0);
    for round in 0..ROUNDS {
        // A symlink and a file with data, both out of the project, swapped over and over.
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_file(&file);
        symlink("/nowhere", &link).unwrap();
        std::fs::write(&file, b"data").unwrap();
        set_project_of_any(&link, 0);
        set_file_project(&file, 0);
        stop.store(false, std::sync::atomic::Ordering::SeqCst);
        let racer = {
            let (stop, swaps, link, file) =
                (stop.clone(), swaps.clone(), link.clone(), file.clone());
            std::thread::spawn(move || {
                let flag = nix::fcntl::RenameFlags::RENAME_EXCHANGE;
                let at = nix::fcntl::AT_FDCWD;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    if nix::fcntl::renameat2(at, &link, at, &file, flag).is_ok() {
                        swaps.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            })
        };
        let walk = walk_with_remakes(&vol, &aside);
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        racer.join().unwrap();
        swapped_rounds += usize::from(walk.tally.skipped > 0);
        remade += walk.tally.remade;
        // Both names are there, one the symlink and one the file with its data, whatever
        // the walk met: nothing was removed that was not the inode it looked at.
        let kinds: Vec<_> = [&link, &file]
            .iter()
            .map(|p| std::fs::symlink_metadata(p).unwrap().file_type())
            .collect();
        assert_eq!(
            kinds.iter().filter(|k| k.is_symlink()).count(),
            1,
            "round {round}: {:?}",
            walk.tally
        );
        let data = [&link, &file]
            .iter()
            .find(|p| std::fs::symlink_metadata(p).unwrap().is_file())
            .map(|p| std::fs::read(p).unwrap());
        assert_eq!(data.as_deref(), Some(&b"data"[..]), "round {round}");
        assert!(
            !aside.exists(),
            "round {round}: the private directory is left with {:?}",
            std::fs::read_dir(&aside).map(|d| d.count())
        );
    }
    let swaps = swaps.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "{ROUNDS} rounds, {swaps} swaps by the pod: {remade} entries made again, {swapped_rounds} \
         rounds met an entry that changed while it was checked or made again (left, or given back)"
    );
    assert!(swaps > ROUNDS as u64, "the pod swapped throughout: {swaps}");
}

#[test]
#[ignore = "needs root: mounts an XFS on a loop device"]
fn an_entry_replaced_after_it_was_looked_at_is_given_back_as_it_is_not_made_again() {
    use csi_nodekit::linux::quota::remake::Aside;
    let (_fs, vol, aside) = volume_on_xfs();
    let name = vol.join("s");
    symlink("/first", &name).unwrap();
    let looked_at = nix::sys::stat::lstat(&name).unwrap();
    // The pod puts another symlink under the name between the walk's look and the remake.
    std::fs::remove_file(&name).unwrap();
    symlink("/second", &name).unwrap();
    let replaced = std::fs::symlink_metadata(&name).unwrap().ino();
    assert_ne!(replaced, looked_at.st_ino);
    let private = Aside::open(&aside, WANT).unwrap();
    let dir = std::fs::File::open(&vol).unwrap();

    let made = private
        .remake(
            std::os::fd::AsFd::as_fd(&dir),
            std::ffi::OsStr::new("s"),
            &looked_at,
            0,
        )
        .unwrap();

    assert!(made.is_none(), "nothing was made again: {made:?}");
    let now = std::fs::symlink_metadata(&name).unwrap();
    assert_eq!(
        now.ino(),
        replaced,
        "the pod's symlink is back under its name"
    );
    assert_eq!(std::fs::read_link(&name).unwrap(), Path::new("/second"));
    assert_eq!(
        std::fs::read_dir(&aside).unwrap().count(),
        0,
        "and nothing is left aside"
    );
}

/// A special inode's ctime, to the nanosecond.
fn ctime_of(path: &Path) -> (i64, i64) {
    let meta = std::fs::symlink_metadata(path).unwrap();
    (meta.ctime(), meta.ctime_nsec())
}

// How the walk asks a special inode's project on ext4, which has no other way to tell it; the
// walk itself asks so on ext4 alone, in the quota VM (booted::quota_vm, the hidden flood).
#[test]
#[ignore = "needs root: mounts an XFS on a loop device"]
fn a_hard_link_into_the_private_directory_tells_whether_a_special_inode_is_in_the_project() {
    use csi_nodekit::linux::quota::remake::{Aside, Probe};
    let (_fs, vol, aside) = volume_on_xfs();
    symlink("/in", vol.join("in-link")).unwrap();
    symlink("/out", vol.join("out-link")).unwrap();
    nix::unistd::mkfifo(&vol.join("out-fifo"), nix::sys::stat::Mode::S_IRUSR).unwrap();
    nix::unistd::mkfifo(&vol.join("zero-fifo"), nix::sys::stat::Mode::S_IRUSR).unwrap();
    set_project_of_any(&vol.join("out-link"), 9);
    set_project_of_any(&vol.join("out-fifo"), 9);
    set_project_of_any(&vol.join("zero-fifo"), 0);
    let private = Aside::open(&aside, WANT).unwrap();
    let dir = std::fs::File::open(&vol).unwrap();
    let probe = |name: &str| {
        let stat = nix::sys::stat::lstat(&vol.join(name)).unwrap();
        let at = std::os::fd::AsFd::as_fd(&dir);
        private
            .probe(at, std::ffi::OsStr::new(name), &stat)
            .unwrap()
    };
    let before = ctime_of(&vol.join("in-link"));
    let in_ino = std::fs::symlink_metadata(vol.join("in-link"))
        .unwrap()
        .ino();
    std::thread::sleep(std::time::Duration::from_millis(20));

    let asked = probe("in-link");

    let Probe::In(now) = asked else {
        panic!("in-link is in the project: {asked:?}")
    };
    assert_eq!(now.st_ino, in_ino, "the same inode, left in place");
    assert_eq!(now.st_nlink, 1, "the link is removed");
    assert_eq!(
        (now.st_ctime, now.st_ctime_nsec),
        ctime_of(&vol.join("in-link")),
        "the inode as the probe left it"
    );
    assert_ne!(ctime_of(&vol.join("in-link")), before, "its ctime changed");
    assert_eq!(project_of_any(&vol.join("in-link")), WANT);
    for name in ["out-link", "out-fifo"] {
        assert!(matches!(probe(name), Probe::Out), "{name}");
        assert_eq!(project_of_any(&vol.join(name)), 9, "{name} is untouched");
    }
    // XFS lets a FIFO, socket or device node of project 0 be linked into any project (quota
    // set-up tools skip them): there the probe cannot tell, and the walk reads the project
    // by the inode's number instead.
    assert!(matches!(probe("zero-fifo"), Probe::In(_)));
    assert_eq!(project_of_any(&vol.join("zero-fifo")), 0);
    // Removed after it was looked at: nothing to ask.
    let gone = nix::sys::stat::lstat(&vol.join("in-link")).unwrap();
    std::fs::remove_file(vol.join("in-link")).unwrap();
    let at = std::os::fd::AsFd::as_fd(&dir);
    let went = private
        .probe(at, std::ffi::OsStr::new("in-link"), &gone)
        .unwrap();
    assert!(matches!(went, Probe::Gone), "{went:?}");
    assert_eq!(
        std::fs::read_dir(&aside).unwrap().count(),
        0,
        "no link is left aside"
    );
}
