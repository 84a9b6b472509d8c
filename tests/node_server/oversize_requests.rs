//! Requests past the CSI spec's size limits, through real gRPC: over-long fields are
//! INVALID_ARGUMENT and nothing of them is kept or written; a message over node-server's
//! bound is RESOURCE_EXHAUSTED before it is buffered; and the real binary's memory stays
//! where it was after a handful of such requests.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::csi_node::*;
use csi_nodekit::proto::csi::*;
use tonic::Code;

/// node-server's bound on a request (`field_limits::MAX_REQUEST`), as a client knows it.
const BOUND: usize = 256 << 10;

/// A map whose keys and values hold `bytes` in all.
fn map_of(bytes: usize) -> HashMap<String, String> {
    HashMap::from([("k".to_owned(), "v".repeat(bytes - 1))])
}

/// The records node-server has written.
fn records(state: &std::path::Path) -> usize {
    std::fs::read_dir(state.join("meta")).map_or(0, |dir| dir.count())
}

#[tokio::test]
async fn fields_over_the_spec_size_limits_are_invalid_and_nothing_of_them_is_written() {
    let (sandbox, server, mut csi) = setup().await;
    let state = sandbox.path().join("state");
    let at_limits = CreateVolumeRequest {
        name: "n".repeat(128),
        parameters: map_of(4096),
        secrets: map_of(4096),
        ..create_request("", 1)
    };
    let id = csi
        .controller
        .create_volume(at_limits)
        .await
        .expect("fields at the limits are legal")
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let segments = HashMap::from([(format!("topology.{DRIVER}/node"), "n".repeat(4096))]);
    let over = [
        ("name", create_request(&"n".repeat(129), 1)),
        ("name with ESC", create_request("pvc-\u{1b}[31m", 1)),
        (
            "parameters",
            CreateVolumeRequest {
                parameters: map_of(4097),
                ..create_request("pvc-p", 1)
            },
        ),
        (
            "secrets",
            CreateVolumeRequest {
                secrets: map_of(4097),
                ..create_request("pvc-s", 1)
            },
        ),
        (
            "requisite topology",
            CreateVolumeRequest {
                accessibility_requirements: Some(TopologyRequirement {
                    requisite: vec![Topology { segments }],
                    preferred: vec![],
                }),
                ..create_request("pvc-t", 1)
            },
        ),
    ];
    for (what, request) in over {
        let result = csi.controller.create_volume(request).await;
        assert_eq!(code(result), Code::InvalidArgument, "{what}");
    }
    let mut stage = stage_request(&id, &sandbox.dir("staging"));
    stage.volume_context = map_of(4097);
    assert_eq!(
        code(csi.node.node_stage_volume(stage).await),
        Code::InvalidArgument
    );
    let inline = NodePublishVolumeRequest {
        volume_id: "csi-inline".into(),
        target_path: sandbox.dir("pods").join("t").display().to_string(),
        volume_capability: Some(rwo()),
        volume_context: HashMap::from([
            ("csi.storage.k8s.io/ephemeral".into(), "true".into()),
            ("x".into(), "y".repeat(4096)),
        ]),
        ..Default::default()
    };
    assert_eq!(
        code(csi.node.node_publish_volume(inline).await),
        Code::InvalidArgument
    );
    let delete = DeleteVolumeRequest {
        volume_id: id.clone(),
        secrets: map_of(4097),
    };
    assert_eq!(
        code(csi.controller.delete_volume(delete).await),
        Code::InvalidArgument
    );
    let validate = ValidateVolumeCapabilitiesRequest {
        volume_id: id.clone(),
        volume_capabilities: vec![rwo()],
        volume_context: map_of(4097),
        ..Default::default()
    };
    let result = csi.controller.validate_volume_capabilities(validate).await;
    assert_eq!(code(result), Code::InvalidArgument);
    assert_eq!(records(&state), 1, "only the legal volume was written");
    assert_eq!(csi.list().await.len(), 1);
    server.stop().await;
}

#[tokio::test]
async fn a_message_over_the_bound_is_resource_exhausted_and_the_server_goes_on() {
    let (sandbox, server, mut csi) = setup().await;
    for bytes in [4 << 20, BOUND + 1] {
        let request = create_request(&"n".repeat(bytes), 1);
        let result = csi.controller.create_volume(request).await;
        assert_eq!(code(result), Code::ResourceExhausted, "a {bytes}-byte name");
    }
    // Under the bound the message is decoded, and its field is over the spec's limit.
    let request = create_request(&"n".repeat(BOUND - 1024), 1);
    let result = csi.controller.create_volume(request).await;
    assert_eq!(code(result), Code::InvalidArgument);
    create(&mut csi, "pvc-after", 1).await;
    assert_eq!(records(&sandbox.path().join("state")), 1);
    server.stop().await;
}

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_leave_the_real_binarys_memory_where_it_was() {
    let sandbox = MountSandbox::new();
    let socket = sandbox.path().join("csi.sock");
    let state = sandbox.path().join("state");
    let child = common::spawn_node_server(&socket, &state, &["--node-id=n", "--capacity=1Ti"]);
    assert!(
        common::wait_until(Duration::from_secs(10), || common::is_socket(&socket)).await,
        "socket never appeared"
    );
    let mut csi = connect(&socket).await;
    // Warm up: every path a legal request takes has run once.
    let id = create(&mut csi, "pvc-warm", 1).await;
    csi.controller
        .delete_volume(delete_request(&id))
        .await
        .unwrap();
    let before = rss_kib(child.0.id());
    let mut codes = Vec::new();
    for mib in [1, 2, 4, 4] {
        let request = create_request(&"n".repeat(mib << 20), 1);
        codes.push(csi.controller.create_volume(request).await.map(drop));
    }
    for _ in 0..4 {
        let mut publish = publish_request("vol-x", &state, &sandbox.path().join("t"), false);
        publish.volume_context = HashMap::from([("k".into(), "v".repeat(4 << 20))]);
        codes.push(csi.node.node_publish_volume(publish).await.map(drop));
    }
    // And eight at once on the one connection.
    let at_once = (0..8).map(|i| {
        let mut controller = csi.controller.clone();
        let request = create_request(&format!("{i}{}", "n".repeat(4 << 20)), 1);
        tokio::spawn(async move { controller.create_volume(request).await.map(drop) })
    });
    for task in at_once.collect::<Vec<_>>() {
        codes.push(task.await.unwrap());
    }
    // Every call has been answered; what the server read for them must be given back (the
    // gate is the RSS itself, polled, rather than a pause before one reading).
    let pid = child.0.id();
    let after = common::eventually(Duration::from_secs(5), || {
        let rss = rss_kib(pid);
        (rss < before + 4096).then_some(rss)
    })
    .await
    .unwrap_or_else(|| rss_kib(pid));
    println!(
        "node-server RSS (debug build): {:.1} MB before, {:.1} MB after {} requests of 1-4 MB",
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        codes.len()
    );
    for result in &codes {
        let code = result.as_ref().map_or_else(|s| s.code(), |()| Code::Ok);
        assert_eq!(code, Code::ResourceExhausted, "{result:?}");
    }
    assert_eq!(records(&state), 0, "nothing was written");
    assert!(
        after < before + 4096,
        "RSS grew from {before} to {after} KiB"
    );
    drop(child);
}
