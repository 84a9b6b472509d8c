//! A state filesystem filled to the last block (a pod's volume on a node without enforced
//! sizes, or a file moved out of its project): DeleteVolume, the one call that frees it, still
//! answers OK and frees it, through the room node-server keeps for its records; then a new
//! volume can be made. (Before: INTERNAL, its `deleting` mark could not be written, 3 of 3.)

use std::io::Write;

use super::processes::{self, DRIVER, Node};
use super::tally::Tally;
use crate::common::csi_node::{self, delete_request};
use crate::common::scratch_fs::{Kind, ScratchFs};
use crate::common::spawn_node_server;

const ROUNDS: usize = 3;

/// Writes into `path` until the filesystem refuses; the bytes written.
fn fill(path: &std::path::Path) -> u64 {
    let mut file = std::fs::File::create(path).expect("a file to fill with");
    let chunk = vec![0x11u8; 64 << 10];
    let mut written = 0;
    while let Ok(n) = file.write(&chunk) {
        if n == 0 {
            break;
        }
        written += n as u64;
    }
    written
}

/// Makes empty files in `dir` until the filesystem refuses; how many.
fn flood(dir: &std::path::Path) -> u64 {
    let mut made = 0;
    while std::fs::File::create(dir.join(format!("f{made}"))).is_ok() {
        made += 1;
    }
    made
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: a small tmpfs for the state directory"]
async fn a_full_state_filesystem_still_lets_delete_volume_free_it() {
    let what = "DeleteVolume on a state filesystem filled to the last block";
    full_state_filesystem(what, "size=24m", fill).await;
}

/// As a pod's flood of empty files that escaped its volume's limits leaves it (ext4 in the
/// quota VM ran out of its 32,768 inodes so): DeleteVolume's mark needs an inode too. (Before:
/// INTERNAL, the reserve freed its blocks but kept its inode.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: a small tmpfs for the state directory"]
async fn a_state_filesystem_out_of_inodes_still_lets_delete_volume_free_it() {
    let flood_in = |file: &std::path::Path| flood(file.parent().unwrap());
    let what = "DeleteVolume on a state filesystem out of inodes";
    full_state_filesystem(what, "size=24m,nr_inodes=400", flood_in).await;
}

/// Three rounds of: a volume, `exhaust` run in it (given a file path in its directory) until
/// the state filesystem refuses, DeleteVolume, a new volume.
async fn full_state_filesystem(
    what: &'static str,
    options: &str,
    exhaust: impl Fn(&std::path::Path) -> u64,
) {
    let fs = ScratchFs::with_options(Kind::Tmpfs, options);
    let node = Node::new();
    let (socket, state) = (node.csi(), fs.path().join("state"));
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    let driver = format!("--driver-name={DRIVER}");
    let server = spawn_node_server(
        &socket,
        &state,
        &[&driver, "--node-id=node-a", "--overcommit"],
    );
    assert!(processes::probe_ready(&socket).await, "{}", server.stderr());
    let mut csi = csi_node::connect(&socket).await;
    let mut tally = Tally::new(what);
    for round in 0..ROUNDS {
        let id = csi_node::create(&mut csi, &format!("pvc-full-{round}"), 4 << 20).await;
        let dir = state.join("volumes").join(&id);
        let filled = exhaust(&dir.join("fill"));
        let answer = csi.controller.delete_volume(delete_request(&id)).await;
        let gone = !dir.exists();
        let again = (csi.controller)
            .create_volume(csi_node::create_request(
                &format!("pvc-after-{round}"),
                4 << 20,
            ))
            .await;
        let made = again
            .as_ref()
            .map(|r| r.get_ref().volume.clone().unwrap_or_default().volume_id);
        tally.check(
            answer.is_ok() && gone && made.is_ok(),
            format_args!(
                "round {round}: {filled} bytes or files filled it; DeleteVolume {answer:?}, its directory \
                 gone {gone}; a new volume then {made:?}"
            ),
        );
        if let Ok(made) = made {
            let _ = csi.controller.delete_volume(delete_request(&made)).await;
        }
    }
    let reserve = std::fs::metadata(state.join("reserve")).map(|m| m.len());
    tally.note(format_args!("the reserve afterwards: {reserve:?} bytes"));
    assert_eq!(reserve.ok(), Some(1 << 20), "the reserve is taken again");
    tally.finish();
}
