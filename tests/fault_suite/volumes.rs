//! node-server's volumes under storms and careless requests, through the real binary on real
//! bind mounts: nothing acknowledged is lost, mounts never stack, a mounted volume is never
//! deleted, and a network-namespace mount or odd path on the node breaks nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::image_volumes::{image_request, read_in_image};
use super::tally::{Outcome, Tally};
use crate::common::csi_block::image;
use crate::common::csi_node::*;
use crate::common::{KillOnDrop, spawn_node_server};
use csi_nodekit::linux::mountinfo::MountTable;
use tonic::Code;

/// The real node-server in a mount sandbox, and a client.
async fn served(sandbox: &MountSandbox) -> (KillOnDrop, Csi) {
    let socket = sandbox.path().join("csi.sock");
    let process = spawn_node_server(&socket, &sandbox.path().join("state"), &[]);
    assert!(super::processes::probe_ready(&socket).await, "node-server");
    (process, connect(&socket).await)
}

/// A deterministic pseudo-random sequence (xorshift), so a failing storm can be replayed.
struct Dice(u64);

impl Dice {
    fn roll(&mut self, sides: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % sides as u64) as usize
    }
}

/// Mount points under `root` that appear more than once in the mount table (stacked mounts).
fn stacked(root: &Path) -> Vec<PathBuf> {
    let table = MountTable::read().expect("read mount table");
    let mut seen = BTreeMap::<PathBuf, usize>::new();
    for entry in table.mounts_under(root) {
        *seen.entry(entry.mount_point.clone()).or_default() += 1;
    }
    seen.into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(p, _)| p)
        .collect()
}

fn content(id: &str) -> Vec<u8> {
    format!("data of {id}\n").repeat(1000).into_bytes()
}

const VOLUMES: usize = 6;
const WORKERS: u64 = 8;
const OPS: usize = 40;
const ROUNDS_AT_MOST: u64 = 5;

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storms_of_publish_unpublish_and_delete_lose_no_data_and_stack_no_mounts() {
    storm(Layout::Directory).await;
}

#[ignore = "needs root: real loop devices, ext4 and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storms_on_image_volumes_lose_no_file_stack_no_mount_and_leave_no_device() {
    storm(Layout::Image).await;
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Layout {
    Directory,
    Image,
}

