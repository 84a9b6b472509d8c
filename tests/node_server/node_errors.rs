//! Error codes of the Node service through real gRPC with real mounts: missing fields before
//! lookups, unknown volumes, ordering (publish before stage), incompatible repeats, deleting
//! a mounted volume, and path traversal.

use crate::common;

use std::collections::HashMap;
use std::path::Path;

use common::csi_node::*;
use csi_nodekit::proto::csi::volume_capability::access_mode::Mode;
use csi_nodekit::proto::csi::*;
use tonic::Code;

/// Asserts that each request, sent with `client.method`, fails with `code`.
macro_rules! expect_code {
    ($code:expr, $client:ident . $method:ident, [$($request:expr),+ $(,)?]) => {
        $(assert_eq!(code($client.$method($request).await), $code, stringify!($method));)+
    };
}

#[tokio::test]
async fn node_calls_refuse_missing_fields_before_looking_the_volume_up() {
    let (sandbox, server, mut csi) = setup().await;
    let staging = sandbox.dir("staging");
    let target = sandbox.path().join("target");
    let n = &mut csi.node;
    let mut no_cap = stage_request("vol-x", &staging);
    no_cap.volume_capability = None;
    expect_code!(
        Code::InvalidArgument,
        n.node_stage_volume,
        [
            stage_request("", &staging),
            stage_request("vol-x", Path::new("")),
            no_cap
        ]
    );
    let mut no_cap = publish_request("vol-x", &staging, &target, false);
    no_cap.volume_capability = None;
    expect_code!(
        Code::InvalidArgument,
        n.node_publish_volume,
        [
            publish_request("", &staging, &target, false),
            publish_request("vol-x", &staging, Path::new(""), false),
            no_cap
        ]
    );
    expect_code!(
        Code::InvalidArgument,
        n.node_unpublish_volume,
        [
            unpublish_request("", &target),
            unpublish_request("vol-x", Path::new(""))
        ]
    );
    expect_code!(
        Code::InvalidArgument,
        n.node_unstage_volume,
        [
            unstage_request("", &staging),
            unstage_request("vol-x", Path::new(""))
        ]
    );
    expect_code!(
        Code::InvalidArgument,
        n.node_get_volume_stats,
        [stats_request("", "some/path"), stats_request("vol-x", "")]
    );
    let expand = |id: &str, path: &str| NodeExpandVolumeRequest {
        volume_id: id.into(),
        volume_path: path.into(),
        ..Default::default()
    };
    assert_eq!(
        code(n.node_expand_volume(expand("", "/x")).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(n.node_expand_volume(expand("vol-x", "")).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(n.node_expand_volume(expand("vol-x", "some/path")).await),
        Code::NotFound
    );
    server.stop().await;
}

#[tokio::test]
async fn unknown_volumes_are_not_found_and_a_bad_stats_path_is_not_found() {
    let (sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-nf", 1).await;
    let staging = sandbox.dir("staging");
    let target = sandbox.path().join("target");
    let n = &mut csi.node;
    assert_eq!(
        code(n.node_stage_volume(stage_request("vol-x", &staging)).await),
        Code::NotFound
    );
    let publish = publish_request("vol-x", &staging, &target, false);
    assert_eq!(code(n.node_publish_volume(publish).await), Code::NotFound);
    assert_eq!(
        code(
            n.node_get_volume_stats(stats_request("vol-x", "some/path"))
                .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(
            n.node_get_volume_stats(stats_request(&id, "some/path"))
                .await
        ),
        Code::NotFound
    );
    let missing = stats_request(&id, &sandbox.path().join("nope").display().to_string());
    assert_eq!(code(n.node_get_volume_stats(missing).await), Code::NotFound);
    let unmounted = n
        .node_get_volume_stats(stats_request(&id, &staging.display().to_string()))
        .await
        .unwrap()
        .into_inner();
    assert!(
        unmounted.volume_condition.unwrap().abnormal,
        "not mounted there"
    );
    std::fs::remove_dir(sandbox.path().join("state/volumes").join(&id)).unwrap();
    let missing = n
        .node_get_volume_stats(stats_request(&id, &staging.display().to_string()))
        .await
        .unwrap()
        .into_inner();
    let condition = missing.volume_condition.unwrap();
    assert!(
        condition.abnormal && condition.message.contains("missing"),
        "{condition:?}"
    );
    assert!(missing.usage.is_empty());
    // Unpublishing or unstaging what is not there is already done, for any volume.
    n.node_unpublish_volume(unpublish_request("vol-x", &target))
        .await
        .unwrap();
    n.node_unstage_volume(unstage_request("vol-x", &staging))
        .await
        .unwrap();
    n.node_unstage_volume(unstage_request(&id, &staging))
        .await
        .unwrap();
    server.stop().await;
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test]
async fn ordering_and_compatibility_errors_have_their_spec_codes() {
    let (sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-o", 1).await;
    let other = create(&mut csi, "pvc-other", 1).await;
    let staging = sandbox.dir("staging");
    let target = sandbox.dir("pods").join("t");
    let n = &mut csi.node;
    let early = publish_request(&id, &staging, &target, false);
    assert_eq!(
        code(n.node_publish_volume(early).await),
        Code::FailedPrecondition
    );
    let mut unstaged = publish_request(&id, &staging, &target, false);
    unstaged.staging_target_path.clear();
    assert_eq!(
        code(n.node_publish_volume(unstaged).await),
        Code::FailedPrecondition
    );
    assert!(
        sandbox.mounts().is_empty(),
        "nothing was mounted by refused calls"
    );

    n.node_stage_volume(stage_request(&id, &staging))
        .await
        .unwrap();
    assert_eq!(
        code(n.node_stage_volume(stage_request(&other, &staging)).await),
        Code::AlreadyExists,
        "another volume is staged there"
    );
    let mut block = stage_request(&id, &staging);
    block.volume_capability.as_mut().unwrap().access_type = Some(
        volume_capability::AccessType::Block(volume_capability::BlockVolume {}),
    );
    assert_eq!(
        code(n.node_stage_volume(block).await),
        Code::FailedPrecondition
    );
    let mut bad_flag = publish_request(&id, &staging, &target, false);
    bad_flag.volume_capability = Some(capability(Mode::SingleNodeWriter, &["discard"]));
    assert_eq!(
        code(n.node_publish_volume(bad_flag).await),
        Code::InvalidArgument
    );

    n.node_publish_volume(publish_request(&id, &staging, &target, false))
        .await
        .unwrap();
    let read_only = publish_request(&id, &staging, &target, true);
    assert_eq!(
        code(n.node_publish_volume(read_only).await),
        Code::AlreadyExists
    );
    let mut exclusive = publish_request(&id, &staging, &target.with_file_name("t2"), false);
    exclusive.volume_capability = Some(capability(Mode::SingleNodeSingleWriter, &[]));
    assert_eq!(
        code(n.node_publish_volume(exclusive).await),
        Code::FailedPrecondition
    );
    assert_eq!(
        code(
            n.node_unpublish_volume(unpublish_request("vol-x", &target))
                .await
        ),
        Code::NotFound,
        "an unknown volume with something mounted at the target"
    );
    csi.unpublish_and_unstage(&id, &target, &staging).await;
    server.stop().await;
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test]
async fn deleting_a_still_mounted_volume_is_refused_and_its_data_stays_intact() {
    let (sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-busy", 1).await;
    let staging = sandbox.dir("staging");
    csi.node
        .node_stage_volume(stage_request(&id, &staging))
        .await
        .unwrap();
    std::fs::create_dir(staging.join("dir")).unwrap();
    std::fs::write(staging.join("dir/data"), b"precious").unwrap();
    assert_eq!(
        code(csi.controller.delete_volume(delete_request(&id)).await),
        Code::FailedPrecondition
    );
    assert_eq!(
        std::fs::read(staging.join("dir/data")).unwrap(),
        b"precious"
    );
    let data = sandbox
        .path()
        .join("state/volumes")
        .join(&id)
        .join("dir/data");
    assert_eq!(std::fs::read(data).unwrap(), b"precious");
    // A mount inside the volume (not from it) also keeps it alive.
    csi.node
        .node_unstage_volume(unstage_request(&id, &staging))
        .await
        .unwrap();
    let inner = sandbox.path().join("state/volumes").join(&id).join("dir");
    nix::mount::mount(
        Some("tmpfs"),
        &inner,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    assert_eq!(
        code(csi.controller.delete_volume(delete_request(&id)).await),
        Code::FailedPrecondition
    );
    nix::mount::umount(&inner).unwrap();
    csi.controller
        .delete_volume(delete_request(&id))
        .await
        .unwrap();
    server.stop().await;
}

#[tokio::test]
async fn path_traversal_and_paths_over_the_state_directory_are_refused() {
    let (sandbox, server, mut csi) = setup().await;
    let id = create(&mut csi, "pvc-p", 1).await;
    let staging = sandbox.dir("staging");
    let state = sandbox.path().join("state");
    let n = &mut csi.node;
    let escape = format!("{}/pods/../../../../etc/evil", sandbox.path().display());
    let mut traversal = publish_request(&id, &staging, Path::new("/x"), false);
    traversal.target_path = escape;
    assert_eq!(
        code(n.node_publish_volume(traversal).await),
        Code::InvalidArgument
    );
    let relative = stage_request(&id, Path::new("relative/staging"));
    assert_eq!(
        code(n.node_stage_volume(relative).await),
        Code::InvalidArgument
    );
    for inside in [
        state.join("volumes").join(&id).join("x"),
        sandbox.path().to_owned(),
    ] {
        let over = stage_request(&id, &inside);
        assert_eq!(
            code(n.node_stage_volume(over).await),
            Code::InvalidArgument,
            "{inside:?}"
        );
    }
    for bad_id in ["../escape", "a/b", ".."] {
        let request = stage_request(bad_id, &staging);
        assert_eq!(
            code(n.node_stage_volume(request).await),
            Code::InvalidArgument
        );
        let inline = NodePublishVolumeRequest {
            volume_context: HashMap::from([("csi.storage.k8s.io/ephemeral".into(), "true".into())]),
            staging_target_path: String::new(),
            ..publish_request(bad_id, &staging, &sandbox.path().join("t"), false)
        };
        assert_eq!(
            code(n.node_publish_volume(inline).await),
            Code::InvalidArgument
        );
    }
    assert!(!sandbox.path().join("escape").exists() && !state.join("escape").exists());
    let link = sandbox.path().join("link");
    std::os::unix::fs::symlink("/etc", &link).unwrap();
    let through_link = stage_request(&id, &link);
    assert_eq!(
        code(n.node_stage_volume(through_link).await),
        Code::FailedPrecondition
    );
    assert!(sandbox.mounts().is_empty());
    server.stop().await;
}
