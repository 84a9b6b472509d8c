//! Inside the VM: loop-backed XFS and ext4 filesystems made and mounted for one case, and a
//! writer process that fills a file until the kernel says no.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use csi_nodekit::linux::quota::FsKind;

/// The unprivileged user the writer runs as: a pod's process has no CAP_SYS_RESOURCE.
pub const NOBODY: u32 = 65534;

/// How a test filesystem is made and mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prep {
    /// XFS with `-o prjquota`; ext4 with `-O quota,project` and `-o prjquota`.
    Prepared,
    /// ext4 with `-O quota,project` but mounted without prjquota (accounted, not enforced).
    FeaturesOnly,
    /// Plain mkfs, mounted without quota options.
    Plain,
}

/// A filesystem on a loop device over a sparse image, unmounted (and the loop device
/// detached) on drop.
pub struct TestFs {
    pub kind: FsKind,
    pub mnt: PathBuf,
    _scratch: tempfile::TempDir,
}

impl TestFs {
    pub fn new(kind: FsKind, prep: Prep) -> Self {
        let scratch = tempfile::Builder::new()
            .prefix("quota-vm-")
            .tempdir()
            .expect("scratch dir");
        let image = scratch.path().join("image");
        let mnt = scratch.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mount point");
        let file = std::fs::File::create(&image).expect("image");
        file.set_len(128 << 20).expect("size image");
        drop(file);
        let (mkfs, options) = match (kind, prep) {
            (FsKind::Xfs, Prep::Plain) => (mkfs_xfs(&image), "loop"),
            (FsKind::Xfs, _) => (mkfs_xfs(&image), "loop,prjquota"),
            (FsKind::Ext4, Prep::Plain) => (mkfs_ext4(&image, None), "loop"),
            (FsKind::Ext4, Prep::FeaturesOnly) => {
                (mkfs_ext4(&image, Some("quota,project")), "loop")
            }
            (FsKind::Ext4, Prep::Prepared) => {
                (mkfs_ext4(&image, Some("quota,project")), "loop,prjquota")
            }
        };
        run(mkfs);
        let fstype = match kind {
            FsKind::Xfs => "xfs",
            FsKind::Ext4 => "ext4",
        };
        let mut mount = Command::new("mount");
        mount
            .args(["-t", fstype, "-o", options])
            .arg(&image)
            .arg(&mnt);
        run(mount);
        Self {
            kind,
            mnt,
            _scratch: scratch,
        }
    }

    /// A new directory on the filesystem.
    pub fn dir(&self, name: &str) -> PathBuf {
        let dir = self.mnt.join(name);
        std::fs::create_dir(&dir).expect("create dir");
        dir
    }

    /// Flushes everything, so delayed allocations are charged and st_blocks is final.
    pub fn sync(&self) {
        let file = std::fs::File::open(&self.mnt).expect("open mount");
        nix::unistd::syncfs(file).expect("syncfs");
    }

    /// The errno an unprivileged writer gets at the limit: XFS reports project quotas as a
    /// full filesystem, ext4 as an exceeded quota.
    pub fn limit_errno(&self) -> i32 {
        match self.kind {
            FsKind::Xfs => libc::ENOSPC,
            FsKind::Ext4 => libc::EDQUOT,
        }
    }
}

impl Drop for TestFs {
    fn drop(&mut self) {
        // The loop device was set up by mount with autoclear: unmounting detaches it.
        if let Err(e) = nix::mount::umount(&self.mnt) {
            eprintln!("umount {}: {e}", self.mnt.display());
        }
    }
}

pub fn mkfs_xfs(image: &Path) -> Command {
    let mut cmd = Command::new("mkfs.xfs");
    // mkfs.xfs refuses filesystems under 300 MB unless told it is making a test filesystem.
    cmd.envs([("TEST_DIR", "1"), ("TEST_DEV", "1"), ("QA_CHECK_FS", "1")])
        .args(["-q", "-f"])
        .arg(image);
    cmd
}

pub fn mkfs_ext4(image: &Path, features: Option<&str>) -> Command {
    let mut cmd = Command::new("mkfs.ext4");
    // Project IDs live in the large inode's extra space: small filesystems default to
    // 128-byte inodes, which cannot hold them.
    cmd.args(["-q", "-F", "-I", "256"]);
    if let Some(features) = features {
        cmd.args(["-O", features]);
    }
    cmd.arg(image);
    cmd
}

