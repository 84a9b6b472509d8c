//! DeleteVolume interrupted, through the real binary: SIGKILLed while it removes a volume of
//! many files (caught by its `deleting` mark, no timing), and stopped by a file made immutable.
//! The half-deleted volume is never listed or found by name again, a neighbour keeps its data,
//! and the deletion finishes: at the next start, or on the retry once the file can go.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::processes::{self, BACK_WITHIN, DRIVER};
use super::tally::{Outcome, Tally};
use crate::common::csi_node::{self, Csi, delete_request};
use crate::common::scratch_fs::{Kind, ScratchFs, run};
use crate::common::{KillOnDrop, eventually, spawn_node_server};
use csi_nodekit::proto::csi::ListVolumesRequest;

const TRIES: usize = 3;
/// Enough files that removing them takes a while: the removal is caught under way.
const DIRS: usize = 40;
const FILES_PER_DIR: usize = 50;

async fn serve(socket: &Path, state: &Path) -> Option<(KillOnDrop, Csi)> {
    let driver = format!("--driver-name={DRIVER}");
    let process = spawn_node_server(socket, state, &[&driver, "--node-id=node-a"]);
    if !processes::probe_ready(socket).await {
        eprintln!("node-server did not come up:\n{}", process.stderr());
        return None;
    }
    Some((process, csi_node::connect(socket).await))
}

async fn listed(csi: &mut Csi) -> BTreeSet<String> {
    let reply = csi.controller.list_volumes(ListVolumesRequest::default());
    let entries = reply.await.map(|r| r.into_inner().entries);
    (entries.unwrap_or_default().into_iter())
        .filter_map(|e| Some(e.volume?.volume_id))
        .collect()
}

fn record(state: &Path, id: &str) -> PathBuf {
    state.join("meta").join(format!("{id}.json"))
}

fn marked(state: &Path, id: &str) -> bool {
    std::fs::read_to_string(record(state, id)).is_ok_and(|r| r.contains("\"deleting\":true"))
}

/// How many entries are left under `dir` (0 when it is gone).
fn entries(dir: &Path) -> usize {
    let Ok(read) = std::fs::read_dir(dir) else {
        return 0;
    };
    (read.flatten())
        .map(|e| {
            1 + if e.path().is_dir() {
                entries(&e.path())
            } else {
                0
            }
        })
        .sum()
}

