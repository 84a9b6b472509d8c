//! The state directory's hand-over, printed (not asserted): how long after one node-server's
//! exit the next one, started on the same `--state-dir` and socket (a `maxSurge` rollout) and
//! waiting for the directory's lock, answers Probe ready. Each round: A serves; B starts and
//! says it waits; A gets SIGTERM; the clock starts when A's exit is reaped and stops at B's
//! first ready Probe (polled every 1 ms over a fresh connection). `ROUNDS` (default 20).
//!
//! Runs the real binary (see `benches/support`); `scripts/bench-node-server.sh` runs it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use csi_nodekit::proto::csi::ProbeRequest;
use csi_nodekit::proto::csi::identity_client::IdentityClient;

#[path = "../benches/support/mod.rs"]
mod support;
use support::{Proc, binary};

fn node_server(dir: &Path, waits: bool) -> Proc {
    let mut child = Command::new(binary())
        .arg("node-server")
        .arg(format!("--endpoint={}", dir.join("csi.sock").display()))
        .arg(format!("--state-dir={}", dir.join("state").display()))
        .arg("--node-id=bench")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn node-server");
    let stderr = child.stderr.take().expect("stderr");
    let (said, heard) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("waiting for it to exit") || line.contains("serving CSI driver") {
                let _ = said.send(line);
            }
        }
    });
    let line = heard
        .recv_timeout(Duration::from_secs(10))
        .expect("a start-up line");
    assert_eq!(line.contains("waiting"), waits, "{line}");
    Proc(child)
}

async fn ready(socket: &Path) -> bool {
    let Ok(channel) = csi_nodekit::socket::connect(socket).await else {
        return false;
    };
    let reply = IdentityClient::new(channel).probe(ProbeRequest {}).await;
    reply.is_ok_and(|r| r.into_inner().ready != Some(false))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let rounds: usize = std::env::var("ROUNDS").map_or(20, |n| n.parse().expect("ROUNDS"));
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("csi.sock");
    let mut serving = node_server(dir.path(), false);
    let mut took = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        while !ready(&socket).await {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let next = node_server(dir.path(), true);
        let pid = nix::unistd::Pid::from_raw(serving.0.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        serving.0.wait().expect("reap the old node-server");
        let exited = Instant::now();
        while !ready(&socket).await {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        took.push(exited.elapsed());
        serving = next;
    }
    took.sort();
    let ms = |d: &Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
    println!(
        "node-server hand-over on one state directory ({rounds} rounds, old exit reaped → new \
         Probe ready): median {}, p90 {}, max {}",
        ms(&took[rounds / 2]),
        ms(&took[rounds * 9 / 10]),
        ms(&took[rounds - 1]),
    );
}