pub fn run(mut cmd: Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What one writer process did.
#[derive(Debug, Clone, Copy)]
pub struct Written {
    pub bytes: u64,
    /// The errno that stopped it (0: it reached its own cap).
    pub errno: i32,
    /// Its effective capabilities, as /proc/self/status shows them.
    pub cap_eff: u64,
    /// The errno of its attribute change (0: none asked, or it worked).
    pub attr_errno: i32,
    /// From its attribute change (or its start) to its stop.
    pub millis: u64,
}

/// Appends to `file` in 64 KiB writes until an error or `cap` bytes, in a child process
/// running as `uid` (NOBODY drops every capability, as in a pod; 0 keeps root's).
pub fn write_until_error(file: &Path, cap: u64, uid: u32) -> Written {
    run_writer("bytes", file, cap, uid)
}

/// Creates empty files in `dir` until an error or `cap` files, as [`write_until_error`]
/// does bytes; `bytes` in the result counts files.
pub fn create_until_error(dir: &Path, cap: u64, uid: u32) -> Written {
    run_writer("files", dir, cap, uid)
}

fn run_writer(mode: &str, file: &Path, cap: u64, uid: u32) -> Written {
    let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
    if uid != 0 {
        cmd.uid(uid).gid(uid);
    }
    writer_result(writer_command(cmd, mode, file, cap))
}

/// `cmd` (the test binary, or a wrapper that runs it) told to play the writer.
fn writer_command(mut cmd: Command, mode: &str, file: &Path, cap: u64) -> Command {
    cmd.args([
        "--exact",
        super::TEST_NAME,
        "--include-ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(super::ROLE, "writer")
    .env("QUOTA_VM_WRITER_MODE", mode)
    .env("QUOTA_VM_WRITER_FILE", file)
    .env("QUOTA_VM_WRITER_CAP", cap.to_string());
    cmd
}

/// Runs a writer command and reads its result line.
fn writer_result(mut cmd: Command) -> Written {
    let out = cmd.output().expect("run writer");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        // libtest may have printed "test … ... " before it on the same line.
        .find_map(|l| l.split_once("quota-vm-writer: ").map(|(_, result)| result))
        .unwrap_or_else(|| {
            panic!(
                "writer printed no result ({}):\n{stdout}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let field = |name: &str| -> u64 {
        line.split(' ')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| u64::from_str_radix(v, if name == "capeff" { 16 } else { 10 }).ok())
            .unwrap_or_else(|| panic!("writer line without {name}: {line}"))
    };
    Written {
        bytes: field("wrote"),
        errno: field("errno") as i32,
        cap_eff: field("capeff"),
        attr_errno: field("attrerrno") as i32,
        millis: field("ms"),
    }
}

/// Who a pod's process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodUser {
    /// uid 1000 without capabilities (a pod with `runAsUser: 1000`).
    Uid1000,
    /// uid 0 with every capability dropped (`capabilities: drop: [ALL]`): it still owns what
    /// root made, the volume's root among them.
    RootWithoutCaps,
    /// uid 1000 on the host, root of a user namespace of its own (`hostUsers: false`).
    UserNamespace,
}

/// The unprivileged uid of [`PodUser::Uid1000`].
pub const POD_UID: u32 = 1000;

/// An attribute change a pod makes with FS_IOC_FSSETXATTR (what `chattr -p` / `chattr -P` do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttrChange {
    /// Into project N.
    Project(u32),
    /// PROJINHERIT cleared.
    NoInherit,
}

/// What a pod does: `change` on `attr_path` (a directory made first if missing, before
/// `file` is created in it; `file` itself is created first), then appends to `file` up to
/// `cap` bytes, at `rate` bytes a second (0: as fast as it can), until an error.
pub fn pod_write(
    user: PodUser,
    attr_path: &Path,
    change: AttrChange,
    file: &Path,
    cap: u64,
    rate: u64,
) -> Written {
    let exe = std::env::current_exe().expect("current exe");
    let mut cmd = match user {
        PodUser::UserNamespace => {
            let mut cmd = Command::new("unshare");
            cmd.args(["--user", "--map-root-user"]).arg(exe);
            cmd
        }
        _ => Command::new(exe),
    };
    match user {
        PodUser::Uid1000 | PodUser::UserNamespace => {
            cmd.uid(POD_UID).gid(POD_UID);
        }
        PodUser::RootWithoutCaps => {
            // SAFETY: only prctl between fork and exec, which allocates nothing.
            unsafe { cmd.pre_exec(drop_every_capability) };
        }
    }
    let change = match change {
        AttrChange::Project(id) => format!("project={id}"),
        AttrChange::NoInherit => "noinherit".to_owned(),
    };
    let mut cmd = writer_command(cmd, "bytes", file, cap);
    cmd.env("QUOTA_VM_WRITER_ATTR_PATH", attr_path)
        .env("QUOTA_VM_WRITER_ATTR", change)
        .env("QUOTA_VM_WRITER_RATE", rate.to_string());
    writer_result(cmd)
}

/// Empties the bounding and ambient sets, so root's exec gains no capability.
fn drop_every_capability() -> std::io::Result<()> {
    for cap in 0..64 {
        // SAFETY: prctl with integer arguments; EINVAL past the last capability is ignored.
        unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
    }
    // SAFETY: as above.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    Ok(())
}

/// The writer's FS_IOC_FSSETXATTR on `path`: its errno (0 when it worked).
fn change_attr(path: &Path, change: &str) -> i32 {
    let errno_of = |e: std::io::Error| e.raw_os_error().unwrap_or(-1);
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) => return errno_of(e),
    };
    use csi_nodekit::linux::quota::sys;
    use std::os::fd::AsFd;
    let mut attr = match sys::get_fsxattr(file.as_fd()) {
        Ok(attr) => attr,
        Err(e) => return errno_of(e),
    };
    match change.strip_prefix("project=") {
        Some(id) => attr.projid = id.parse().expect("project ID"),
        None => attr.xflags &= !sys::FS_XFLAG_PROJINHERIT,
    }
    match sys::set_fsxattr(file.as_fd(), &attr) {
        Ok(()) => 0,
        Err(e) => errno_of(e),
    }
}

