//! Several registrars on one registration socket, as real processes (a surge rollout with an
//! operator's extra copy): exactly one serves, the others stand by on the socket's claim, and
//! when the one serving dies — even by SIGKILL, which leaves a stale socket — exactly one of
//! them takes over, woken by its death, and no socket is unlinked but by its owner on exit or,
//! once stale, by the one taker. Every change of the socket's name in the registry is recorded
//! with inotify, so a second unlink or bind would show.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use super::setup::{DRIVER, Setup, WAIT};
use crate::common;
use common::fake_driver::FakeDriver;
use common::{KillOnDrop, wait_until};
use csi_nodekit::proto::registration::{InfoRequest, registration_client::RegistrationClient};

/// From the holder's death to the successor's GetInfo, at most: a successor that took this
/// long was not woken by the holder's exit but by the one-second poll behind it. (How long it
/// takes is a figure, printed by `examples/standby_bench.rs`: tens of milliseconds, and more
/// on a loaded machine, which is why this bound is loose.)
const TAKEOVER: Duration = Duration::from_secs(1);

/// What happened to one name in a directory, in order: `+` it appeared (bound, or renamed into
/// place), `-` it went (unlinked, or renamed away).
#[derive(Clone)]
struct NameLog(Arc<Mutex<Vec<char>>>);

impl NameLog {
    /// Records changes to `name` in `dir` from now on, on a thread of its own.
    fn watch(dir: &Path, name: String) -> Self {
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC).unwrap();
        let mask = AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MOVED_FROM;
        inotify.add_watch(dir, mask).unwrap();
        let log = Self(Arc::new(Mutex::new(Vec::new())));
        let record = log.clone();
        std::thread::spawn(move || {
            while let Ok(events) = inotify.read_events() {
                for event in events {
                    if event.name.as_deref() != Some(std::ffi::OsStr::new(&name)) {
                        continue;
                    }
                    let gone = event
                        .mask
                        .intersects(AddWatchFlags::IN_DELETE | AddWatchFlags::IN_MOVED_FROM);
                    record.0.lock().unwrap().push(if gone { '-' } else { '+' });
                }
            }
        });
        log
    }

    fn seen(&self) -> String {
        self.0.lock().unwrap().iter().collect()
    }

    /// Waits until the changes recorded so far are `expected` (the events come in on their
    /// own thread), and says what they were if they never are.
    async fn until(&self, expected: &str, what: &str) {
        let seen = wait_until(WAIT, || self.seen() == expected).await;
        assert!(seen, "{what}: expected {expected:?}, saw {:?}", self.seen());
    }
}

fn registrar(setup: &Setup, what: &str) -> KillOnDrop {
    common::spawn(setup.registrar_command().arg("--v=2"), what)
}

/// GetInfo on the registration socket, as the kubelet's first call; `None` if nobody answers.
async fn get_info(socket: &Path) -> Option<String> {
    let channel = csi_nodekit::socket::connect(socket).await.ok()?;
    let reply = RegistrationClient::new(channel)
        .get_info(InfoRequest {})
        .await;
    reply.ok().map(|info| info.into_inner().name)
}

