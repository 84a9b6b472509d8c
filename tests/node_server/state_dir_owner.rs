//! Two real node-server processes on one `--state-dir`: the second neither serves nor cleans
//! while the first lives, says why, and takes over when the first exits; with
//! `--state-dir-busy=exit` it exits 1 at once.

use std::path::Path;
use std::time::Duration;

use crate::common::csi_node;
use crate::common::wait_until;
use crate::common::{KillOnDrop, node_server_output, send_signal, spawn_node_server, wait_exit};
use csi_nodekit::proto::csi::ProbeRequest;
use csi_nodekit::proto::csi::identity_client::IdentityClient;
use nix::sys::signal::Signal;

const LIMIT: Duration = Duration::from_secs(10);

/// The Probe answer on `socket`: `Ok(ready)` or the error's code and message.
async fn probe(socket: &Path) -> Option<Result<bool, (tonic::Code, String)>> {
    let channel = csi_nodekit::socket::connect(socket).await.ok()?;
    let reply = IdentityClient::new(channel).probe(ProbeRequest {}).await;
    Some(match reply {
        Ok(r) => Ok(r.into_inner().ready != Some(false)),
        Err(s) => Err((s.code(), s.message().to_owned())),
    })
}

/// The first error Probe answers on `socket`, polled until it answers at all.
async fn refusal(socket: &Path) -> Option<(tonic::Code, String)> {
    for _ in 0..500 {
        match probe(socket).await {
            Some(Err(refused)) => return Some(refused),
            Some(Ok(_)) => return None,
            None => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    None
}

async fn serving(socket: &Path) -> bool {
    for _ in 0..500 {
        if probe(socket).await == Some(Ok(true)) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

fn start(dir: &Path, socket: &str, extra: &[&str]) -> KillOnDrop {
    spawn_node_server(
        &dir.join(socket),
        &dir.join("state"),
        &[&["--node-id=node-a"], extra].concat(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_node_server_waits_without_serving_or_cleaning_and_takes_over_when_the_first_exits()
 {
    let dir = tempfile::tempdir().unwrap();
    let (first_socket, second_socket) = (dir.path().join("a.sock"), dir.path().join("b.sock"));
    let mut first = start(dir.path(), "a.sock", &[]);
    assert!(serving(&first_socket).await, "the first never served");
    let mut csi = csi_node::connect(&first_socket).await;
    let id = csi_node::create(&mut csi, "pvc-kept", 1 << 20).await;
    // What a start-up would clean: a volume directory without a record, as an interrupted
    // create leaves it. The second instance must not touch it while the first owns the dir.
    let unrecorded = dir.path().join("state/volumes/pvc-interrupted");
    std::fs::create_dir_all(&unrecorded).unwrap();
    std::fs::write(unrecorded.join("data"), b"in progress").unwrap();

    let second = start(dir.path(), "b.sock", &[]);
    let said = wait_until(LIMIT, || second.stderr().contains("waiting for it to exit")).await;
    assert!(said, "no waiting line:\n{}", second.stderr());
    let holder = format!("pid {}", first.0.id());
    assert!(second.stderr().contains(&holder), "{}", second.stderr());
    let (code, message) = refusal(&second_socket)
        .await
        .expect("the waiting instance's socket never answered");
    assert_eq!(code, tonic::Code::Unavailable, "{message}");
    assert!(
        message.contains("in use by another node-server"),
        "{message}"
    );
    assert!(message.contains(&holder), "{message}");
    // The first still serves, and the second has cleaned nothing.
    let second_id = csi_node::create(&mut csi, "pvc-while-waiting", 1 << 20).await;
    assert!(
        unrecorded.join("data").exists(),
        "the waiting instance cleaned"
    );
    let waiting_lines = second.stderr().matches("waiting for it to exit").count();
    assert_eq!(waiting_lines, 1, "{}", second.stderr());

    let refused = node_server_output(
        &dir.path().join("c.sock"),
        &dir.path().join("state"),
        &["--node-id=node-a", "--state-dir-busy=exit"],
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("in use by another node-server"), "{stderr}");
    assert!(!dir.path().join("c.sock").exists());

    send_signal(&first.0, Signal::SIGTERM);
    assert!(wait_exit(&mut first.0, LIMIT).success());
    assert!(serving(&second_socket).await, "{}", second.stderr());
    assert!(second.stderr().contains("took over state directory"));
    let mut csi = csi_node::connect(&second_socket).await;
    // Same names, same IDs: the records the first wrote are the second's now.
    assert_eq!(csi_node::create(&mut csi, "pvc-kept", 1 << 20).await, id);
    let again = csi_node::create(&mut csi, "pvc-while-waiting", 1 << 20).await;
    assert_eq!(again, second_id);
    assert!(!unrecorded.exists(), "the new owner's start-up cleanup ran");
}
