//! A pod that attacks its image volume's size, through the real binary on this machine's
//! kernel (no project quotas needed): every attack the quota suite knows, as an unprivileged
//! user without capabilities, each stopped by the volume's own filesystem. The volume's file
//! never holds a byte more than its size, the state directory's filesystem loses nothing to
//! it, and the filesystem checks clean afterwards.

use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::image::{e2fsck, spawn};
use super::image_copies::attached;
use crate::common::csi_block::*;
use crate::common::csi_node::*;
use crate::common::scratch_fs::Kind;

/// A pod's user: no capabilities once its IDs are not root's.
const POD_UID: u32 = 1000;

/// Runs `attack` on a thread of its own as the pod's user (this thread's IDs only: the raw
/// system calls, not libc's, which would change every thread's).
fn as_pod<T: Send + 'static>(attack: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: plain system calls changing this thread's credentials.
        unsafe {
            assert_eq!(
                libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<u32>()),
                0
            );
            assert_eq!(
                libc::syscall(libc::SYS_setresgid, POD_UID, POD_UID, POD_UID),
                0
            );
            assert_eq!(
                libc::syscall(libc::SYS_setresuid, POD_UID, POD_UID, POD_UID),
                0
            );
        }
        attack()
    })
    .join()
    .expect("the attack's thread")
}

/// What an attack got: how far it went (bytes or entries) and the errno that stopped it.
#[derive(Debug)]
struct Outcome {
    went: u64,
    errno: i32,
}

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// Writes 1 MiB chunks until refused; with `direct`, through `O_DIRECT` from an aligned buffer.
fn write_until_refused(file: PathBuf, direct: bool) -> Outcome {
    let flags = if direct { libc::O_DIRECT } else { 0 };
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .custom_flags(flags)
        .open(file)
        .expect("open as the pod");
    let layout = std::alloc::Layout::from_size_align(1 << 20, 4096).unwrap();
    // SAFETY: a zeroed allocation of the layout's size, freed below.
    let buffer = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!buffer.is_null());
    // SAFETY: the allocation above, initialised, 1 MiB long, alive until the dealloc.
    let chunk = unsafe { std::slice::from_raw_parts(buffer, 1 << 20) };
    let mut went = 0;
    let errno = loop {
        match out.write(chunk) {
            Ok(n) => went += n as u64,
            Err(e) => break errno_of(&e),
        }
        assert!(went <= 1 << 30, "a GiB written into a 16 MiB volume");
    };
    // SAFETY: allocated above with this layout; `chunk` is not used after this.
    unsafe { std::alloc::dealloc(buffer, layout) };
    Outcome { went, errno }
}

