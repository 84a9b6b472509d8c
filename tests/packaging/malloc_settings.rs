//! The image's `GLIBC_TUNABLES` (`packaging/Containerfile`): one malloc arena and no per-thread
//! caches. glibc ignores a tunable it does not know without a word, so a misspelt one would
//! quietly give the memory back: checked here on what glibc does, node-server's own mappings.

use std::process::Command;

use csi_nodekit::proto::csi::GetPluginInfoRequest;
use csi_nodekit::proto::csi::identity_client::IdentityClient;

use crate::common;

/// The value the Containerfile sets.
pub(super) fn image_tunables() -> String {
    let containerfile = concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/Containerfile");
    let text = std::fs::read_to_string(containerfile).expect("read the Containerfile");
    text.lines()
        .find_map(|l| l.strip_prefix("ENV GLIBC_TUNABLES="))
        .expect("the Containerfile sets GLIBC_TUNABLES")
        .to_owned()
}

/// The malloc arenas of `pid` besides the main one: glibc gives each its own heap, reserved
/// 64 MiB at a 64 MiB boundary, the part in use read-write and the rest `---p` after it.
fn thread_arenas(pid: u32) -> usize {
    const HEAP: u64 = 64 << 20;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("read maps");
    let anonymous: Vec<(u64, u64, &str)> = maps
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() != 5 {
                return None; // a file, or a named region such as [heap] or [stack]
            }
            let (start, end) = fields[0].split_once('-')?;
            let start = u64::from_str_radix(start, 16).ok()?;
            let end = u64::from_str_radix(end, 16).ok()?;
            Some((start, end, fields[1]))
        })
        .collect();
    anonymous
        .windows(2)
        .filter(|pair| {
            let ((start, end, used), (next, last, rest)) = (pair[0], pair[1]);
            start % HEAP == 0
                && used == "rw-p"
                && next == end
                && rest == "---p"
                && last == start + HEAP
        })
        .count()
}

/// node-server with `tunables` (None: glibc's defaults), after calls on several connections at
/// once have run on both of its workers and its blocking threads: its thread arenas.
async fn arenas_after_calls(tunables: Option<&str>) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let mut command = Command::new(common::binary());
    command
        .arg("node-server")
        .arg(format!("--endpoint=unix://{}", socket.display()))
        .arg(format!(
            "--state-dir={}",
            dir.path().join("state").display()
        ))
        .env_remove("GLIBC_TUNABLES");
    if let Some(tunables) = tunables {
        command.env("GLIBC_TUNABLES", tunables);
    }
    let server = common::spawn(&mut command, "node-server");
    let up = common::wait_until(std::time::Duration::from_secs(10), || {
        common::is_socket(&socket)
    })
    .await;
    assert!(up, "no socket: {}", server.stderr());
    let calls = (0..16).map(|_| {
        let socket = socket.clone();
        tokio::spawn(async move {
            let channel = csi_nodekit::socket::connect(&socket)
                .await
                .expect("connect");
            let mut client = IdentityClient::new(channel);
            for _ in 0..20 {
                client
                    .get_plugin_info(GetPluginInfoRequest {})
                    .await
                    .expect("GetPluginInfo");
            }
        })
    });
    for call in calls.collect::<Vec<_>>() {
        call.await.expect("client");
    }
    thread_arenas(server.0.id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_the_images_malloc_settings_node_server_keeps_one_arena_where_glibcs_defaults_give_its_threads_their_own()
 {
    let defaults = arenas_after_calls(None).await;
    assert!(
        defaults >= 1,
        "glibc's defaults gave no thread arena: the check finds nothing"
    );
    let tunables = image_tunables();
    assert_eq!(
        arenas_after_calls(Some(&tunables)).await,
        0,
        "GLIBC_TUNABLES={tunables} left thread arenas (a misspelt tunable is ignored)"
    );
}
