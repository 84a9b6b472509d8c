//! node-server started under `umask 000`, on a fresh state directory or on one an older
//! version (or a careless operator) left 0755, 0775 or 0777: every path under the state
//! directory root-only but the volume and snapshot roots (their `rootMode`), a loose directory
//! tightened with one log line, the socket's parent not writable by others, and uid 65534
//! unable to read a record or write into a volume or a snapshot.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::processes::BACK_WITHIN;
use super::tally::Tally;
use crate::common::{self, csi_node, wait_until};
use crate::node_server::private_state::{loosened, modes, nobody_can, node_server_with_umask_000};

/// What the state directory is before the start: absent, or left at a loose mode.
const STARTS: [Option<u32>; 4] = [None, Some(0o755), Some(0o775), Some(0o777)];
const ROUNDS: usize = 2;

/// The paths under `state` whose mode is not what private state asks (`roots` keep theirs).
fn wrong_modes(state: &Path, roots: &[PathBuf]) -> Vec<String> {
    let mut wrong = Vec::new();
    let state_mode = std::fs::metadata(state).unwrap().permissions().mode() & 0o7777;
    if state_mode != 0o700 {
        wrong.push(format!("the state directory: {state_mode:04o}"));
    }
    for (path, mode) in modes(state) {
        let dir = std::fs::symlink_metadata(state.join(&path))
            .unwrap()
            .is_dir();
        let expected = match () {
            _ if roots.contains(&path) => 0o777,
            _ if dir => 0o700,
            _ => 0o600,
        };
        if mode != expected {
            wrong.push(format!("{}: {mode:04o}", path.display()));
        }
    }
    wrong
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: runs sh as uid 65534"]
async fn under_umask_000_fresh_and_loose_state_directories_end_root_only() {
    let mut tally = Tally::new("private state under umask 000");
    for round in 0..ROUNDS {
        for start in STARTS {
            let dir = tempfile::tempdir().unwrap();
            // Reachable by nobody down to the state directory: only its own modes decide.
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            let state = dir.path().join("state");
            if let Some(mode) = start {
                loosened(&state, mode);
            }
            let socket = dir.path().join("plugin/csi.sock");
            let server = node_server_with_umask_000(&socket, &state);
            let before = start.map_or("absent".to_owned(), |m| format!("{m:04o}"));
            let what = format!("round {round}, state directory {before}");
            if !wait_until(BACK_WITHIN, || common::is_socket(&socket)).await {
                tally.check(
                    false,
                    format_args!("{what}: never served\n{}", server.stderr()),
                );
                continue;
            }
            let mut csi = csi_node::connect(&socket).await;
            let volume = csi_node::create(&mut csi, &format!("pvc-private-{round}"), 1 << 20).await;
            let data = state.join("volumes").join(&volume).join("data");
            std::fs::write(&data, b"kept").unwrap();
            let snapshot = csi
                .snapshot(&format!("snap-private-{round}"), &volume)
                .await;
            let snapshot = snapshot.snapshot_id;
            let roots = [
                PathBuf::from("volumes").join(&volume),
                PathBuf::from("snapshots").join(&snapshot),
            ];
            let wrong = wrong_modes(&state, &roots);
            let parent = std::fs::metadata(socket.parent().unwrap()).unwrap();
            let parent_mode = parent.permissions().mode() & 0o7777;
            let lines = |logs: &str| {
                logs.lines()
                    .filter(|l| l.contains("made root-only"))
                    .count()
            };
            let wanted_lines = usize::from(start.is_some());
            let logged = wait_until(BACK_WITHIN, || lines(&server.stderr()) >= wanted_lines).await
                && lines(&server.stderr()) == wanted_lines;
            let s = state.display();
            let intruded: Vec<_> = [
                format!("ls {s}"),
                format!("cat {s}/meta/{volume}.json"),
                format!("cat {}", data.display()),
                format!("touch {s}/volumes/{volume}/intruder"),
                format!("touch {s}/snapshots/{snapshot}/intruder"),
            ]
            .into_iter()
            .filter(|script| nobody_can(script))
            .collect();
            tally.check(
                wrong.is_empty() && parent_mode & 0o022 == 0 && logged && intruded.is_empty(),
                format_args!(
                    "{what}: modes off {wrong:?}, socket parent {parent_mode:04o}, \
                     {} 'made root-only' lines (want {wanted_lines}), nobody could {intruded:?}",
                    lines(&server.stderr())
                ),
            );
        }
    }
    assert!(
        nobody_can("true"),
        "nobody cannot even run sh: the test tried nothing"
    );
    tally.note(format_args!(
        "fresh, 0755, 0775 and 0777 state directories, {ROUNDS} rounds"
    ));
    tally.finish();
}
