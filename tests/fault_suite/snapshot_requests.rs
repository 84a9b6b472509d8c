//! Careless snapshot, group and paging requests through the real binary: bad names, path-like
//! source IDs, over-long snapshot IDs, huge and forged tokens. Each gets the spec's code with a
//! short message, no snapshot is made, and the process goes on serving.

use super::tally::Tally;
use crate::common::csi_node::*;
use crate::common::spawn_node_server;
use crate::node_server::careless_snapshot_requests::{MAX_MESSAGE, answers};
use csi_nodekit::proto::csi::ListSnapshotsRequest;

const ROUNDS: usize = 3;

#[ignore = "needs root: the real binary's state directory and mounts (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn careless_snapshot_group_and_paging_requests_are_refused_by_the_real_binary() {
    let sandbox = MountSandbox::new();
    let socket = sandbox.path().join("csi.sock");
    let _process = spawn_node_server(&socket, &sandbox.path().join("state"), &[]);
    assert!(super::processes::probe_ready(&socket).await, "node-server");
    let mut csi = connect(&socket).await;
    let volume = create(&mut csi, "pvc-fault-snap", 1 << 20).await;
    let mut tally =
        Tally::new("careless snapshot and group names, source IDs, snapshot IDs and paging tokens");
    for round in 0..ROUNDS {
        for (what, got, want, len) in answers(&mut csi, &volume).await {
            let fine = got == want && len <= MAX_MESSAGE;
            tally.check(
                fine,
                format_args!("round {round}, {what}: {got:?} ({len}-byte message), want {want:?}"),
            );
        }
    }
    let listed = csi
        .controller
        .list_snapshots(ListSnapshotsRequest::default())
        .await;
    let none = listed.is_ok_and(|r| r.into_inner().entries.is_empty());
    tally.check(none, "no snapshot was made, and the binary still answers");
    tally.finish();
}
