//! csi-sanity, re-enacted. The community conformance suite (kubernetes-csi/csi-test,
//! `pkg/sanity`, v5) is Go and cannot run here, so every check it makes that applies to our
//! capabilities is repeated in our own words, each named after the expectation it mirrors.
//!
//! The harness (`harness.rs`) keeps csi-sanity's ways, because that is where plugins fail it:
//! before every spec it creates `--csi.mountdir` and `--csi.stagingdir` itself (`mkdir`, which
//! fails if they are still there); the target path is `<mountdir>/target`, which the plugin
//! must create and remove; sizes are csi-sanity's defaults (10 GiB volumes, expansion by
//! 1 GiB); and after every spec it deletes each volume and snapshot the spec created, newest
//! first (a volume unpublished and unstaged first, NOT_FOUND tolerated), then removes both
//! directories, which must be empty and unmounted again.
//!
//! The specs: csi-test v5.4's that apply to what we advertise (83 of its 96, one of them
//! pending upstream), as run with a `--csi.testvolumemutableparameters` file holding
//! `rootMode: "0770"`, against a server with `--capacity=51Gi` (room for csi-sanity's sizes)
//! and otherwise the default flags; and the GetSnapshot specs csi-test v5.5 added (with its
//! capabilities spec, which knows GET_SNAPSHOT), against a server also started with
//! `--advertise-get-snapshot` (v5.4 fails on that capability). Not re-enacted, because we do
//! not advertise them and csi-sanity skips them too: ControllerPublish and the "volume
//! lifecycle" built on it, and ControllerGetVolume.
//!
//! They run four ways, on a real socket: each spec as its own test on its own in-process
//! server; all of them in order on one server (v5.4's, then v5.5's on another), which must
//! leave no mount, directory, volume or snapshot behind; v5.4's again in block mode
//! (`--csi.testvolumeaccesstype=block`, the parameters file holding `directIO: "false"`),
//! every volume a sparse file on a real loop device and none left attached; v5.4's again with
//! image volumes (`--csi.testvolumeparameters` holding `layout: image`, 16 MiB volumes),
//! every volume an ext4 of its own on a real loop device; and the command
//! docs/node-server.md gives (`--csi.testvolumesize=1048576`) against the real binary with its default
//! capacity, then restarted with `--advertise-get-snapshot` for v5.5's. What mounts needs root:
//! real bind mounts in a private mount namespace.

use crate::common;

use std::path::{Path, PathBuf};

use common::csi_node::*;
use csi_nodekit::node_server::{Config, DEFAULT_DRIVER_NAME};
use csi_nodekit::proto::csi::volume_capability::access_mode::Mode;

mod harness;
use harness::*;