/// A neighbour with data, and a volume of [`DIRS`] × [`FILES_PER_DIR`] files; their IDs.
async fn volumes(csi: &mut Csi, state: &Path, try_: usize) -> (String, String) {
    let kept = csi_node::create(csi, &format!("pvc-kept-{try_}"), 1 << 20).await;
    std::fs::write(state.join("volumes").join(&kept).join("data"), b"kept").unwrap();
    let doomed = csi_node::create(csi, &format!("pvc-doomed-{try_}"), 1 << 20).await;
    let dir = state.join("volumes").join(&doomed);
    for d in 0..DIRS {
        let sub = dir.join(format!("d{d}"));
        std::fs::create_dir(&sub).unwrap();
        for f in 0..FILES_PER_DIR {
            std::fs::write(sub.join(format!("f{f}")), b"x").unwrap();
        }
    }
    (kept, doomed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_server_killed_mid_delete_never_lists_the_volume_and_finishes_at_its_start() {
    let node = processes::Node::new();
    let (socket, state) = (node.csi(), node.state());
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    let mut tally = Tally::new("node-server SIGKILLed mid-DeleteVolume, restarted");
    let all = DIRS * (FILES_PER_DIR + 1);
    let mut left_at_kill = Vec::new();
    let mut restarts = Vec::new();
    for try_ in 0..TRIES {
        let (process, mut csi) = serve(&socket, &state).await.expect("node-server");
        let (kept, doomed) = volumes(&mut csi, &state, try_).await;
        let mut deleting = csi.clone();
        let request = delete_request(&doomed);
        let call = tokio::spawn(async move { deleting.controller.delete_volume(request).await });
        // The mark is written before the first file goes: kill once it is there and the
        // removal has begun.
        let dir = state.join("volumes").join(&doomed);
        let seen = eventually(BACK_WITHIN, || {
            (marked(&state, &doomed) && entries(&dir) < all).then_some(())
        })
        .await;
        processes::kill(process);
        let answer = call.await.unwrap();
        let left = entries(&dir);
        left_at_kill.push(left);
        let mid_delete = seen.is_some() && answer.is_err() && marked(&state, &doomed) && left > 0;
        if !mid_delete {
            let what = format_args!(
                "try {try_}: not killed mid-delete (mark seen {}, answer {answer:?}, {left} \
                 entries left)",
                seen.is_some()
            );
            tally.record(Outcome::Failed, what);
            continue;
        }

        let restarted = std::time::Instant::now();
        let served = serve(&socket, &state).await;
        restarts.push(restarted.elapsed().as_millis());
        let Some((_process, mut csi)) = served else {
            tally.record(
                Outcome::Failed,
                format_args!("try {try_}: did not come back"),
            );
            continue;
        };
        let volumes = listed(&mut csi).await;
        let finished = !state.join("volumes").join(&doomed).exists()
            && !record(&state, &doomed).exists()
            && !volumes.contains(&doomed);
        let neighbour = volumes.contains(&kept)
            && std::fs::read(state.join("volumes").join(&kept).join("data"))
                .is_ok_and(|d| d == b"kept");
        let retried = csi.controller.delete_volume(delete_request(&doomed)).await;
        let outcome = match (neighbour, finished, &retried) {
            (false, _, _) => Outcome::Lost,
            (true, true, Ok(_)) => Outcome::Survived,
            _ => Outcome::Failed,
        };
        tally.record(
            outcome,
            format_args!(
                "try {try_}: finished at start {finished}, neighbour kept {neighbour}, retry \
                 {retried:?}"
            ),
        );
    }
    tally.note(format_args!(
        "volumes of {all} entries, {left_at_kill:?} left at the kill, serving again in \
         {restarts:?} ms"
    ));
    tally.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and chattr: an ext4 scratch filesystem and an immutable file"]
async fn an_immutable_file_is_named_the_volume_stays_unlisted_and_a_restart_sets_it_aside_until_it_can_go()
 {
    let fs = ScratchFs::new(Kind::Ext4);
    let node = processes::Node::new();
    let (socket, state) = (node.csi(), fs.path().join("state"));
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    let mut tally = Tally::new("DeleteVolume of a volume holding an immutable file");
    for try_ in 0..TRIES {
        let (process, mut csi) = serve(&socket, &state).await.expect("node-server");
        let id = csi_node::create(&mut csi, &format!("pvc-stuck-{try_}"), 1 << 20).await;
        let dir = state.join("volumes").join(&id);
        std::fs::create_dir(dir.join("sub")).unwrap();
        for file in ["a", "sub/b", "sub/stuck", "z"] {
            std::fs::write(dir.join(file), file).unwrap();
        }
        let stuck = dir.join("sub/stuck");
        let stuck_name = stuck.to_str().unwrap();
        run("chattr", &["+i", stuck_name]);
        let answer = csi.controller.delete_volume(delete_request(&id)).await;
        let named = answer
            .as_ref()
            .is_err_and(|s| s.code() == tonic::Code::Internal && s.message().contains(stuck_name));
        let unlisted = !listed(&mut csi).await.contains(&id) && marked(&state, &id);
        // Killed and started again with the file still immutable: what is left is set aside
        // under an orphan's name (no volume ID can take it), the record goes, and the
        // background removal names the file it cannot remove.
        processes::kill(process);
        let (process, mut csi) = serve(&socket, &state).await.expect("node-server again");
        let set_aside =
            !listed(&mut csi).await.contains(&id) && !record(&state, &id).exists() && !dir.exists();
        let orphan = orphan_holding(&state.join("volumes"), "sub/stuck");
        let logged = eventually(Duration::from_secs(10), || {
            let log = process.stderr();
            (log.contains("could not remove orphan") && log.contains("stuck")).then_some(())
        })
        .await
        .is_some();
        let retried = csi.controller.delete_volume(delete_request(&id)).await;
        // Once the file can go, the next start removes it.
        if let Some(orphan) = &orphan {
            run(
                "chattr",
                &["-i", orphan.join("sub/stuck").to_str().unwrap()],
            );
        }
        processes::kill(process);
        let (process, _csi) = serve(&socket, &state)
            .await
            .expect("node-server a third time");
        let gone = eventually(Duration::from_secs(10), || {
            orphan.as_ref().is_some_and(|o| !o.exists()).then_some(())
        })
        .await
        .is_some();
        tally.check(
            named && unlisted && set_aside && logged && retried.is_ok() && gone,
            format_args!(
                "try {try_}: named {named} ({answer:?}), unlisted {unlisted}, set aside at the \
                 restart {set_aside} ({orphan:?}), logged {logged}, retry {retried:?}, \
                 removed at the next start {gone}"
            ),
        );
        drop(process);
    }
    tally.finish();
}

/// The orphan under `volumes` that holds `inner` (what a start-up set aside).
fn orphan_holding(volumes: &Path, inner: &str) -> Option<PathBuf> {
    (std::fs::read_dir(volumes).ok()?)
        .filter_map(|e| Some(e.ok()?.path()))
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(".orphan-"))
                && p.join(inner).exists()
        })
}
