//! A careless or hostile caller's paths, through the real binary on real bind mounts: each
//! Node call given the other call's path, a neighbour's empty directories and files offered to
//! NodeUnpublishVolume, symlinks planted in world-writable directories, and targets inside
//! another volume's mounts. Refused with the spec's code, and nothing touched.

use std::os::unix::fs::PermissionsExt;

use super::tally::{Outcome, Tally};
use crate::common::csi_node::*;
use crate::common::{KillOnDrop, spawn_node_server};
use tonic::Code;

async fn served(sandbox: &MountSandbox) -> (KillOnDrop, Csi) {
    let socket = sandbox.path().join("csi.sock");
    let process = spawn_node_server(&socket, &sandbox.path().join("state"), &[]);
    assert!(super::processes::probe_ready(&socket).await, "node-server");
    (process, connect(&socket).await)
}

fn answer<T>(result: Result<tonic::Response<T>, tonic::Status>) -> Code {
    match result {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

const ROUNDS: usize = 5;

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_given_another_calls_or_a_neighbours_path_is_refused_and_touches_nothing() {
    let sandbox = MountSandbox::new();
    let (_process, mut csi) = served(&sandbox).await;
    let mut tally = Tally::new(
        "Node calls given the other call's path, a neighbour's files, planted symlinks, a target \
         inside another volume",
    );
    for round in 0..ROUNDS {
        let id = create(&mut csi, &format!("pvc-paths-{round}"), 1 << 20).await;
        let other = create(&mut csi, &format!("pvc-paths-other-{round}"), 1 << 20).await;
        let staging = sandbox.dir(&format!("r{round}/plugins/globalmount"));
        let target = sandbox.dir(&format!("r{round}/pods")).join("mount");
        csi.stage_and_publish(&id, &staging, &target, false).await;
        std::fs::write(target.join("data"), b"kept").unwrap();
        let neighbour_dir = sandbox.dir(&format!("r{round}/neighbour/dir"));
        let neighbour_file = neighbour_dir.with_file_name("file");
        std::fs::write(&neighbour_file, b"").unwrap();
        let open = sandbox.dir(&format!("r{round}/open"));
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let victim = sandbox.dir(&format!("r{round}/victim"));
        std::os::unix::fs::symlink(&victim, open.join("link")).unwrap();
        let planted = open.join("link/mount");

        let n = &mut csi.node;
        let tries: Vec<(&str, Code, Code)> = vec![
            (
                "unpublish at the staging path",
                answer(
                    n.node_unpublish_volume(unpublish_request(&id, &staging))
                        .await,
                ),
                Code::InvalidArgument,
            ),
            (
                "unpublish at the staging path, as another volume",
                answer(
                    n.node_unpublish_volume(unpublish_request(&other, &staging))
                        .await,
                ),
                Code::InvalidArgument,
            ),
            (
                "unstage at the target path",
                answer(n.node_unstage_volume(unstage_request(&id, &target)).await),
                Code::InvalidArgument,
            ),
            (
                "stage another volume onto the target",
                answer(n.node_stage_volume(stage_request(&other, &target)).await),
                Code::InvalidArgument,
            ),
            (
                "unpublish a neighbour's empty directory",
                answer(
                    n.node_unpublish_volume(unpublish_request(&other, &neighbour_dir))
                        .await,
                ),
                Code::Ok,
            ),
            (
                "unpublish a neighbour's empty file, unknown volume",
                answer(
                    n.node_unpublish_volume(unpublish_request("vol-x", &neighbour_file))
                        .await,
                ),
                Code::Ok,
            ),
            (
                "publish through a planted symlink",
                answer(
                    n.node_publish_volume(publish_request(&id, &staging, &planted, false))
                        .await,
                ),
                Code::FailedPrecondition,
            ),
            (
                "publish another volume inside this one's target",
                answer(
                    n.node_publish_volume(publish_request(
                        &other,
                        &staging,
                        &target.join("t"),
                        false,
                    ))
                    .await,
                ),
                Code::InvalidArgument,
            ),
        ];
        let intact = is_mounted(&staging)
            && is_mounted(&target)
            && std::fs::read(target.join("data")).is_ok_and(|d| d == b"kept")
            && neighbour_dir.is_dir()
            && neighbour_file.is_file()
            && !victim.join("mount").exists()
            && !target.join("t").exists();
        for (what, got, want) in tries {
            let outcome = match (intact, got == want) {
                (false, _) => Outcome::Lost,
                (true, true) => Outcome::Survived,
                (true, false) => Outcome::Failed,
            };
            tally.record(
                outcome,
                format_args!("round {round}, {what}: {got:?}, want {want:?}"),
            );
        }
        csi.unpublish_and_unstage(&id, &target, &staging).await;
        let cleaned = !target.exists() && staging.is_dir() && !is_mounted(&staging);
        tally.check(
            cleaned,
            format_args!("round {round}: the right calls still work"),
        );
    }
    tally.finish();
}