/// The writer process's body (role `writer`).
pub fn writer_main() {
    use std::io::Write;
    let file = std::env::var_os("QUOTA_VM_WRITER_FILE").expect("writer file");
    let cap: u64 = std::env::var("QUOTA_VM_WRITER_CAP")
        .expect("cap")
        .parse()
        .expect("cap");
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(str::trim)
        .unwrap_or("?")
        .to_owned();
    let (mut wrote, mut errno, mut attr_errno) = (0u64, 0, 0);
    let mut started = std::time::Instant::now();
    let errno_of = |e: std::io::Error| e.raw_os_error().unwrap_or(-1);
    let mode = std::env::var("QUOTA_VM_WRITER_MODE").unwrap_or_default();
    if mode == "flood" || mode == "hidden-flood" {
        let (made, moves, last) = flood(Path::new(&file), cap, mode == "hidden-flood");
        println!(
            "quota-vm-writer: wrote={made} errno={last} capeff={cap_eff} attrerrno={moves} ms={}",
            started.elapsed().as_millis()
        );
        return;
    }
    if std::env::var("QUOTA_VM_WRITER_MODE").as_deref() == Ok("escaper") {
        let millis = cap;
        let (bytes, escapes, last) = escape_again_and_again(Path::new(&file), millis);
        println!(
            "quota-vm-writer: wrote={bytes} errno={last} capeff={cap_eff} attrerrno={escapes} \
             ms={}",
            started.elapsed().as_millis()
        );
        return;
    }
    if std::env::var("QUOTA_VM_WRITER_MODE").as_deref() == Ok("files") {
        let dir = PathBuf::from(file);
        while wrote < cap {
            match std::fs::File::create_new(dir.join(format!("f{wrote}"))) {
                Ok(_) => wrote += 1,
                Err(e) => {
                    errno = errno_of(e);
                    break;
                }
            }
        }
    } else {
        let attr_path = std::env::var_os("QUOTA_VM_WRITER_ATTR_PATH").map(PathBuf::from);
        let change = std::env::var("QUOTA_VM_WRITER_ATTR").unwrap_or_default();
        let rate: u64 = std::env::var("QUOTA_VM_WRITER_RATE")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let file = PathBuf::from(file);
        let on_file = attr_path.as_deref() == Some(file.as_path());
        if let Some(dir) = attr_path.as_deref().filter(|_| !on_file) {
            if !dir.exists() {
                std::fs::create_dir(dir).expect("the pod's directory");
            }
            attr_errno = change_attr(dir, &change);
        }
        // Creating the file is itself charged to the project: when another writer has already
        // filled the volume, the create is where this one meets the limit.
        let opened = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&file);
        let mut out = match opened {
            Ok(out) => out,
            Err(e) => {
                println!(
                    "quota-vm-writer: wrote=0 errno={} capeff={cap_eff} attrerrno={attr_errno} ms=0",
                    errno_of(e)
                );
                return;
            }
        };
        if on_file {
            attr_errno = change_attr(&file, &change);
        }
        started = std::time::Instant::now();
        let chunk = vec![0xa5u8; 64 << 10];
        while wrote < cap {
            if rate > 0 {
                // A pod writing at `rate`: the next chunk is due when the ones before fit it.
                let due = std::time::Duration::from_secs_f64(wrote as f64 / rate as f64);
                if let Some(ahead) = due.checked_sub(started.elapsed()) {
                    std::thread::sleep(ahead);
                }
            }
            match out.write(&chunk) {
                Ok(n) => wrote += n as u64,
                Err(e) => {
                    errno = errno_of(e);
                    break;
                }
            }
        }
        if errno == 0
            && let Err(e) = out.sync_all()
        {
            errno = errno_of(e);
        }
    }
    println!(
        "quota-vm-writer: wrote={wrote} errno={errno} capeff={cap_eff} attrerrno={attr_errno} ms={}",
        started.elapsed().as_millis()
    );
}

