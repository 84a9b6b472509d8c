//! Helpers shared by the integration tests: the real binary, temp dirs, waiting on sockets.
#![allow(dead_code)]

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
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

/// Polls `check` every 20 ms until it is true or `limit` passes.
pub fn wait_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check()
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
pub fn spawn_node_server(socket: &Path, state_dir: &Path, extra: &[&str]) -> Child {
    Command::new(binary())
        .arg("node-server")
        .arg(format!("--endpoint=unix://{}", socket.display()))
        .arg(format!("--state-dir={}", state_dir.display()))
        .args(extra)
        .stdin(Stdio::null())
        .spawn()
        .expect("start node-server")
}

/// Kills a child on drop so a failing test leaves no process behind.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
pub mod csi_node;
pub mod fake_driver;
pub mod fake_plugin;
pub mod kubelet;
