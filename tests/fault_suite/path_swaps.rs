//! A neighbour who swaps a directory on the way to a staging path or a target for a symlink
//! (`renameat2(RENAME_EXCHANGE)`, over and over) while the real binary stages, publishes,
//! unpublishes and unstages through it. A symlink left in place is refused every time (see
//! `own_paths`); here only the race is tried. Every mount must land on the directory the path
//! named when the call checked it, never where the symlink points, and an unpublish or
//! unstage that answers OK must leave nothing mounted.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use csi_nodekit::linux::mountinfo::MountTable;
use csi_nodekit::proto::csi::node_client::NodeClient;
use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
use tonic::transport::Channel;

use super::tally::{Outcome, Tally};
use crate::common::csi_block::{BlockNode, block_create, block_publish, block_stage};
use crate::common::csi_node::*;
use crate::common::scratch_fs::Kind;
use crate::common::{KillOnDrop, spawn_node_server};

/// Calls per case: each is one stage or publish and its undo, both raced.
const ROUNDS: usize = 2_000;
/// Tries of one call before the round counts as failed: a swapped path is refused (the
/// kubelet tries again), so a call succeeds once it runs between two swaps.
const TRIES: usize = 500;

/// `<open>/pods` (a real directory) and `<open>/swap` (a symlink to `<outside>`), exchanged
/// by a thread in bursts of up to 2 ms between quiet spells of up to 2 ms; `<open>` is writable by everyone, like a directory a pod or a
/// local user shares, so the link in it is one root did not place.
struct Swapped {
    open: PathBuf,
    outside: PathBuf,
    stop: Arc<AtomicBool>,
    /// Set while a check reads the mount table: the thread stops swapping until it is unset.
    pause: Arc<AtomicBool>,
    /// Held by the swapping thread for each exchange, and by a check while it reads the mount
    /// table (whose paths would change under it otherwise).
    still: Arc<Mutex<()>>,
    swaps: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Swapped {
    fn new(sandbox: &MountSandbox, case: &str, leaf_is_file: bool) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let open = sandbox.dir(&format!("{case}/open"));
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        std::fs::create_dir(open.join("pods")).unwrap();
        let outside = sandbox.dir(&format!("{case}/outside"));
        // Somewhere a mount could land if a call followed the link.
        for leaf in ["mount", "globalmount"] {
            std::fs::create_dir(outside.join(leaf)).unwrap();
        }
        if leaf_is_file {
            std::fs::write(outside.join("dev"), b"").unwrap();
        }
        std::os::unix::fs::symlink(&outside, open.join("swap")).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let pause = Arc::new(AtomicBool::new(false));
        let still = Arc::new(Mutex::new(()));
        let swaps = Arc::new(AtomicU64::new(0));
        let thread = {
            let (a, b) = (open.join("pods"), open.join("swap"));
            let (stop, pause) = (stop.clone(), pause.clone());
            let (still, swaps) = (still.clone(), swaps.clone());
            std::thread::spawn(move || {
                let mut rng = 0x9E37_79B9_7F4A_7C15_u64;
                let mut micros = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    Duration::from_micros(rng % 2_000)
                };
                let swap = || {
                    let _still = still.lock().unwrap();
                    renameat2(AT_FDCWD, &a, AT_FDCWD, &b, RenameFlags::RENAME_EXCHANGE)
                        .expect("exchange");
                    swaps.fetch_add(1, Ordering::Relaxed);
                };
                while !stop.load(Ordering::Relaxed) {
                    // Quiet (the real directory in its place), then a burst of swaps: calls
                    // begun in the quiet meet the burst mid-way.
                    std::thread::sleep(micros());
                    let until = Instant::now() + micros();
                    let mut odd = false;
                    while Instant::now() < until && !pause.load(Ordering::Relaxed) {
                        swap();
                        odd = !odd;
                    }
                    if odd {
                        swap();
                    }
                    while pause.load(Ordering::Relaxed) {
                        std::thread::yield_now();
                    }
                }
            })
        };
        Self {
            open,
            outside,
            stop,
            pause,
            still,
            swaps,
            thread: Some(thread),
        }
    }

    /// The path a call is given: `<open>/pods/<leaf>`.
    fn requested(&self, leaf: &str) -> PathBuf {
        self.open.join("pods").join(leaf)
    }

    /// Mounts under `<open>`: on the real directory's `leaf`, under whichever name it has
    /// right now (stacked ones counted each).
    fn mounts_at(&self, table: &MountTable) -> usize {
        table.mounts_under(&self.open).count()
    }

    /// Mount points under `<outside>`: each one an escape. They are taken down again, so
    /// that one escape is counted once.
    fn escapes(&self, table: &MountTable) -> Vec<PathBuf> {
        let found: Vec<PathBuf> = (table.mounts_under(&self.outside))
            .map(|e| e.mount_point.clone())
            .collect();
        for point in &found {
            let _ = nix::mount::umount2(point, nix::mount::MntFlags::MNT_DETACH);
        }
        found
    }

    /// Reads the mount table with the swaps paused (its paths would change under it
    /// otherwise) and gives it to `look`.
    fn still<R>(&self, look: impl FnOnce(&MountTable) -> R) -> R {
        self.pause.store(true, Ordering::Relaxed);
        let still = self.still.lock().unwrap();
        let seen = look(&MountTable::read().expect("read mount table"));
        drop(still);
        self.pause.store(false, Ordering::Relaxed);
        seen
    }

    fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
        self.swaps.load(Ordering::Relaxed)
    }
}