fn attacks(dir: PathBuf) -> Vec<(&'static str, Outcome)> {
    let mut outcomes = Vec::new();
    let clean = |dir: &Path| {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let _ = std::fs::remove_file(&path).or_else(|_| std::fs::remove_dir_all(&path));
        }
    };
    let d = dir.clone();
    outcomes.push((
        "buffered writes",
        as_pod(move || write_until_refused(d.join("w"), false)),
    ));
    clean(&dir);
    let d = dir.clone();
    outcomes.push((
        "O_DIRECT writes",
        as_pod(move || write_until_refused(d.join("d"), true)),
    ));
    clean(&dir);
    let d = dir.clone();
    outcomes.push((
        "fallocate of 1 GiB",
        as_pod(move || {
            let file = File::create(d.join("f")).unwrap();
            match nix::fcntl::fallocate(&file, nix::fcntl::FallocateFlags::empty(), 0, 1 << 30) {
                Ok(()) => Outcome {
                    went: 1 << 30,
                    errno: 0,
                },
                Err(e) => Outcome {
                    went: file.metadata().unwrap().blocks() * 512,
                    errno: e as i32,
                },
            }
        }),
    ));
    clean(&dir);
    let d = dir.clone();
    outcomes.push((
        "sparse writes 1 MiB apart up to 1 TiB",
        as_pod(move || {
            let file = File::create(d.join("s")).unwrap();
            let mut went = 0;
            let mut at = 0u64;
            let errno = loop {
                match nix::sys::uio::pwrite(&file, &[5u8; 4096], at as i64) {
                    Ok(n) => went += n as u64,
                    Err(e) => break e as i32,
                }
                at += 1 << 20;
                if at >= 1 << 40 {
                    break 0;
                }
            };
            Outcome { went, errno }
        }),
    ));
    clean(&dir);
    let d = dir.clone();
    outcomes.push((
        "empty files",
        as_pod(move || {
            let mut went = 0;
            let errno = loop {
                match File::create(d.join(format!("e{went}"))) {
                    Ok(_) => went += 1,
                    Err(e) => break errno_of(&e),
                }
            };
            Outcome { went, errno }
        }),
    ));
    clean(&dir);
    let d = dir.clone();
    outcomes.push((
        "4,000-byte xattrs on new files",
        as_pod(move || {
            let value = vec![b'x'; 4000];
            let name = CString::new("user.fill").unwrap();
            let mut went = 0;
            let errno = loop {
                let file = match File::create(d.join(format!("x{went}"))) {
                    Ok(file) => file,
                    Err(e) => break errno_of(&e),
                };
                // SAFETY: a valid descriptor, name and buffer.
                let set = unsafe {
                    libc::fsetxattr(
                        file.as_raw_fd(),
                        name.as_ptr(),
                        value.as_ptr().cast(),
                        value.len(),
                        0,
                    )
                };
                if set != 0 {
                    break errno_of(&std::io::Error::last_os_error());
                }
                went += value.len() as u64;
            };
            Outcome { went, errno }
        }),
    ));
    clean(&dir);
    let d = dir.clone();
    outcomes.push((
        "hard links of one file, then writes",
        as_pod(move || {
            std::fs::write(d.join("h"), [1u8; 4096]).unwrap();
            let mut links = 0;
            while links < 20_000
                && std::fs::hard_link(d.join("h"), d.join(format!("l{links}"))).is_ok()
            {
                links += 1;
            }
            let mut out = write_until_refused(d.join("after-links"), false);
            out.went += links;
            out
        }),
    ));
    clean(&dir);
    let d = dir.clone();
    outcomes.push((
        "a project ID of 0 and PROJINHERIT cleared, then writes",
        as_pod(move || {
            // What escapes a directory volume's project quota; here there is no quota to
            // escape, the filesystem ends where the file does. The pod's own directory.
            let own = d.join("escape");
            std::fs::create_dir(&own).expect("the pod's directory");
            let changed = std::process::Command::new("chattr")
                .args(["-p", "0", "-P"])
                .arg(&own)
                .stderr(std::process::Stdio::null())
                .status();
            let _ = changed;
            write_until_refused(own.join("p"), false)
        }),
    ));
    outcomes
}

#[ignore = "needs root: real loop devices, ext4 and bind mounts in a private mount namespace, and a thread as another user (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_attacking_its_image_volumes_size_every_known_way_never_passes_it() {
    let node = BlockNode::new(Kind::Ext4);
    let (state, sandbox) = (node.state.clone(), &node.sandbox);
    let (child, mut csi) = spawn(sandbox.path(), &state).await;
    let size = 16 * MIB;
    let (id, target) = attached(&mut csi, sandbox, "pvc-hostile").await;
    let staging = sandbox.dir("pvc-hostile-staging");
    let file = image(&state, &id);
    let held = |file: &Path| {
        let meta = std::fs::metadata(file).unwrap();
        (meta.len(), meta.blocks() * 512)
    };
    let before = held(&file);
    let free_before = nix::sys::statvfs::statvfs(&state).unwrap().blocks_free();

    let outcomes = attacks(target.clone());
    for (attack, outcome) in &outcomes {
        eprintln!("image volume of 16 MiB, a pod's {attack}: {outcome:?}");
        assert!(
            outcome.went > 0,
            "{attack}: the attack did something: {outcome:?}"
        );
        // Sparse writes may reach 1 TiB's offset before the blocks they touch fill it.
        let stopped =
            outcome.errno == libc::ENOSPC || (attack.starts_with("sparse") && outcome.errno == 0);
        assert!(stopped, "{attack}: stopped by ENOSPC: {outcome:?}");
    }
    let (bytes, inodes) = {
        let fs = nix::sys::statvfs::statvfs(&target).unwrap();
        (fs.blocks() * fs.fragment_size(), fs.files())
    };
    assert!(
        bytes <= size && inodes == 8192,
        "{bytes} bytes, {inodes} inodes"
    );
    assert_eq!(
        held(&file),
        before,
        "the volume's file: its size and blocks unchanged"
    );
    let free_after = nix::sys::statvfs::statvfs(&state).unwrap().blocks_free();
    assert!(
        free_after + 64 >= free_before,
        "the state filesystem lost {} blocks",
        free_before - free_after
    );
    let deleting = csi.controller.delete_volume(delete_request(&id)).await;
    assert_eq!(
        code(deleting),
        tonic::Code::FailedPrecondition,
        "in use: never deleted"
    );
    csi.unpublish_and_unstage(&id, &target, &staging).await;
    let summary = e2fsck(&file);
    eprintln!("after {} attacks: e2fsck {summary}", outcomes.len());
    csi.controller
        .delete_volume(delete_request(&id))
        .await
        .expect("delete");
    drop(child);
}
