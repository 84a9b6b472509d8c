//! Snapshots and clones through the real binary of a volume whose pod keeps replacing names
//! under it with symlinks, fifos, files and directories: every copy answered OK (never
//! INTERNAL), every steady file in it, and the entries left out counted in the log.

use super::processes::Node;
use super::tally::Tally;
use crate::common::csi_node;
use crate::common::csi_snapshots::{from_snapshot, from_volume, snapshot_request};
use crate::storage::copy_churn::Churn;

const COPIES: usize = 20;
const STEADY: usize = 20;

/// The counts the binary logged for entries it left out of its copies.
fn left_out(logs: &str) -> usize {
    (logs.lines())
        .filter_map(|line| line.split_once(": left out ")?.1.split_once(" entries"))
        .filter_map(|(count, _)| count.parse::<usize>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_and_clones_of_a_churning_volume_are_all_answered_ok() {
    let node = Node::new();
    let server = node.node_server().await.expect("node-server");
    let mut csi = csi_node::connect(&node.csi()).await;
    let source = csi_node::create(&mut csi, "pvc-churn", 1 << 20).await;
    let dir = node.state().join("volumes").join(&source);
    for i in 0..STEADY {
        std::fs::write(dir.join(format!("kept-{i}")), b"kept").unwrap();
    }
    let churn = Churn::start(&dir);
    let mut tally = Tally::new("snapshots and clones of a volume under churn");
    let steady =
        |copy: &std::path::Path| (0..STEADY).all(|i| copy.join(format!("kept-{i}")).is_file());
    for n in 0..COPIES {
        let snapshot = (csi.controller)
            .create_snapshot(snapshot_request(&format!("snap-churn-{n}"), &source))
            .await
            .map(|r| r.into_inner().snapshot.unwrap_or_default().snapshot_id);
        let kept = snapshot
            .as_ref()
            .is_ok_and(|id| steady(&node.state().join("snapshots").join(id)));
        tally.check(
            kept,
            format_args!(
                "snapshot {n}: {:?}",
                snapshot.as_ref().map_err(|s| s.code())
            ),
        );
        let clone = (csi.controller)
            .create_volume(from_volume(&format!("pvc-clone-{n}"), 1 << 20, &source))
            .await
            .map(|r| r.into_inner().volume.unwrap_or_default().volume_id);
        let kept = clone
            .as_ref()
            .is_ok_and(|id| steady(&node.state().join("volumes").join(id)));
        tally.check(
            kept,
            format_args!("clone {n}: {:?}", clone.as_ref().map_err(|s| s.code())),
        );
        // A restore copies a snapshot, which nothing churns: the control.
        if let Ok(id) = &snapshot {
            let restore = (csi.controller)
                .create_volume(from_snapshot(&format!("pvc-restore-{n}"), 1 << 20, id))
                .await;
            tally.check(
                restore.is_ok(),
                format_args!("restore {n}: {:?}", restore.map_err(|s| s.code())),
            );
        }
    }
    churn.stop();
    let counted = left_out(&server.stderr());
    tally.note(format_args!(
        "{counted} churning entries left out and logged"
    ));
    assert!(
        counted > 0,
        "the churn never reached a copy: the case tried nothing"
    );
    tally.finish();
}
