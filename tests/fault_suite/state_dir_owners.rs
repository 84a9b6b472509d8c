//! Two node-servers on one state directory and one socket, ten times over, the way a
//! `maxSurge` DaemonSet rollout runs them: the next generation starts while the old one serves,
//! waits without cleaning, and takes over when the old one exits, keeping every volume the old
//! one acknowledged under the one ID its name was given.

use std::collections::BTreeMap;
use std::path::Path;

use super::processes::{self, Node};
use super::tally::{Outcome, Tally};
use crate::common::csi_node;
use crate::common::{send_signal, spawn, wait_exit, wait_until};

const GENERATIONS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_surge_hand_overs_on_one_state_dir_keep_every_volume_under_one_id() {
    let node = Node::new();
    let mut tally = Tally::new("two node-servers on one state directory, hand-over");
    let limit = processes::BACK_WITHIN;
    let mut serving = node
        .node_server()
        .await
        .expect("the first generation serves");
    // Names acknowledged so far → the ID each was given.
    let mut ids: BTreeMap<String, String> = BTreeMap::new();
    for generation in 0..GENERATIONS {
        let mut csi = csi_node::connect(&node.csi()).await;
        let name = format!("pvc-{generation}");
        ids.insert(
            name.clone(),
            csi_node::create(&mut csi, &name, 1 << 20).await,
        );
        // What the next one's start-up would clean, were it to start cleaning early.
        let interrupted = node
            .state()
            .join(format!("volumes/pvc-interrupted-{generation}"));
        std::fs::create_dir_all(&interrupted).unwrap();
        let next = spawn(&mut node.node_server_command(), "node-server");
        let waits = wait_until(limit, || next.stderr().contains("waiting for it to exit")).await;
        // The old generation goes on serving (a new name, acknowledged) while the next waits.
        let name = format!("pvc-{generation}-during");
        ids.insert(
            name.clone(),
            csi_node::create(&mut csi, &name, 1 << 20).await,
        );
        let untouched = interrupted.exists();
        drop(csi);
        send_signal(&serving.0, nix::sys::signal::Signal::SIGTERM);
        wait_exit(&mut serving.0, limit);
        let took_over = processes::probe_ready(&node.csi()).await;
        serving = next;
        if !(waits && untouched && took_over) {
            let what = format_args!(
                "generation {generation}: waited {waits}, cleaned nothing early {untouched}, \
                 took over {took_over}"
            );
            tally.record(Outcome::Failed, what);
            continue;
        }
        let mut csi = csi_node::connect(&node.csi()).await;
        let mut changed = Vec::new();
        for (name, id) in &ids {
            let again = csi_node::create(&mut csi, name, 1 << 20).await;
            if again != *id {
                changed.push(format!("{name}: {id} then {again}"));
            }
        }
        if changed.is_empty() {
            tally.record(Outcome::Survived, "");
        } else {
            tally.record(
                Outcome::Lost,
                format_args!("generation {generation}: {changed:?}"),
            );
        }
    }
    tally.note(format_args!("{} volumes kept", ids.len()));
    tally.finish();
}

/// Rounds of every way to take the lock file from under its holder.
const LOCK_ROUNDS: usize = 20;

/// One way to take the lock file at the path from under its holder.
type Attack = fn(&Path);

/// What a neighbour (root, or a clean-up script) can do to `<state-dir>/node-server.lock`
/// while a node-server holds it.
const LOCK_ATTACKS: [(&str, Attack); 5] = [
    ("unlinked", |lock| std::fs::remove_file(lock).unwrap()),
    ("moved away", |lock| {
        std::fs::rename(lock, lock.with_extension("moved")).unwrap()
    }),
    ("moved away, a new file made", |lock| {
        std::fs::rename(lock, lock.with_extension("moved")).unwrap();
        std::fs::write(lock, b"").unwrap();
    }),
    ("another file renamed over it", |lock| {
        let other = lock.with_extension("other");
        std::fs::write(&other, b"pid 1 on nobody").unwrap();
        std::fs::rename(&other, lock).unwrap();
    }),
    ("replaced by a symlink", |lock| {
        std::fs::remove_file(lock).unwrap();
        std::os::unix::fs::symlink("/dev/null", lock).unwrap();
    }),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_file_unlinked_or_replaced_under_its_holder_lets_no_second_node_server_in() {
    let node = Node::new();
    let mut tally = Tally::new("node-server.lock unlinked or replaced while held");
    let lock = node.state().join("node-server.lock");
    for round in 0..LOCK_ROUNDS {
        for (kind, (what, attack)) in LOCK_ATTACKS.into_iter().enumerate() {
            // A holder that took the directory after the last one left, whatever the last
            // attack left at the path.
            let Some(mut holder) = node.node_server().await else {
                tally.record(
                    Outcome::Failed,
                    format_args!("{what}, round {round}: no holder"),
                );
                continue;
            };
            // Work in progress that a second instance's start-up would set aside.
            let interrupted = node
                .state()
                .join(format!("volumes/pvc-interrupted-{round}"));
            std::fs::create_dir_all(&interrupted).unwrap();
            attack(&lock);
            let second = node
                .node_server_command()
                .arg("--state-dir-busy=exit")
                .output()
                .expect("run a second node-server");
            let stderr = String::from_utf8_lossy(&second.stderr);
            let refused = second.status.code() == Some(1)
                && stderr.contains("is in use by another node-server");
            let mut csi = csi_node::connect(&node.csi()).await;
            let name = format!("pvc-lock-{round}-{kind}");
            let still_serves = (csi.controller)
                .create_volume(csi_node::create_request(&name, 1 << 20))
                .await
                .is_ok();
            let untouched = interrupted.exists();
            let outcome = match (refused, untouched, still_serves) {
                (true, true, true) => Outcome::Survived,
                (_, false, _) => Outcome::Lost,
                _ => Outcome::Failed,
            };
            tally.record(
                outcome,
                format_args!(
                    "{what}, round {round}: second refused {refused}, work in progress kept \
                     {untouched}, first still serves {still_serves}: {stderr}"
                ),
            );
            drop(csi);
            send_signal(&holder.0, nix::sys::signal::Signal::SIGTERM);
            wait_exit(&mut holder.0, processes::BACK_WITHIN);
            // Gone already where a second instance set it aside.
            let _ = std::fs::remove_dir(&interrupted);
        }
    }
    tally.note(format_args!(
        "{} attacks, {LOCK_ROUNDS} rounds each",
        LOCK_ATTACKS.len()
    ));
    tally.finish();
}