/// Eight workers each make forty random calls on six volumes of `layout`, each published
/// with a file; then every volume not deleted still holds its file.
async fn storm(layout: Layout) {
    let sandbox = MountSandbox::new();
    let (_process, mut csi) = served(&sandbox).await;
    let state = sandbox.path().join("state");
    let _devices = crate::common::csi_block::DetachOnDrop(state.clone());
    let mut ids = Vec::new();
    for n in 0..VOLUMES {
        let name = format!("pvc-storm-{n}");
        let id = match layout {
            Layout::Directory => create(&mut csi, &name, 1 << 20).await,
            Layout::Image => create_with(&mut csi, image_request(&name)).await,
        };
        let (staging, target) = (
            sandbox.dir(&format!("s{n}")),
            sandbox.path().join(format!("t{n}a")),
        );
        csi.stage_and_publish(&id, &staging, &target, false).await;
        std::fs::write(target.join("data"), content(&id)).unwrap();
        ids.push(id);
    }
    let mut tally = Tally::new(match layout {
        Layout::Directory => "publish/unpublish/unstage/delete storm, 8 workers x 40 calls a round",
        Layout::Image => "the same storm on image volumes",
    });
    let mut deleted = [false; VOLUMES];
    let mut done = BTreeMap::<&str, usize>::new();
    // A storm where some kind of call never got through would test nothing of it: another
    // round follows (an image is deleted only once both targets are unpublished and it is
    // unstaged, which forty calls of eight workers do not always reach).
    let kinds = ["stage", "publish", "unpublish", "unstage", "delete"];
    for round in 0..ROUNDS_AT_MOST {
        let workers = (0..WORKERS).map(|worker| {
            let (mut csi, ids, root) = (csi.clone(), ids.clone(), sandbox.path().to_owned());
            tokio::spawn(async move {
                let mut dice = Dice(0x9e37_79b9_7f4a_7c15 ^ (worker + 1) ^ (round << 32));
                let mut answers = Vec::new();
                for _ in 0..OPS {
                    let n = dice.roll(VOLUMES);
                    let id = &ids[n];
                    let staging = root.join(format!("s{n}"));
                    let target = root.join(format!("t{n}{}", ["a", "b"][dice.roll(2)]));
                    let (call, result) = match dice.roll(5) {
                        0 => (
                            "stage",
                            csi.node
                                .node_stage_volume(stage_request(id, &staging))
                                .await
                                .map(drop),
                        ),
                        1 => (
                            "publish",
                            csi.node
                                .node_publish_volume(publish_request(id, &staging, &target, false))
                                .await
                                .map(drop),
                        ),
                        2 => (
                            "unpublish",
                            csi.node
                                .node_unpublish_volume(unpublish_request(id, &target))
                                .await
                                .map(drop),
                        ),
                        3 => (
                            "unstage",
                            csi.node
                                .node_unstage_volume(unstage_request(id, &staging))
                                .await
                                .map(drop),
                        ),
                        _ => (
                            "delete",
                            csi.controller
                                .delete_volume(delete_request(id))
                                .await
                                .map(drop),
                        ),
                    };
                    answers.push((
                        n,
                        call,
                        result.map_err(|s| (s.code(), s.message().to_owned())),
                    ));
                }
                answers
            })
        });
        for worker in workers.collect::<Vec<_>>() {
            for (n, call, answer) in worker.await.expect("worker") {
                // What a CO may be told: done, busy (retry), in use, or gone after a delete.
                let fine = match &answer {
                    Ok(()) => true,
                    Err((Code::Aborted | Code::FailedPrecondition | Code::NotFound, _)) => true,
                    Err(_) => false,
                };
                if answer.is_ok() {
                    *done.entry(call).or_default() += 1;
                    deleted[n] |= call == "delete";
                }
                tally.check(fine, format_args!("{call} of volume {n}: {answer:?}"));
            }
        }
        if kinds.iter().all(|k| done.contains_key(k)) {
            break;
        }
    }
    // Mounts stacked by the storm show while it left them.
    let stacked = stacked(sandbox.path());
    for (n, id) in ids.iter().enumerate() {
        let data = match layout {
            Layout::Directory => std::fs::read(state.join("volumes").join(id).join("data")).ok(),
            Layout::Image => {
                let unmounted = unmount_after_storm(&mut csi, sandbox.path(), n, id).await;
                tally.check(unmounted.is_ok(), format_args!("volume {n}: {unmounted:?}"));
                let data = read_in_image(&state, id, "data");
                let (code, text) = crate::common::scratch_fs::fsck(&image(&state, id));
                let clean = deleted[n] || code == 0;
                tally.check(
                    clean,
                    format_args!("volume {n}: e2fsck -fn exit {code}: {text}"),
                );
                data
            }
        };
        let outcome = match (deleted[n], data) {
            (true, None) => Outcome::Survived,
            (_, Some(data)) if data == content(id) => Outcome::Survived,
            _ => Outcome::Lost,
        };
        tally.record(
            outcome,
            format_args!("volume {n} (deleted: {})", deleted[n]),
        );
    }
    let idle: Vec<_> = kinds.iter().filter(|k| !done.contains_key(*k)).collect();
    tally.check(
        idle.is_empty(),
        format_args!("calls that never succeeded: {idle:?}"),
    );
    let gone = deleted.iter().filter(|d| **d).count();
    tally.note(format_args!(
        "answered OK: {done:?}; {gone} of {VOLUMES} volumes deleted"
    ));
    tally.check(
        stacked.is_empty(),
        format_args!("stacked mounts: {stacked:?}"),
    );
    if layout == Layout::Image {
        let attached = crate::common::csi_block::attached_under(&state);
        tally.check(
            attached == 0,
            format_args!("{attached} loop devices left on volumes' files"),
        );
    }
    tally.finish();
}

