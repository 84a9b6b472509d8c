//! Ten registrar generations rolled with surge, as real processes: each next one starts while
//! the one before serves the registration socket, stands by without touching it, and takes
//! over when the old one exits (SIGTERM, as a pod stops; or SIGKILL, which leaves its socket
//! behind); the old one's exit never removes the new one's socket.

use std::time::{Duration, Instant};

use super::processes::{self, BACK_WITHIN, DRIVER, Node};
use super::tally::Tally;
use crate::common::{self, spawn, wait_exit, wait_until};
use csi_nodekit::socket::identity_of;
use nix::sys::signal::Signal;

const GENERATIONS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_surge_generations_of_the_registrar_hand_over_and_keep_each_others_sockets() {
    let node = Node::new();
    let _driver = node.node_server().await.expect("node-server");
    let mut serving = spawn(
        &mut node.registrar_command_without_health_port(),
        "registrar",
    );
    assert!(
        processes::registered(&node.reg_socket()).await,
        "the first generation registers"
    );
    let mut tally = Tally::new("registrar surge rollout, 10 generations");
    let mut hand_overs: Vec<(Signal, Duration)> = Vec::new();
    for generation in 0..GENERATIONS {
        let old_socket = identity_of(&node.reg_socket());
        let next = spawn(
            node.registrar_command_without_health_port().arg("--v=2"),
            "registrar",
        );
        let stands_by = wait_until(BACK_WITHIN, || next.stderr().contains("standing by")).await;
        let untouched = identity_of(&node.reg_socket()) == old_socket
            && processes::get_info(&node.reg_socket()).await.as_deref() == Some(DRIVER);

        // Every other generation dies without its clean-up, leaving its socket behind.
        let signal = [Signal::SIGTERM, Signal::SIGKILL][generation % 2];
        common::send_signal(&serving.0, signal);
        let exited = Instant::now();
        wait_exit(&mut serving.0, BACK_WITHIN);
        let took_over = wait_until(BACK_WITHIN, || {
            identity_of(&node.reg_socket()).is_some_and(|now| Some(now) != old_socket)
        })
        .await
            && processes::registered(&node.reg_socket()).await;
        let took = exited.elapsed();
        let new_socket = identity_of(&node.reg_socket());
        serving = next;
        // Whatever the old one does on its way out is done once it is reaped: the new socket stays.
        let kept = new_socket.is_some()
            && identity_of(&node.reg_socket()) == new_socket
            && processes::get_info(&node.reg_socket()).await.as_deref() == Some(DRIVER);
        if took_over {
            hand_overs.push((signal, took));
        }
        tally.check(
            stands_by && untouched && took_over && kept,
            format_args!(
                "generation {generation} ({signal}): stood by {stands_by}, left the live socket \
                 alone {untouched}, took over {took_over} in {took:?}, kept its socket {kept}"
            ),
        );
    }
    let slowest = |wanted: Signal| {
        (hand_overs.iter())
            .filter(|(signal, _)| *signal == wanted)
            .map(|(_, took)| took.as_millis())
            .max()
            .unwrap_or_default()
    };
    tally.note(format_args!(
        "slowest hand-over: {} ms after a SIGTERM, {} ms after a SIGKILL",
        slowest(Signal::SIGTERM),
        slowest(Signal::SIGKILL)
    ));
    tally.finish();
}

/// A holder that takes no claim (upstream's registrar, or an older one of ours) serving the
/// registration socket, SIGKILLed so its socket stays behind: our registrar, standing by,
/// takes over within 300 ms each time (before: its 1 s poll, 1,024 ms median).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimless_holder_killed_hands_over_within_300_ms() {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, bind, listen, socket};
    use nix::unistd::{ForkResult, fork};
    const ROUNDS: usize = 5;
    let node = Node::new();
    let _driver = node.node_server().await.expect("node-server");
    std::fs::create_dir_all(node.registry()).unwrap();
    let mut tally = Tally::new("a claimless registration-socket holder SIGKILLed, 5 times");
    let mut took = Vec::new();
    for round in 0..ROUNDS {
        let _ = std::fs::remove_file(node.reg_socket());
        // Everything the child needs is made before the fork: it only binds, listens and waits.
        let address = UnixAddr::new(&node.reg_socket()).unwrap();
        let listener = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        // SAFETY: the child calls only bind, listen and pause (no allocation, no lock) and
        // never returns into the test harness.
        let holder = match unsafe { fork() }.expect("fork") {
            ForkResult::Child => {
                let backlog = nix::sys::socket::Backlog::new(8).unwrap();
                if bind(std::os::fd::AsRawFd::as_raw_fd(&listener), &address).is_err()
                    || listen(&listener, backlog).is_err()
                {
                    // SAFETY: leaving the forked child at once.
                    unsafe { nix::libc::_exit(1) };
                }
                loop {
                    nix::unistd::pause();
                }
            }
            ForkResult::Parent { child } => child,
        };
        drop(listener);
        let held = wait_until(BACK_WITHIN, || {
            csi_nodekit::socket::is_served(&node.reg_socket())
        })
        .await;
        let old_socket = identity_of(&node.reg_socket());
        let registrar = spawn(
            node.registrar_command_without_health_port().arg("--v=2"),
            "registrar",
        );
        let stands_by = wait_until(BACK_WITHIN, || {
            registrar.stderr().contains("served by another process")
        })
        .await;
        nix::sys::signal::kill(holder, Signal::SIGKILL).unwrap();
        let _ = nix::sys::wait::waitpid(holder, None);
        let killed = Instant::now();
        let took_over = wait_until(BACK_WITHIN, || {
            identity_of(&node.reg_socket()).is_some_and(|now| Some(now) != old_socket)
        })
        .await;
        let elapsed = killed.elapsed();
        took.push(elapsed.as_millis());
        tally.check(
            held && stands_by && took_over && elapsed <= Duration::from_millis(300),
            format_args!(
                "round {round}: held {held}, stood by {stands_by}, took over {took_over} in \
                 {elapsed:?}"
            ),
        );
        drop(registrar);
    }
    took.sort_unstable();
    tally.note(format_args!(
        "hand-over after the SIGKILL: median {} ms, slowest {} ms",
        took[took.len() / 2],
        took[took.len() - 1]
    ));
    tally.finish();
}