/// One raced call, tried until it answers OK: how many tries were refused, `None` if it never
/// answered OK.
async fn until_ok<F, Fut, T>(mut call: F) -> Option<usize>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    for refused in 0..TRIES {
        if call().await.is_ok() {
            return Some(refused);
        }
    }
    None
}

/// One case's rounds: the swapping neighbour, the tally, and the tries refused while swapped.
struct Race {
    swapped: Swapped,
    tally: Tally,
    refused: usize,
}

impl Race {
    fn new(swapped: Swapped, case: &'static str) -> Self {
        Self {
            swapped,
            tally: Tally::new(case),
            refused: 0,
        }
    }

    /// Makes the call `what` until it answers OK, then checks: no mount under `<outside>`, and
    /// `expected` mounts on the real directory's leaf.
    async fn step<F, Fut, T>(&mut self, what: &str, expected: usize, call: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let Some(refused) = until_ok(call).await else {
            self.refused += TRIES;
            self.tally
                .record(Outcome::Failed, format!("{what} never answered OK"));
            return;
        };
        self.refused += refused;
        let (escapes, found) = self
            .swapped
            .still(|table| (self.swapped.escapes(table), self.swapped.mounts_at(table)));
        let (outcome, how) = match () {
            _ if !escapes.is_empty() => (Outcome::Lost, format!("mounted outside at {escapes:?}")),
            _ if found != expected => (
                Outcome::Failed,
                format!("answered OK with {found} mounts at the path, not {expected}"),
            ),
            _ => (Outcome::Survived, String::new()),
        };
        self.tally.record(outcome, format!("{what}: {how}"));
    }

    fn finish(self) {
        let Self {
            swapped,
            mut tally,
            refused,
        } = self;
        let swaps = swapped.stop();
        tally.note(format!(
            "{swaps} swaps, {refused} tries refused while swapped"
        ));
        tally.finish();
    }
}

/// A call on a client of its own (a clone shares the connection), so that it can be made
/// again and again.
fn own_client(csi: &Csi) -> NodeClient<Channel> {
    csi.node.clone()
}