/// A pod that keeps escaping, for `millis`: in `dir`, makes a new file, moves it to project 0
/// and writes it (up to [`ESCAPER_FILE`] bytes) until refused, then the next; when it can make
/// no new file, moves its existing ones out again and appends to them. Its bytes written, its
/// successful moves out, and the last errno it met.
fn escape_again_and_again(dir: &Path, millis: u64) -> (u64, u64, i32) {
    use std::io::Write;
    let started = std::time::Instant::now();
    let until = started + std::time::Duration::from_millis(millis);
    // At the pace of a pod's writer (the VM's filesystem is 128 MiB: a writer at full speed
    // fills it before any check could matter).
    let paced = |bytes: u64| {
        let due = std::time::Duration::from_secs_f64(bytes as f64 / ESCAPER_RATE as f64);
        if let Some(ahead) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(ahead);
        }
    };
    let chunk = vec![0x5au8; 64 << 10];
    let (mut bytes, mut escapes, mut last, mut made) = (0u64, 0u64, 0i32, 0u64);
    let errno_of = |e: std::io::Error| e.raw_os_error().unwrap_or(-1);
    while std::time::Instant::now() < until {
        let fresh = dir.join(format!("e{made}"));
        let lever = match std::fs::File::create_new(&fresh) {
            Ok(_) => {
                made += 1;
                Some(fresh)
            }
            Err(e) => {
                last = errno_of(e);
                // No new file: the old ones, moved out again where the kernel lets it.
                (0..made)
                    .map(|n| dir.join(format!("e{n}")))
                    .find(|old| change_attr(old, "project=0") == 0)
            }
        };
        let Some(lever) = lever else {
            std::thread::sleep(std::time::Duration::from_millis(50));
            continue;
        };
        if change_attr(&lever, "project=0") != 0 {
            continue;
        }
        escapes += 1;
        let Ok(mut out) = std::fs::OpenOptions::new().append(true).open(&lever) else {
            continue;
        };
        let mut written = 0;
        while written < ESCAPER_FILE && std::time::Instant::now() < until {
            paced(bytes + written);
            match out.write(&chunk) {
                Ok(n) => written += n as u64,
                Err(e) => {
                    last = errno_of(e);
                    break;
                }
            }
        }
        bytes += written;
    }
    (bytes, escapes, last)
}

