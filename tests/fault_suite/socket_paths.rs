//! What is found at a socket path: a file, a directory, a symlink or another program's live
//! socket is never removed, and the mode refuses to serve there; a stale socket (nothing
//! listening, left by a crash) is taken over.

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

use super::processes::{self, Node};
use super::tally::{Outcome, Tally};
use crate::common::{free_local_address, spawn};

#[derive(Debug, Clone, Copy)]
enum Found {
    File,
    Directory,
    Symlink,
    LiveSocket,
    StaleSocket,
}

const ALL: [Found; 5] = [
    Found::File,
    Found::Directory,
    Found::Symlink,
    Found::LiveSocket,
    Found::StaleSocket,
];

/// Puts `found` at `path`; a live socket's listener is returned, to be kept open.
fn stage(found: Found, path: &Path) -> Option<UnixListener> {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    match found {
        Found::File => std::fs::write(path, b"not yours").unwrap(),
        Found::Directory => {
            std::fs::create_dir(path).unwrap();
            std::fs::write(path.join("inside"), b"not yours").unwrap();
        }
        Found::Symlink => {
            let elsewhere = path.with_extension("elsewhere");
            std::fs::write(&elsewhere, b"not yours").unwrap();
            std::os::unix::fs::symlink(&elsewhere, path).unwrap();
        }
        Found::LiveSocket => return Some(UnixListener::bind(path).unwrap()),
        Found::StaleSocket => drop(UnixListener::bind(path).unwrap()),
    }
    None
}

/// Whether what [`stage`] put at `path` is still there, unchanged.
fn kept(found: Found, path: &Path) -> bool {
    match found {
        Found::File => std::fs::read(path).is_ok_and(|b| b == b"not yours"),
        Found::Directory => std::fs::read(path.join("inside")).is_ok_and(|b| b == b"not yours"),
        Found::Symlink => {
            std::fs::read_link(path).is_ok_and(|t| t == path.with_extension("elsewhere"))
                && std::fs::read(path).is_ok_and(|b| b == b"not yours")
        }
        Found::LiveSocket => UnixStream::connect(path).is_ok(),
        Found::StaleSocket => true,
    }
}

async fn node_server_at(found: Found) -> Outcome {
    let node = Node::new();
    let _listener = stage(found, &node.csi());
    let mut process = spawn(&mut node.node_server_command(), "node-server");
    let outcome = match found {
        Found::StaleSocket if processes::probe_ready(&node.csi()).await => Outcome::Survived,
        Found::StaleSocket => Outcome::Failed,
        _ if !kept(found, &node.csi()) => Outcome::Lost,
        _ if processes::refused(&mut process, processes::BACK_WITHIN).await => Outcome::Survived,
        _ => Outcome::Failed,
    };
    // Checked again once it has exited: nothing removed on the way out either.
    if outcome == Outcome::Survived && !kept(found, &node.csi()) {
        return Outcome::Lost;
    }
    outcome
}

async fn registrar_at(found: Found) -> Outcome {
    let node = Node::new();
    let Some(_driver) = node.node_server().await else {
        return Outcome::Failed;
    };
    let _listener = stage(found, &node.reg_socket());
    let http = free_local_address();
    let mut process = spawn(&mut node.registrar_command(&http), "registrar");
    if let Found::StaleSocket = found {
        return match processes::registered(&node.reg_socket()).await {
            true => Outcome::Survived,
            false => Outcome::Failed,
        };
    }
    // It refuses, or (for a socket another program serves) keeps retrying without touching
    // it; either way it never serves there.
    let gave_up = processes::refused(&mut process, Duration::from_secs(3)).await;
    let ours = processes::get_info(&node.reg_socket()).await.is_some();
    match () {
        _ if !kept(found, &node.reg_socket()) => Outcome::Lost,
        _ if ours => Outcome::Failed,
        _ if gave_up || matches!(found, Found::LiveSocket) => Outcome::Survived,
        _ => Outcome::Failed,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_is_found_at_a_socket_path_is_kept_unless_it_is_a_stale_socket() {
    let mut tally =
        Tally::new("files, directories, symlinks and live or stale sockets at a socket path");
    for found in ALL {
        tally.record(
            node_server_at(found).await,
            format_args!("node-server, {found:?}"),
        );
        tally.record(
            registrar_at(found).await,
            format_args!("registrar, {found:?}"),
        );
    }
    tally.finish();
}