async fn served(state: &Path, sandbox: &MountSandbox) -> (KillOnDrop, Csi) {
    let socket = sandbox.path().join("csi.sock");
    let process = spawn_node_server(&socket, state, &[]);
    assert!(super::processes::probe_ready(&socket).await, "node-server");
    (process, connect(&socket).await)
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_swapped_in_mid_stage_or_unstage_never_moves_the_staging_mount_elsewhere() {
    let sandbox = MountSandbox::new();
    let (_process, mut csi) = served(&sandbox.path().join("state"), &sandbox).await;
    let id = create(&mut csi, "pvc-swap-stage", 1 << 20).await;
    let swapped = Swapped::new(&sandbox, "stage", false);
    let staging = swapped.requested("globalmount");
    let mut race = Race::new(
        swapped,
        "a parent of the staging path swapped for a symlink mid-call",
    );
    stages_and_unstages(&mut race, &csi, &id, &staging, ROUNDS).await;
    race.finish();
}

/// `rounds` stages of the volume at `staging`, each followed by its unstage, both raced.
async fn stages_and_unstages(race: &mut Race, csi: &Csi, id: &str, staging: &Path, rounds: usize) {
    for _ in 0..rounds {
        let stage = || {
            let (mut n, request) = (own_client(csi), stage_request(id, staging));
            async move { n.node_stage_volume(request).await }
        };
        race.step("stage", 1, stage).await;
        let unstage = || {
            let (mut n, request) = (own_client(csi), unstage_request(id, staging));
            async move { n.node_unstage_volume(request).await }
        };
        race.step("unstage", 0, unstage).await;
    }
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_swapped_in_mid_publish_or_unpublish_never_moves_the_target_mount_elsewhere() {
    let sandbox = MountSandbox::new();
    let (_process, mut csi) = served(&sandbox.path().join("state"), &sandbox).await;
    let id = create(&mut csi, "pvc-swap-publish", 1 << 20).await;
    let staging = sandbox.dir("plugins/globalmount");
    (csi.node
        .node_stage_volume(stage_request(&id, &staging))
        .await)
        .expect("stage");
    let swapped = Swapped::new(&sandbox, "publish", false);
    let target = swapped.requested("mount");
    let mut race = Race::new(
        swapped,
        "a parent of the target path swapped for a symlink mid-call",
    );
    for _ in 0..ROUNDS {
        let publish = || {
            let (mut n, request) = (
                own_client(&csi),
                publish_request(&id, &staging, &target, false),
            );
            async move { n.node_publish_volume(request).await }
        };
        race.step("publish", 1, publish).await;
        let unpublish = || {
            let (mut n, request) = (own_client(&csi), unpublish_request(&id, &target));
            async move { n.node_unpublish_volume(request).await }
        };
        race.step("unpublish", 0, unpublish).await;
    }
    race.finish();
}

#[ignore = "needs root: loop devices and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_swapped_in_mid_block_publish_or_unpublish_never_moves_the_device_elsewhere() {
    let node = BlockNode::new(Kind::Ext4);
    let (_process, mut csi) = served(&node.state, &node.sandbox).await;
    let volume = (csi
        .controller
        .create_volume(block_create("pvc-swap-block", 1 << 20))
        .await)
        .expect("create")
        .into_inner()
        .volume
        .expect("volume");
    let id = volume.volume_id;
    let staging = node.sandbox.dir("plugins/globalmount");
    (csi.node.node_stage_volume(block_stage(&id, &staging)).await).expect("stage");
    let swapped = Swapped::new(&node.sandbox, "block", true);
    let target = swapped.requested("dev");
    let mut race = Race::new(
        swapped,
        "a parent of a block target swapped for a symlink mid-call",
    );
    for _ in 0..ROUNDS / 2 {
        let publish = || {
            let (mut n, request) = (
                own_client(&csi),
                block_publish(&id, &staging, &target, false),
            );
            async move { n.node_publish_volume(request).await }
        };
        race.step("publish", 1, publish).await;
        let unpublish = || {
            let (mut n, request) = (own_client(&csi), unpublish_request(&id, &target));
            async move { n.node_unpublish_volume(request).await }
        };
        race.step("unpublish", 0, unpublish).await;
    }
    // `mount`, `globalmount` and `dev` were there from the start.
    let made_outside = std::fs::read_dir(&race.swapped.outside).unwrap().count() - 3;
    (race.tally).check(
        made_outside == 0,
        format!("{made_outside} files made outside"),
    );
    race.finish();
}

/// An image volume's stage attaches its loop device and mounts its ext4 (`fsmount`, then
/// `move_mount` onto the staging path's descriptor); its unstage unmounts and detaches.
#[ignore = "needs root: real loop devices, ext4 and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_swapped_in_mid_image_stage_or_unstage_never_moves_its_filesystem_elsewhere() {
    let sandbox = MountSandbox::new();
    let state = sandbox.path().join("state");
    let (_process, mut csi) = served(&state, &sandbox).await;
    let _devices = crate::common::csi_block::DetachOnDrop(state.clone());
    let request = super::image_volumes::image_request("pvc-swap-image");
    let id = create_with(&mut csi, request).await;
    let swapped = Swapped::new(&sandbox, "image", false);
    let staging = swapped.requested("globalmount");
    let mut race = Race::new(
        swapped,
        "a parent of an image volume's staging path swapped for a symlink mid-call",
    );
    stages_and_unstages(&mut race, &csi, &id, &staging, ROUNDS / 4).await;
    let attached = crate::common::csi_block::attached_under(&state);
    (race.tally).check(
        attached == 0,
        format!("{attached} loop devices left attached"),
    );
    race.finish();
}