/// A pod flooding its volume with what the quota check cannot move, for `millis`: moves the
/// directory `dir` (made if missing) to project 0, makes a batch of symlinks and FIFOs in it,
/// and again. `hidden`: it moves the directory back into its project after each (smaller)
/// batch and waits there, so a walk rarely finds the directory out. The entries it made, its
/// successful moves, and the last errno it met.
fn flood(dir: &Path, millis: u64, hidden: bool) -> (u64, u64, i32) {
    let started = std::time::Instant::now();
    let until = started + std::time::Duration::from_millis(millis);
    let _ = std::fs::create_dir(dir);
    // Its project, to move it back to (none if the pod could not make it: then nothing more
    // is made either, which is what a fenced pod's flood is run to show).
    let home = std::fs::File::open(dir).ok().map_or(0, |file| {
        use std::os::fd::AsFd;
        csi_nodekit::linux::quota::sys::get_fsxattr(file.as_fd()).map_or(0, |a| a.projid)
    });
    let batch = if hidden { HIDDEN_BATCH } else { FLOOD_BATCH };
    let (mut made, mut moves, mut last) = (0u64, 0u64, 0i32);
    let move_out = |moves: &mut u64, last: &mut i32| match change_attr(dir, "project=0") {
        0 => *moves += 1,
        errno => *last = errno,
    };
    while std::time::Instant::now() < until {
        if !hidden {
            move_out(&mut moves, &mut last);
        }
        let due = std::time::Duration::from_secs_f64(made as f64 / FLOOD_RATE as f64);
        if let Some(ahead) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(ahead);
        }
        if hidden {
            move_out(&mut moves, &mut last);
        }
        let mut refused = false;
        for _ in 0..batch {
            // Named by this run too: a second flood in the same directory meets no old name.
            let name = dir.join(format!("n{made}-{}", std::process::id()));
            let result = match made % 2 {
                0 => std::os::unix::fs::symlink("/nowhere", &name).map_err(|e| e.raw_os_error()),
                _ => nix::unistd::mkfifo(&name, nix::sys::stat::Mode::S_IRUSR)
                    .map_err(|e| Some(e as i32)),
            };
            match result {
                Ok(()) => made += 1,
                Err(errno) => {
                    last = errno.unwrap_or(-1);
                    refused = true;
                    break;
                }
            }
        }
        if hidden {
            change_attr(dir, &format!("project={home}"));
        }
        if refused {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    (made, moves, last)
}

/// Entries the flood makes between two moves of its directory.
const FLOOD_BATCH: u64 = 500;

/// Entries the hidden flood makes while its directory is out.
const HIDDEN_BATCH: u64 = 50;

/// Runs the flood of [`flood`] in `dir` as uid 1000 for `millis`; `bytes` counts entries made.
pub fn keep_flooding(dir: &Path, millis: u64) -> Written {
    let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
    cmd.uid(POD_UID).gid(POD_UID);
    writer_result(writer_command(cmd, "flood", dir, millis))
}

/// The flood of [`flood`] moving its directory back after each batch, as uid 1000.
pub fn keep_flooding_hidden(dir: &Path, millis: u64) -> Written {
    let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
    cmd.uid(POD_UID).gid(POD_UID);
    writer_result(writer_command(cmd, "hidden-flood", dir, millis))
}

/// How much the escaper writes into one file before it takes the next.
pub const ESCAPER_FILE: u64 = 4 << 20;

/// The escaper's pace, bytes a second.
pub const ESCAPER_RATE: u64 = 2 << 20;

/// The flood's pace, entries a second.
pub const FLOOD_RATE: u64 = 1_000;

/// Runs the escaper of [`escape_again_and_again`] in `dir` as uid 1000 for `millis`.
pub fn keep_escaping(dir: &Path, millis: u64) -> Written {
    let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
    cmd.uid(POD_UID).gid(POD_UID);
    writer_result(writer_command(cmd, "escaper", dir, millis))
}

/// `du`-style accounting of a tree: the sum of st_blocks (512-byte units) and the number of
/// inodes, the directory itself included, not following symlinks.
pub fn du(dir: &Path) -> (u64, u64) {
    let meta = std::fs::symlink_metadata(dir).expect("stat");
    let (mut bytes, mut inodes) = (meta.blocks() * 512, 1);
    if meta.is_dir() {
        for entry in std::fs::read_dir(dir).expect("read dir") {
            let (b, i) = du(&entry.expect("entry").path());
            bytes += b;
            inodes += i;
        }
    }
    (bytes, inodes)
}