/// Unpublishes both targets of volume `n` and unstages it, so that its image can be read from
/// outside; a volume deleted in the storm answers NOT_FOUND.
async fn unmount_after_storm(
    csi: &mut Csi,
    root: &Path,
    n: usize,
    id: &str,
) -> Result<(), tonic::Status> {
    let gone = |s: tonic::Status| match s.code() {
        Code::NotFound => Ok(()),
        _ => Err(s),
    };
    for side in ["a", "b"] {
        let target = root.join(format!("t{n}{side}"));
        let unpublished = csi
            .node
            .node_unpublish_volume(unpublish_request(id, &target));
        unpublished.await.map(drop).or_else(gone)?;
    }
    let unstaged = csi
        .node
        .node_unstage_volume(unstage_request(id, &root.join(format!("s{n}"))));
    unstaged.await.map(drop).or_else(gone)
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mounted_volume_is_never_deleted_and_keeps_its_data() {
    let sandbox = MountSandbox::new();
    let (_process, mut csi) = served(&sandbox).await;
    let mut tally = Tally::new("DeleteVolume of a staged, published or mount-holding volume");
    for attempt in 0..3 {
        for how in ["staged", "published", "holding a mount"] {
            let id = create(&mut csi, &format!("pvc-keep-{attempt}-{how}"), 1 << 20).await;
            let dir = sandbox.path().join("state/volumes").join(&id);
            std::fs::write(dir.join("data"), content(&id)).unwrap();
            let staging = sandbox.dir(&format!("keep-s-{attempt}-{how}"));
            let target = sandbox.path().join(format!("keep-t-{attempt}-{how}"));
            let elsewhere = sandbox.dir(&format!("elsewhere-{attempt}"));
            match how {
                "staged" => {
                    csi.node
                        .node_stage_volume(stage_request(&id, &staging))
                        .await
                        .unwrap();
                }
                "published" => csi.stage_and_publish(&id, &staging, &target, false).await,
                _ => {
                    let point = dir.join("inner");
                    std::fs::create_dir(&point).unwrap();
                    nix::mount::mount(
                        Some(&elsewhere),
                        &point,
                        None::<&str>,
                        nix::mount::MsFlags::MS_BIND,
                        None::<&str>,
                    )
                    .unwrap();
                }
            }
            let answer = csi.controller.delete_volume(delete_request(&id)).await;
            let kept = std::fs::read(dir.join("data")).is_ok_and(|d| d == content(&id));
            let outcome = match (&answer, kept) {
                (_, false) => Outcome::Lost,
                (Err(s), true) if s.code() == Code::FailedPrecondition => Outcome::Survived,
                _ => Outcome::Failed,
            };
            tally.record(outcome, format_args!("{how}, try {attempt}: {answer:?}"));
        }
    }
    tally.finish();
}

/// Bind-mounts the network namespace on `file`, as CNI does under `/run/netns`.
fn bind_netns(file: &Path) {
    std::fs::write(file, b"").unwrap();
    let flags = nix::mount::MsFlags::MS_BIND;
    nix::mount::mount(
        Some("/proc/self/ns/net"),
        file,
        None::<&str>,
        flags,
        None::<&str>,
    )
    .expect("bind-mount /proc/self/ns/net");
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycles_with_a_netns_mount_and_odd_paths_on_the_node_all_succeed() {
    let sandbox = MountSandbox::new();
    bind_netns(&sandbox.path().join("cni-netns"));
    let (_process, mut csi) = served(&sandbox).await;
    let mut tally = Tally::new(
        "volume lifecycles beside an nsfs mount, paths with space/tab/newline/backslash",
    );
    for (n, odd) in [
        "plain",
        "with space",
        "with\ttab",
        "with\nnewline",
        "with\\backslash",
    ]
    .iter()
    .cycle()
    .take(10)
    .enumerate()
    {
        let id = create(&mut csi, &format!("pvc-odd-{n}"), 1 << 20).await;
        let staging = sandbox.dir(&format!("{odd} s{n}"));
        let target = sandbox.path().join(format!("{odd} t{n}"));
        let mut steps = Vec::new();
        let r = csi
            .node
            .node_stage_volume(stage_request(&id, &staging))
            .await;
        steps.push(("stage", r.map(drop)));
        let r = csi
            .node
            .node_publish_volume(publish_request(&id, &staging, &target, false))
            .await;
        steps.push(("publish", r.map(drop)));
        let written = std::fs::write(target.join("data"), b"x").is_ok();
        let r = csi
            .node
            .node_get_volume_stats(stats_request(&id, &target.display().to_string()))
            .await;
        steps.push(("stats", r.map(drop)));
        let r = csi
            .node
            .node_unpublish_volume(unpublish_request(&id, &target))
            .await;
        steps.push(("unpublish", r.map(drop)));
        let r = csi
            .node
            .node_unstage_volume(unstage_request(&id, &staging))
            .await;
        steps.push(("unstage", r.map(drop)));
        let r = csi.controller.delete_volume(delete_request(&id)).await;
        steps.push(("delete", r.map(drop)));
        let failed: Vec<_> = steps.iter().filter(|(_, r)| r.is_err()).collect();
        tally.check(
            written && failed.is_empty(),
            format_args!("{odd:?}: written {written}, failed {failed:?}"),
        );
    }
    tally.finish();
}

#[tokio::test]
async fn malformed_volume_ids_are_refused_by_every_call_and_touch_nothing() {
    let (sandbox, server, mut csi) = setup().await;
    let dir = sandbox.dir("pods");
    let outside = sandbox.dir("outside");
    std::fs::write(outside.join("keep"), b"x").unwrap();
    let mut tally = Tally::new("malformed volume IDs x every call that names a volume");
    for bad in crate::node_server::careless_requests::malformed_ids() {
        let codes = crate::node_server::careless_requests::codes_for(&mut csi, &bad, &dir).await;
        for (rpc, code) in codes {
            let kept = outside.join("keep").exists();
            let outcome = match code {
                _ if !kept => Outcome::Lost,
                Code::InvalidArgument => Outcome::Survived,
                _ => Outcome::Failed,
            };
            tally.record(outcome, format_args!("{rpc} of {bad:?}: {code:?}"));
        }
    }
    tally.finish();
    server.stop().await;
}