/// Each spec as its own test (its own server, between csi-sanity's setup and teardown), and
/// `$suite`: all of them in order against one server, as csi-sanity runs them.
macro_rules! sanity_specs {
    ($suite:ident on $server:ident: $($(#[$doc:meta])* $spec:ident;)+) => {
        $(
            $(#[$doc])*
            #[tokio::test]
            async fn $spec() {
                let (sandbox, server, csi) = $server().await;
                let mut s = Sanity::new(&sandbox, csi, TEST_VOLUME_SIZE);
                s.setup();
                spec::$spec(&mut s).await;
                s.teardown().await;
                server.stop().await;
            }
        )+

        async fn $suite(s: &mut Sanity) {
            $(
                s.setup();
                spec::$spec(s).await;
                s.teardown().await;
            )+
        }
    };
}

/// The `--capacity` csi-sanity's defaults need: five 10 GiB volumes at once (ListSnapshots'
/// paging spec makes five volumes with a snapshot each), one of them grown by 1 GiB.
pub const SANITY_CAPACITY: i64 = 5 * TEST_VOLUME_SIZE + EXPAND_INCREMENT;

/// A server with `--capacity=51Gi` and the default flags, for csi-sanity v5.4.
async fn sanity_server() -> (MountSandbox, CsiServer, Csi) {
    sanity_server_with(false).await
}

/// The same with `--advertise-get-snapshot`, for the specs csi-sanity v5.5 added.
async fn sanity_server_with_get_snapshot() -> (MountSandbox, CsiServer, Csi) {
    sanity_server_with(true).await
}

async fn sanity_server_with(advertise_get_snapshot: bool) -> (MountSandbox, CsiServer, Csi) {
    let sandbox = MountSandbox::new();
    let config = Config {
        capacity: Some(SANITY_CAPACITY as u64),
        advertise_get_snapshot,
        ..config(&sandbox)
    };
    let server = start(&sandbox, config).await;
    let csi = server.client().await;
    (sandbox, server, csi)
}

sanity_specs! {
    whole_suite on sanity_server:
    // Identity Service
    get_plugin_capabilities_returns_only_capabilities_csi_sanity_knows;
    probe_returns_appropriate_information;
    get_plugin_info_returns_a_name_csi_sanity_accepts;
    // Controller Service
    controller_get_capabilities_returns_only_capabilities_csi_sanity_knows;
    get_capacity_returns_capacity_with_no_optional_values;
    list_volumes_returns_entries_that_each_carry_a_volume_id;
    list_volumes_fails_with_aborted_on_an_invalid_starting_token;
    list_volumes_shows_new_volumes_and_forgets_deleted_ones;
    list_volumes_pagination_survives_volumes_added_and_the_page_deleted_between_pages;
    create_volume_fails_without_a_name;
    create_volume_fails_without_volume_capabilities;
    create_volume_succeeds_for_a_single_node_writer_of_the_test_size;
    create_volume_returns_at_least_the_capacity_asked_for;
    create_volume_with_an_existing_name_and_the_same_capacity_returns_the_same_volume;
    create_volume_with_an_existing_name_and_a_different_capacity_already_exists;
    create_volume_accepts_a_name_of_the_maximum_length;
    delete_volume_fails_without_a_volume_id;
    delete_volume_succeeds_for_an_invalid_volume_id;
    delete_volume_deletes_a_created_volume;
    validate_volume_capabilities_fails_without_a_volume_id;
    validate_volume_capabilities_fails_without_capabilities;
    validate_volume_capabilities_confirms_with_the_capabilities;
    validate_volume_capabilities_fails_with_not_found_for_an_unknown_volume;
    controller_expand_volume_fails_without_a_volume_id;
    controller_expand_volume_fails_without_a_capacity_range;
    controller_expand_volume_returns_exactly_the_size_asked_for;
    // Controller Service: content sources and snapshots
    create_volume_from_an_existing_source_snapshot_echoes_the_source;
    create_volume_fails_with_not_found_for_a_missing_source_snapshot;
    create_volume_from_an_existing_source_volume_succeeds;
    create_volume_fails_with_not_found_for_a_missing_source_volume;
    // Controller Service: mutable parameters (with a --csi.testvolumemutableparameters file)
    create_volume_with_a_volume_attribute_class_succeeds;
    create_volume_with_an_invalid_volume_attribute_class_fails_with_invalid_argument;
    modify_volume_fails_without_a_volume_id;
    modify_volume_fails_with_not_found_for_an_unknown_volume;
    modify_volume_fails_for_mutable_parameters_the_volume_does_not_support;
    modify_volume_of_a_volume_created_without_a_volume_attribute_class_succeeds;
    modify_volume_of_a_volume_created_with_a_volume_attribute_class_succeeds;
    modify_volume_of_a_volume_created_with_a_volume_attribute_class_fails_for_unsupported_new_parameters;
    create_snapshot_fails_without_a_name;
    create_snapshot_fails_without_a_source_volume_id;
    create_snapshot_with_an_existing_name_and_the_same_source_returns_it_again;
    create_snapshot_with_an_existing_name_and_another_source_already_exists;
    create_snapshot_accepts_a_name_of_the_maximum_length;
    delete_snapshot_fails_without_a_snapshot_id;
    delete_snapshot_succeeds_for_an_invalid_snapshot_id;
    delete_snapshot_of_a_created_snapshot_succeeds_in_cleanup;
    list_snapshots_returns_entries_that_each_pass_the_snapshot_checks;
    list_snapshots_returns_only_the_snapshot_with_the_id_asked_for;
    list_snapshots_returns_nothing_for_an_unknown_snapshot_id;
    list_snapshots_returns_only_the_snapshots_of_the_source_volume_asked_for;
    list_snapshots_returns_nothing_for_an_unknown_source_volume;
    list_snapshots_shows_new_snapshots_and_forgets_deleted_ones;
    list_snapshots_pages_with_a_next_token_when_fewer_entries_are_asked_for;
    node_get_capabilities_returns_only_capabilities_csi_sanity_knows;
    node_get_info_returns_a_node_id_a_volume_limit_and_a_topology;
    node_publish_volume_fails_without_a_volume_id;
    node_publish_volume_fails_without_a_target_path;
    node_publish_volume_fails_without_a_volume_capability;
    #[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
    node_publish_volume_of_a_single_writer_volume_at_a_second_target_fails_the_precondition;
    node_unpublish_volume_fails_without_a_volume_id;
    node_unpublish_volume_fails_without_a_target_path;
    #[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
    node_unpublish_volume_removes_the_target_path;
    node_stage_volume_fails_without_a_volume_id;
    node_stage_volume_fails_without_a_staging_target_path;
    node_stage_volume_fails_without_a_volume_capability;
    node_unstage_volume_fails_without_a_volume_id;
    node_unstage_volume_fails_without_a_staging_target_path;
    node_get_volume_stats_fails_without_a_volume_id;
    node_get_volume_stats_fails_without_a_volume_path;
    node_get_volume_stats_fails_with_not_found_for_an_unknown_volume;
    #[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
    node_get_volume_stats_fails_with_not_found_when_the_volume_is_not_at_the_path;
    node_expand_volume_fails_without_a_volume_id;
    node_expand_volume_fails_without_a_volume_path;
    node_expand_volume_fails_with_not_found_for_an_unknown_volume;
    #[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
    node_expand_volume_works_after_node_publish;
    #[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
    the_node_service_works_from_create_to_stats;
    #[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
    the_node_service_is_idempotent_when_every_call_is_repeated_ten_times;
    // GroupController Service
    group_controller_get_capabilities_returns_only_capabilities_csi_sanity_knows;
    create_volume_group_snapshot_fails_without_a_name;
    get_volume_group_snapshot_fails_without_a_group_snapshot_id;
    get_volume_group_snapshot_fails_with_not_found_for_an_invalid_id;
    delete_volume_group_snapshot_fails_without_a_group_snapshot_id;
    delete_volume_group_snapshot_succeeds_for_an_invalid_id;
}

sanity_specs! {
    whole_suite_v5_5 on sanity_server_with_get_snapshot:
    controller_get_capabilities_with_get_snapshot_returns_only_capabilities_v5_5_knows;
    get_snapshot_fails_without_a_snapshot_id;
    get_snapshot_returns_the_snapshot_with_the_id_asked_for;
    get_snapshot_fails_for_an_unknown_snapshot_id;
}

mod controller;
mod group;
mod modify;
mod node;
mod snapshots;
mod spec {
    pub use super::controller::*;
    pub use super::group::*;
    pub use super::modify::*;
    pub use super::node::*;
    pub use super::snapshots::*;
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_suite_in_order_on_one_server_leaves_no_mount_directory_or_volume_behind() {
    for v5_5 in [false, true] {
        let (sandbox, server, csi) = sanity_server_with(v5_5).await;
        let mut s = Sanity::new(&sandbox, csi, TEST_VOLUME_SIZE);
        match v5_5 {
            false => whole_suite(&mut s).await,
            true => whole_suite_v5_5(&mut s).await,
        }
        assert_eq!(s.list_ids(0, "").await.0, Vec::<String>::new());
        let snapshots = s.list_snapshots(Default::default()).await;
        assert_eq!(snapshots, Vec::new(), "no snapshot is left");
        assert_eq!(sandbox.mounts(), Vec::<PathBuf>::new());
        for dir in ["state/volumes", "state/snapshots"] {
            let data = std::fs::read_dir(sandbox.path().join(dir)).unwrap();
            assert_eq!(data.count(), 0, "nothing is left in {dir}");
        }
        server.stop().await;
    }
}

/// `--csi.testvolumeaccesstype=block`, with a `--csi.testvolumemutableparameters` file
/// holding `directIO: "false"` (what applies to block volumes): the whole v5.4 suite again,
/// every volume a sparse file on a real loop device, published as a device node.
#[ignore = "needs root: real loop devices and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_suite_in_block_mode_passes_on_real_loop_devices_and_leaves_none_attached() {
    let (sandbox, server, csi) = sanity_server().await;
    let state = sandbox.path().join("state");
    let _devices = common::csi_block::DetachOnDrop(state.clone());
    let mut s =
        Sanity::new(&sandbox, csi, TEST_VOLUME_SIZE).in_block_mode(&[("directIO", "false")]);
    whole_suite(&mut s).await;
    nothing_is_left_on_loop_devices(&mut s, &sandbox, &state).await;
    server.stop().await;
}

/// A `--csi.testvolumeparameters` file holding `layout: image`, with
/// `--csi.testvolumesize=16777216` (the smallest image, the only size this machine's root can
/// stage: a larger one grows its filesystem, which needs CAP_SYS_RESOURCE) and
/// `--csi.testvolumeexpandsize` twice that: the whole v5.4 suite again, every volume an ext4 of
/// its own in a thick file on a real loop device, mounted at stage; none left attached after.
#[ignore = "needs root: real loop devices, ext4 mounts and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_suite_with_image_volumes_passes_on_real_loop_devices_and_leaves_none_attached() {
    let (sandbox, server, csi) = sanity_server().await;
    let state = sandbox.path().join("state");
    let _devices = common::csi_block::DetachOnDrop(state.clone());
    let mut s = Sanity::new(&sandbox, csi, IMAGE_TEST_VOLUME_SIZE).in_image_layout();
    whole_suite(&mut s).await;
    nothing_is_left_on_loop_devices(&mut s, &sandbox, &state).await;
    server.stop().await;
}

/// After a whole suite on loop devices: no volume, snapshot, mount, attached device or file
/// of a volume or snapshot is left.
async fn nothing_is_left_on_loop_devices(s: &mut Sanity, sandbox: &MountSandbox, state: &Path) {
    assert_eq!(s.list_ids(0, "").await.0, Vec::<String>::new());
    assert_eq!(s.list_snapshots(Default::default()).await, Vec::new());
    assert_eq!(sandbox.mounts(), Vec::<PathBuf>::new());
    assert_eq!(
        common::csi_block::attached_under(state),
        0,
        "no loop device is left on a volume's file"
    );
    for dir in ["volumes", "snapshots"] {
        let data = std::fs::read_dir(state.join(dir)).unwrap();
        assert_eq!(data.count(), 0, "nothing is left in {dir}");
    }
}

/// The smallest image volume: the empty ext4 every image starts from.
const IMAGE_TEST_VOLUME_SIZE: i64 = 16 << 20;

/// The command docs/node-server.md gives,
/// `csi-sanity --csi.endpoint=<socket> --csi.testvolumesize=1048576`, against the real binary
/// with its default capacity (each new volume must fit in the free space; unsized ones get
/// 1 GiB); then the v5.5 specs against it restarted with `--advertise-get-snapshot`.
#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_csi_sanity_command_passes_on_the_real_binary_at_its_default_capacity() {
    let sandbox = MountSandbox::new();
    let free = csi_nodekit::node_server::state::capacity::free_bytes(sandbox.path()).unwrap();
    let needed = csi_nodekit::node_server::state::capacity::DEFAULT_SIZE + (1 << 20);
    assert!(
        free >= needed,
        "this test needs {needed} bytes free under {} (csi-sanity's unsized volumes get our \
         1 GiB default); there are {free}",
        sandbox.path().display()
    );
    let socket = sandbox.path().join("csi.sock");
    let v5_4: &[&str] = &["--node-id=sanity-node"];
    let v5_5: &[&str] = &["--node-id=sanity-node", "--advertise-get-snapshot"];
    for (flags, get_snapshot) in [(v5_4, false), (v5_5, true)] {
        let mut child = common::spawn_node_server(&socket, &sandbox.path().join("state"), flags);
        let up = common::wait_until(std::time::Duration::from_secs(10), || {
            common::is_socket(&socket)
        })
        .await;
        assert!(up, "socket never appeared");
        let mut s = Sanity::new(&sandbox, connect(&socket).await, 1 << 20);
        match get_snapshot {
            false => whole_suite(&mut s).await,
            true => whole_suite_v5_5(&mut s).await,
        }
        assert_eq!(sandbox.mounts(), Vec::<PathBuf>::new());
        common::send_signal(&child.0, nix::sys::signal::Signal::SIGTERM);
        let status = common::wait_exit(&mut child.0, std::time::Duration::from_secs(10));
        assert_eq!(status.code(), Some(0));
    }
}
