//! Several registrars on one registration socket, printed (not asserted): how long after the
//! serving registrar dies one of the two standing by answers GetInfo on the socket. Three
//! registrars run for one driver (our node-server); each round the serving one is killed —
//! SIGKILL in odd rounds (its stale socket stays behind), SIGTERM in even ones — the clock
//! starts when its exit is reaped and stops at the first GetInfo answered on the socket
//! (polled every 1 ms over a fresh connection); a fresh registrar then joins as the third.
//! Also counted: rounds in which not exactly one of the two took over. `ROUNDS` (default 20).
//!
//! Runs the real binary (see `benches/support`); `scripts/bench-node-server.sh` runs it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use csi_nodekit::proto::registration::{InfoRequest, registration_client::RegistrationClient};

#[path = "../benches/support/mod.rs"]
mod support;
use support::{Proc, binary};

const DRIVER: &str = "bench.csi.example.io";

/// A registrar and what it has logged so far.
struct Registrar {
    proc: Proc,
    log: Arc<Mutex<String>>,
}

impl Registrar {
    fn start(dir: &Path) -> Self {
        let mut child = Command::new(binary())
            .arg("registrar")
            .arg("--v=2")
            .arg(format!("--csi-address={}", dir.join("csi.sock").display()))
            .arg(format!(
                "--kubelet-registration-path={}",
                dir.join("csi.sock").display()
            ))
            .arg(format!(
                "--plugin-registration-path={}",
                dir.join("registry").display()
            ))
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn registrar");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let keep = log.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let mut log = keep.lock().expect("log");
                log.push_str(&line);
                log.push('\n');
            }
        });
        Self {
            proc: Proc(child),
            log,
        }
    }

    fn said(&self, what: &str) -> bool {
        self.log.lock().expect("log").contains(what)
    }

    async fn until_said(&self, what: &str) {
        let started = Instant::now();
        while !self.said(what) {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "never said {what:?}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

async fn answers(socket: &Path) -> bool {
    let Ok(channel) = csi_nodekit::socket::connect(socket).await else {
        return false;
    };
    let reply = RegistrationClient::new(channel)
        .get_info(InfoRequest {})
        .await;
    reply.is_ok_and(|info| info.into_inner().name == DRIVER)
}

const STANDING_BY: &str = "standing by until it exits";
const TOOK_OVER: &str = "took over registration socket";

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let rounds: usize = std::env::var("ROUNDS").map_or(20, |n| n.parse().expect("ROUNDS"));
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir
        .path()
        .join("registry")
        .join(format!("{DRIVER}-reg.sock"));
    let _driver = support::spawn(&[
        "node-server".to_owned(),
        format!("--endpoint={}", dir.path().join("csi.sock").display()),
        format!("--state-dir={}", dir.path().join("state").display()),
        format!("--driver-name={DRIVER}"),
        "--node-id=bench".to_owned(),
    ]);
    let mut serving = Registrar::start(dir.path());
    while !answers(&socket).await {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut standing_by = vec![Registrar::start(dir.path()), Registrar::start(dir.path())];
    for registrar in &standing_by {
        registrar.until_said(STANDING_BY).await;
    }
    let (mut killed, mut stopped) = (Vec::new(), Vec::new());
    let mut not_one = 0;
    for round in 1..=rounds {
        let pid = nix::unistd::Pid::from_raw(serving.proc.0.id() as i32);
        let signal = match round % 2 {
            1 => nix::sys::signal::Signal::SIGKILL,
            _ => nix::sys::signal::Signal::SIGTERM,
        };
        nix::sys::signal::kill(pid, signal).expect("signal");
        serving.proc.0.wait().expect("reap the serving registrar");
        let exited = Instant::now();
        while !answers(&socket).await {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let took = exited.elapsed();
        match round % 2 {
            1 => killed.push(took),
            _ => stopped.push(took),
        }
        // Who took over: it says so; the other must still stand by.
        let started = Instant::now();
        while !standing_by.iter().any(|r| r.said(TOOK_OVER)) {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "nobody said it took over"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if standing_by.iter().filter(|r| r.said(TOOK_OVER)).count() != 1 {
            not_one += 1;
        }
        let taker = standing_by
            .iter()
            .position(|r| r.said(TOOK_OVER))
            .expect("a taker");
        serving = standing_by.remove(taker);
        let fresh = Registrar::start(dir.path());
        fresh.until_said(STANDING_BY).await;
        standing_by.push(fresh);
    }
    let ms = |d: &Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
    for (how, took) in [("SIGKILL", &mut killed), ("SIGTERM", &mut stopped)] {
        took.sort();
        let n = took.len();
        if n == 0 {
            continue;
        }
        println!(
            "registrar hand-over among 3 on one socket, serving one stopped by {how} ({n} \
             rounds, its exit reaped → GetInfo answered): median {}, p90 {}, max {}",
            ms(&took[n / 2]),
            ms(&took[n * 9 / 10]),
            ms(&took[n - 1]),
        );
    }
    println!("rounds in which not exactly one standby took over: {not_one} of {rounds}");
}
