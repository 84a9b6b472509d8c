//! Two node-servers on one state directory and one socket, ten times over, the way a
//! `maxSurge` DaemonSet rollout runs them: the next generation starts while the old one serves,
//! waits without cleaning, and takes over when the old one exits, keeping every volume the old
//! one acknowledged under the one ID its name was given.

use std::collections::BTreeMap;

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
