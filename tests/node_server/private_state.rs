//! The state directory is root-only whatever the umask: node-server started under `umask 000`,
//! every path under `--state-dir` checked, and what an unprivileged user (uid 65534) can do.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::csi_node;
use crate::common::{self, KillOnDrop, spawn, wait_until};

/// node-server with umask 000, its socket in a directory it has to create.
pub(crate) fn node_server_with_umask_000(socket: &Path, state: &Path) -> KillOnDrop {
    let mut command = Command::new(common::binary());
    command
        .arg("node-server")
        .arg(format!("--endpoint=unix://{}", socket.display()))
        .arg(format!("--state-dir={}", state.display()))
        .arg("--node-id=node-a")
        .arg("--quota=off");
    // SAFETY: umask(2) is async-signal-safe and touches nothing but the child's mask.
    unsafe {
        command.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    spawn(&mut command, "node-server")
}

/// Every path under `state` with its mode, not entering volumes' and snapshots' own trees
/// (theirs are the pods' files): the volume and snapshot roots themselves are listed.
pub(crate) fn modes(state: &Path) -> BTreeMap<PathBuf, u32> {
    let mut found = BTreeMap::new();
    let mut todo = vec![state.to_owned()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let relative = path.strip_prefix(state).unwrap().to_owned();
            found.insert(relative, meta.permissions().mode() & 0o7777);
            let pods_tree = dir.ends_with("volumes") || dir.ends_with("snapshots");
            if meta.is_dir() && !pods_tree {
                todo.push(path);
            }
        }
    }
    found
}

/// Whether `script` succeeds run by `sh` as uid and gid 65534.
pub(crate) fn nobody_can(script: &str) -> bool {
    Command::new("/bin/sh")
        .args(["-c", script])
        .uid(65534)
        .gid(65534)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run sh as nobody")
        .success()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: runs sh as uid 65534"]
async fn under_umask_000_everything_but_the_volume_roots_is_root_only_and_nobody_gets_in() {
    let dir = tempfile::tempdir().unwrap();
    // Reachable by nobody down to the state directory, so that only its own modes decide.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = dir.path().join("state");
    let socket = dir.path().join("plugin/csi.sock");
    let server = node_server_with_umask_000(&socket, &state);
    let up = wait_until(Duration::from_secs(10), || common::is_socket(&socket)).await;
    assert!(up, "{}", server.stderr());
    let mut csi = csi_node::connect(&socket).await;
    let volume = csi_node::create(&mut csi, "pvc-private", 1 << 20).await;
    std::fs::write(state.join("volumes").join(&volume).join("data"), b"kept").unwrap();
    let snapshot = csi.snapshot("snap-private", &volume).await.snapshot_id;

    let found = modes(&state);
    let volume_root = PathBuf::from("volumes").join(&volume);
    let snapshot_root = PathBuf::from("snapshots").join(&snapshot);
    for (path, mode) in &found {
        let meta = std::fs::symlink_metadata(state.join(path)).unwrap();
        let expected = if *path == volume_root || *path == snapshot_root {
            0o777 // the volume's rootMode, and the snapshot's copy of it
        } else if meta.is_dir() {
            0o700
        } else {
            0o600
        };
        assert_eq!(
            *mode,
            expected,
            "{}: {mode:04o}\n{found:#?}",
            path.display()
        );
    }
    let names: Vec<_> = found.keys().map(|p| p.display().to_string()).collect();
    let expected = [
        "group-meta".to_owned(),
        "meta".to_owned(),
        format!("meta/{volume}.json"),
        "node-server.lock".to_owned(),
        "reserve".to_owned(),
        "snapshot-meta".to_owned(),
        format!("snapshot-meta/{snapshot}.json"),
        "snapshots".to_owned(),
        format!("snapshots/{snapshot}"),
        "volumes".to_owned(),
        format!("volumes/{volume}"),
    ];
    assert_eq!(
        names, expected,
        "every path under the state directory was checked"
    );
    let state_mode = std::fs::metadata(&state).unwrap().permissions().mode() & 0o7777;
    assert_eq!(state_mode, 0o700);
    let parent = std::fs::metadata(socket.parent().unwrap()).unwrap();
    assert_eq!(
        parent.permissions().mode() & 0o7777,
        0o755,
        "the socket's parent"
    );

    let state = state.display();
    assert!(nobody_can("true"), "nobody cannot even run sh");
    assert!(!nobody_can(&format!("ls {state}")));
    assert!(!nobody_can(&format!("cat {state}/meta/{volume}.json")));
    assert!(!nobody_can(&format!(
        "touch {state}/volumes/{volume}/intruder"
    )));
    assert!(!nobody_can(&format!(
        "touch {state}/snapshots/{snapshot}/intruder"
    )));
    assert!(!nobody_can(&format!("cat {state}/volumes/{volume}/data")));
    assert!(!nobody_can(&format!("touch {state}/node-server.lock")));
}

/// The state directory and its inner directories at `mode`, as an older node-server made them.
pub(crate) fn loosened(state: &Path, mode: u32) {
    for sub in STATE_DIRS {
        std::fs::create_dir_all(state.join(sub)).unwrap();
        let loose = std::fs::Permissions::from_mode(mode);
        std::fs::set_permissions(state.join(sub), loose).unwrap();
    }
    // Files an older version left as loose as its umask allowed (0644 beside 0755).
    for file in LOOSE_FILES {
        std::fs::write(state.join(file), b"").unwrap();
        let loose = std::fs::Permissions::from_mode(mode & 0o666);
        std::fs::set_permissions(state.join(file), loose).unwrap();
    }
}

/// Files [`loosened`] leaves behind: the lock file, and a file in a record directory.
const LOOSE_FILES: [&str; 2] = ["node-server.lock", "meta/left-by-an-older-version"];

/// The state directory and the directories node-server keeps inside it.
const STATE_DIRS: [&str; 6] = [
    "",
    "meta",
    "volumes",
    "snapshots",
    "snapshot-meta",
    "group-meta",
];

#[test]
fn a_state_directory_and_its_files_left_0755_and_0644_by_an_older_node_server_are_tightened_with_one_line()
 {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    loosened(&state, 0o755);
    let socket = dir.path().join("csi.sock");
    let server = common::spawn_node_server(&socket, &state, &["--node-id=node-a"]);
    let up = common::wait_until_blocking(Duration::from_secs(10), || common::is_socket(&socket));
    assert!(up, "{}", server.stderr());
    let logs = server.stderr();
    let lines: Vec<_> = logs
        .lines()
        .filter(|l| l.contains("made root-only"))
        .collect();
    assert_eq!(lines.len(), 1, "{logs}");
    assert!(lines[0].contains("(0755 to 0700)"), "{}", lines[0]);
    assert!(lines[0].contains("2 file(s) (0600)"), "{}", lines[0]);
    let mode = |path: &str| {
        std::fs::metadata(state.join(path))
            .unwrap()
            .permissions()
            .mode()
    };
    for sub in STATE_DIRS {
        assert_eq!(mode(sub) & 0o7777, 0o700, "{sub}");
    }
    for file in LOOSE_FILES {
        assert_eq!(mode(file) & 0o7777, 0o600, "{file}");
    }
}
