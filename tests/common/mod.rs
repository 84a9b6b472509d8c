//! Helpers shared by the integration tests: the real binary, temp dirs, waiting on sockets.
#![allow(dead_code)]

use std::io::Read;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The binary cargo built for this test run.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_csi-nodekit"))
}

/// A symlink to the binary under another name, in `dir`.
pub fn symlink_as(dir: &Path, name: &str) -> PathBuf {
    let link = dir.join(name);
    std::os::unix::fs::symlink(binary(), &link).expect("create symlink");
    link
}

/// A loopback address with a port that was free a moment ago, for a process under test to
/// listen on (the small race with other processes is acceptable on a test machine).
pub fn free_local_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").to_string()
}

/// Polls `check` every 10 ms until it yields a value or `limit` passes: the one waiting loop
/// of the tests (it sleeps asynchronously, so in-process servers on the same runtime go on).
pub async fn eventually<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// [`eventually`] for a yes-or-no condition.
pub async fn wait_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    eventually(limit, || check().then_some(())).await.is_some()
}

/// [`wait_until`] for a test that runs no runtime of its own.
pub fn wait_until_blocking(limit: Duration, check: impl FnMut() -> bool) -> bool {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime to wait on")
        .block_on(wait_until(limit, check))
}

pub fn is_socket(path: &Path) -> bool {
    std::fs::symlink_metadata(path)
        .map(|m| m.file_type().is_socket())
        .unwrap_or(false)
}

/// Waits for a process to exit, killing it if it takes longer than `limit`.
pub fn wait_exit(child: &mut Child, limit: Duration) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("process {} did not exit within {limit:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn send_signal(child: &Child, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal)
        .expect("send signal");
}

/// Starts `csi-nodekit node-server` on `socket` with its state in `state_dir`.
/// Unless `extra` says otherwise, `--quota=off`: tests on this machine (no project quotas) make
/// directory volumes whose sizes they know do not hold, which `--quota=auto` refuses.
pub fn spawn_node_server(socket: &Path, state_dir: &Path, extra: &[&str]) -> KillOnDrop {
    let quota = (!extra.iter().any(|f| f.starts_with("--quota="))).then_some("--quota=off");
    spawn(
        Command::new(binary())
            .arg("node-server")
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .arg(format!("--state-dir={}", state_dir.display()))
            .args(quota)
            .args(extra),
        "node-server",
    )
}

/// One GET of `path` on `address` (within 10 s): the status and the body.
pub async fn http_get(address: &str, path: &str) -> (u16, String) {
    csi_nodekit::http::get(address, path, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("GET {path} on {address}: {e}"))
}

/// Starts `livenessprobe` (through a symlink, as the upstream image's entry point) on a free
/// port, once it listens.
pub async fn start_livenessprobe(dir: &Path, csi: &Path, extra: &[&str]) -> (KillOnDrop, String) {
    let address = free_local_address();
    let child = spawn(
        Command::new(symlink_as(dir, "livenessprobe"))
            .arg(format!("--csi-address={}", csi.display()))
            .arg(format!("--http-endpoint={address}"))
            .args(extra),
        "livenessprobe",
    );
    let up = wait_until(Duration::from_secs(10), || {
        std::net::TcpStream::connect(&address).is_ok()
    })
    .await;
    assert!(up, "livenessprobe never listened");
    (child, address)
}

/// A server that accepts connections on `path` and never answers, holding them open: a hung
/// driver or registration socket. With `forward_to`, only the first connection hangs and later
/// ones reach that socket: a driver that wedged one connection while its socket stayed the
/// same.
pub fn hung_listener(path: &Path, forward_to: Option<PathBuf>) -> tokio::task::JoinHandle<()> {
    hung_listener_counting(path, forward_to, Arc::default())
}

/// [`hung_listener`] that counts the connections it accepted in `accepted`: the gate for "a
/// caller is now waiting on it".
pub fn hung_listener_counting(
    path: &Path,
    forward_to: Option<PathBuf>,
    accepted: Arc<std::sync::atomic::AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::UnixListener::bind(path).expect("bind the hung listener");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut stream, _)) = listener.accept().await {
            accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            match &forward_to {
                Some(real) if !held.is_empty() => {
                    let mut upstream = tokio::net::UnixStream::connect(real).await.unwrap();
                    tokio::spawn(async move {
                        let _ = tokio::io::copy_bidirectional(&mut stream, &mut upstream).await;
                    });
                }
                _ => held.push(stream),
            }
        }
    })
}

/// Runs `csi-nodekit node-server` to its exit (for the ways it refuses to start).
pub fn node_server_output(socket: &Path, state_dir: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(binary())
        .arg("node-server")
        .arg(format!("--endpoint=unix://{}", socket.display()))
        .arg(format!("--state-dir={}", state_dir.display()))
        .args(extra)
        .output()
        .expect("run node-server")
}

/// Starts a process of the binary (or anything else) for a test: no stdin, its stderr (its
/// logs) captured for the test, see [`KillOnDrop`].
pub fn spawn(command: &mut Command, what: &str) -> KillOnDrop {
    let child = command
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    KillOnDrop::new(child)
}

/// A child process owned by a test. Its stderr, if piped, is read into a buffer that is shown
/// only when the test fails (a passing run prints no server logs); dropping the guard kills
/// the process, so a failing test leaves none behind.
pub struct KillOnDrop(pub Child, Captured);

/// What a child wrote to stderr, read on a thread of its own.
pub struct Captured {
    text: Arc<Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl KillOnDrop {
    pub fn new(mut child: Child) -> Self {
        remember_panic_messages();
        let text = Arc::new(Mutex::new(Vec::new()));
        let reader = child.stderr.take().map(|mut stderr| {
            let text = text.clone();
            std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n @ 1..) = stderr.read(&mut chunk) {
                    text.lock().unwrap().extend_from_slice(&chunk[..n]);
                }
            })
        });
        Self(child, Captured { text, reader })
    }

    /// What the process has written to stderr so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.1.text.lock().unwrap()).into_owned()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        if let Some(reader) = self.1.reader.take() {
            let _ = reader.join();
        }
        if std::thread::panicking() {
            eprintln!(
                "---- stderr of process {} ----\n{}---- end of stderr ----",
                self.0.id(),
                self.stderr()
            );
            // Logs and a backtrace push the panic's own message out of a CI log's tail.
            PANIC_MESSAGE.with(|message| {
                eprintln!("---- the test failed: {} ----", message.borrow());
            });
        }
    }
}

thread_local! {
    /// The message of this thread's panic, for [`KillOnDrop`] to repeat after the logs.
    static PANIC_MESSAGE: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Wraps the panic hook (once per test process) so each thread's panic message is kept.
fn remember_panic_messages() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info
                .payload()
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            let at = info
                .location()
                .map(|l| format!(" at {l}"))
                .unwrap_or_default();
            PANIC_MESSAGE.with(|kept| *kept.borrow_mut() = format!("{message}{at}"));
            default(info);
        }));
    });
}
pub mod csi_block;
pub mod csi_node;
pub mod csi_snapshots;
pub mod doctor;
#[cfg(feature = "kube-api")]
pub mod fake_api;
pub mod fake_driver;
pub mod fake_plugin;
pub mod held_call;
pub mod kubelet;
pub mod logs;
pub mod raw_h2;
pub mod registrar;
pub mod scratch_fs;
pub mod tree_fixture;
pub mod upstream_registrar;
