//! SIGKILL and restart, twenty times per mode: each comes back over the socket it left
//! behind, and node-server keeps every volume it acknowledged.

use std::collections::{BTreeMap, BTreeSet};

use super::processes::{self, Node};
use super::tally::{Outcome, Tally};
use crate::common::csi_node::{self, create_request};
use crate::common::free_local_address;
use csi_nodekit::proto::csi::ListVolumesRequest;

const CYCLES: usize = 20;

/// The IDs of the volumes node-server lists.
async fn listed(csi: &mut csi_node::Csi) -> Option<BTreeSet<String>> {
    let reply = csi
        .controller
        .list_volumes(ListVolumesRequest::default())
        .await;
    let entries = reply.ok()?.into_inner().entries;
    Some(
        entries
            .into_iter()
            .filter_map(|e| e.volume)
            .map(|v| v.volume_id)
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_server_killed_twenty_times_mid_create_keeps_every_acknowledged_volume() {
    let node = Node::new();
    let mut tally = Tally::new("node-server SIGKILL and restart, mid-create");
    // Acknowledged volumes: ID → the data written into each.
    let mut acknowledged: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for cycle in 0..CYCLES {
        let Some(process) = node.node_server().await else {
            tally.record(
                Outcome::Failed,
                format_args!("cycle {cycle}: did not come back"),
            );
            continue;
        };
        let mut csi = csi_node::connect(&node.csi()).await;
        let after_restart = listed(&mut csi).await.unwrap_or_default();
        let missing: Vec<_> = (acknowledged.keys())
            .filter(|id| !after_restart.contains(*id))
            .collect();
        let changed: Vec<_> = (acknowledged.iter())
            .filter(|(id, data)| {
                std::fs::read(node.state().join("volumes").join(id).join("data"))
                    .ok()
                    .as_ref()
                    != Some(*data)
            })
            .map(|(id, _)| id)
            .collect();
        if !missing.is_empty() || !changed.is_empty() {
            let what = format_args!("cycle {cycle}: missing {missing:?}, changed {changed:?}");
            tally.record(Outcome::Lost, what);
        } else {
            tally.record(Outcome::Survived, "");
        }
        let name = format!("pvc-{cycle}");
        let id = csi_node::create(&mut csi, &name, 1 << 20).await;
        let data = format!("cycle {cycle}").into_bytes();
        let file = node.state().join("volumes").join(&id).join("data");
        std::fs::write(&file, &data).expect("write into the volume");
        acknowledged.insert(id, data);
        // A create in flight when the process dies: whether it lands is up to the timing,
        // but it must never take an acknowledged volume with it.
        let mut inflight = csi.clone();
        let request = create_request(&format!("pvc-{cycle}-in-flight"), 1 << 20);
        let call = tokio::spawn(async move { inflight.controller.create_volume(request).await });
        tokio::time::sleep(std::time::Duration::from_micros(200 * cycle as u64)).await;
        processes::kill(process);
        let _ = call.await;
    }
    tally.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registrar_killed_twenty_times_registers_again_each_time() {
    let node = Node::new();
    let _driver = node.node_server().await.expect("node-server");
    let http = free_local_address();
    let mut tally = Tally::new("registrar SIGKILL and restart");
    for cycle in 0..CYCLES {
        match node.registrar(&http).await {
            Some(process) => {
                let healthy = processes::healthz_within(&http, 200, processes::BACK_WITHIN).await;
                tally.check(healthy, format_args!("cycle {cycle}: /healthz not 200"));
                processes::kill(process);
            }
            None => tally.record(
                Outcome::Failed,
                format_args!("cycle {cycle}: not registered"),
            ),
        }
    }
    tally.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn livenessprobe_killed_twenty_times_answers_healthz_again_each_time() {
    let node = Node::new();
    let _driver = node.node_server().await.expect("node-server");
    let http = free_local_address();
    let mut tally = Tally::new("livenessprobe SIGKILL and restart");
    for cycle in 0..CYCLES {
        match node.livenessprobe(&http).await {
            Some(process) => {
                tally.record(Outcome::Survived, "");
                processes::kill(process);
            }
            None => tally.record(Outcome::Failed, format_args!("cycle {cycle}: no 200")),
        }
    }
    tally.finish();
}