/// Polls GetInfo (every millisecond) until it answers, and returns how long that took.
async fn until_served(socket: &Path) -> Duration {
    let started = Instant::now();
    while get_info(socket).await.is_none() {
        assert!(
            started.elapsed() < WAIT,
            "nobody serves {}",
            socket.display()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    started.elapsed()
}

async fn until_logged(process: &KillOnDrop, line: &str) {
    assert!(
        wait_until(WAIT, || process.stderr().contains(line)).await,
        "no {line:?}: {}",
        process.stderr()
    );
}

const SERVING: &str = "registering through";
const STANDING_BY: &str = "standing by until it exits";
const TOOK_OVER: &str = "took over registration socket";

fn count(processes: &[&KillOnDrop], line: &str) -> usize {
    processes
        .iter()
        .map(|p| p.stderr().matches(line).count())
        .sum()
}

fn registry_with_log(setup: &Setup) -> (PathBuf, NameLog) {
    std::fs::create_dir_all(&setup.registry).unwrap();
    let name = format!("{DRIVER}-reg.sock");
    (setup.reg_socket(), NameLog::watch(&setup.registry, name))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_three_registrars_one_serves_and_when_it_is_killed_exactly_one_other_takes_over_woken_by_its_exit()
 {
    let setup = Setup::new();
    let _driver = FakeDriver::start(&setup.csi, DRIVER);
    let (socket, names) = registry_with_log(&setup);
    let mut first = registrar(&setup, "first registrar");
    until_served(&socket).await;
    let (second, third) = (
        registrar(&setup, "second registrar"),
        registrar(&setup, "third registrar"),
    );
    until_logged(&second, STANDING_BY).await;
    until_logged(&third, STANDING_BY).await;
    names
        .until("+", "the first one's socket, untouched by the others")
        .await;

    // SIGKILL: no clean-up, the socket stays behind, stale.
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    let took = until_served(&socket).await;
    assert_eq!(get_info(&socket).await.as_deref(), Some(DRIVER));
    assert!(
        took < TAKEOVER,
        "took over {took:?} after the holder's death"
    );
    let (mut taker, waiter) = match second.stderr().contains(TOOK_OVER) {
        true => (second, third),
        false => (third, second),
    };
    until_logged(&taker, SERVING).await;
    assert!(!waiter.stderr().contains(TOOK_OVER), "{}", waiter.stderr());
    names
        .until(
            "+-+",
            "the stale socket removed once, one new socket in its place",
        )
        .await;

    // SIGTERM: the taker removes its own socket on its way out; the last one takes over.
    common::send_signal(&taker.0, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(common::wait_exit(&mut taker.0, WAIT).code(), Some(0));
    let took = until_served(&socket).await;
    assert!(
        took < TAKEOVER,
        "took over {took:?} after the holder's exit"
    );
    until_logged(&waiter, TOOK_OVER).await;
    names
        .until(
            "+-+-+",
            "each socket removed once, by its owner or as stale",
        )
        .await;
    let everyone = [&taker, &waiter];
    assert_eq!(count(&everyone, "removing stale socket"), 1);
    assert_eq!(
        count(&everyone, "deleted or replaced"),
        0,
        "no one lost its socket"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_registrars_started_together_on_a_stale_socket_leave_one_serving_and_one_standing_by() {
    let setup = Setup::new();
    let _driver = FakeDriver::start(&setup.csi, DRIVER);
    let (socket, names) = registry_with_log(&setup);
    // A registrar killed without clean-up left its socket: nobody listens on it.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let mut expected = String::from("+");
    names.until(&expected, "the stale socket").await;
    for round in 0..5 {
        let pair = [
            registrar(&setup, "one registrar"),
            registrar(&setup, "another registrar"),
        ];
        until_served(&socket).await;
        let standing_by = |p: &KillOnDrop| p.stderr().contains(STANDING_BY);
        assert!(
            wait_until(WAIT, || pair.iter().any(standing_by)).await,
            "round {round}: neither stands by"
        );
        let (waiting, serving) = match standing_by(&pair[0]) {
            true => (&pair[0], &pair[1]),
            false => (&pair[1], &pair[0]),
        };
        until_logged(serving, SERVING).await;
        assert!(
            !waiting.stderr().contains(SERVING),
            "round {round}: both serve"
        );
        assert_eq!(get_info(&socket).await.as_deref(), Some(DRIVER));
        expected.push_str("-+");
        names
            .until(
                &expected,
                &format!("round {round}: stale socket removed once, one bound"),
            )
            .await;
        assert_eq!(count(&[&pair[0], &pair[1]], "removing stale socket"), 1);
        // Both die by SIGKILL, the one standing by first (else it would take over): the next
        // round starts on a stale socket again.
        let waiting_first = match standing_by(&pair[0]) {
            true => pair,
            false => {
                let [a, b] = pair;
                [b, a]
            }
        };
        drop(waiting_first);
        assert!(
            csi_nodekit::socket::identity_of(&socket).is_some(),
            "round {round}: SIGKILL left the socket"
        );
    }
    assert_eq!(
        names.seen(),
        expected,
        "nothing else happened to the socket"
    );
}
