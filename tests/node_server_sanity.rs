//! csi-sanity, re-enacted. The community conformance suite (kubernetes-csi/csi-test,
//! `pkg/sanity`, v5) is Go and cannot run here, so every check it makes that applies to our
//! capabilities is repeated in our own words, against the real server on a real socket with
//! real mounts, each named after the expectation it mirrors.
//!
//! The harness keeps csi-sanity's ways, because that is where plugins fail it: before every spec
//! it creates `--csi.mountdir` and `--csi.stagingdir` itself (`mkdir`, which fails if they are
//! still there); the target path is `<mountdir>/target`, which the plugin must create and remove;
//! sizes are csi-sanity's defaults (10 GiB volumes, expansion by 1 GiB); and after every spec it
//! unpublishes, unstages and deletes each volume the spec created (NOT_FOUND tolerated), then
//! removes both directories, which must be empty and unmounted again.
//!
//! Not re-enacted, because we do not advertise them and csi-sanity skips them too: snapshots,
//! cloning, ControllerPublish and the "volume lifecycle" built on it, ControllerGetVolume,
//! ModifyVolume, group snapshots, and block access (`--csi.testvolumeaccesstype=block`).

use crate::common;

use std::path::{Path, PathBuf};

use common::csi_node::*;
use csi_nodekit::node_server::{Config, DEFAULT_DRIVER_NAME};
use csi_nodekit::proto::csi::volume_capability::access_mode::Mode;
use csi_nodekit::proto::csi::*;
use tonic::{Code, Status};

/// csi-sanity's default `--csi.testvolumesize`.
const TEST_VOLUME_SIZE: i64 = 10 << 30;
/// What csi-sanity adds to the test size for expansion (`DefTestExpandIncrement`).
const EXPAND_INCREMENT: i64 = 1 << 30;
/// csi-sanity's `MaxNameLength` for volume names.
const MAX_NAME_LENGTH: usize = 128;
/// csi-sanity's default `IdempotentCount`: how often "should be idempotent" repeats each call.
const IDEMPOTENT_COUNT: usize = 10;
/// csi-sanity's `GenerateInvalidVolumeID`.
const INVALID_VOLUME_ID: &str = "fake-vol-id";

/// Sixteen random hex digits (std's randomly keyed hasher).
fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let hasher = std::collections::hash_map::RandomState::new().build_hasher();
    format!("{:016X}", hasher.finish())
}

/// csi-sanity's `GenerateUniqueValidVolumeID`: well-formed, and no volume of ours.
fn unknown_volume_id() -> String {
    format!("fake-vol-id-{}", &random_hex()[..10])
}

/// csi-sanity's test context (`TestContext`) with its resource tracking (`Resources`).
struct Sanity {
    csi: Csi,
    /// `--csi.mountdir`: the *parent* of the target path.
    mount_dir: PathBuf,
    /// `--csi.stagingdir`: the staging path itself.
    staging: PathBuf,
    /// `--csi.testvolumesize`.
    size: i64,
    /// Volumes to clean up after the spec, newest last; a volume created twice is listed twice.
    volumes: Vec<String>,
    /// `UniqueString`'s suffix, one per run.
    suffix: String,
}

impl Sanity {
    fn new(sandbox: &MountSandbox, csi: Csi, size: i64) -> Self {
        Self {
            csi,
            mount_dir: sandbox.path().join("csi-mount"),
            staging: sandbox.path().join("csi-staging"),
            size,
            volumes: Vec::new(),
            suffix: format!("-{}", random_hex()),
        }
    }

    /// Before every spec: both directories, created by csi-sanity, never by the plugin.
    fn setup(&self) {
        for dir in [&self.mount_dir, &self.staging] {
            std::fs::create_dir(dir).unwrap_or_else(|e| {
                panic!(
                    "setup: mkdir {}: {e} (left by the last spec)",
                    dir.display()
                )
            });
        }
    }

    /// After every spec: unpublish, unstage and delete what it created, newest first, then
    /// remove the directories, which fails if anything is left in or on them.
    async fn teardown(&mut self) {
        while let Some(id) = self.volumes.pop() {
            let unpublish = unpublish_request(&id, &self.target());
            tolerate_not_found(&id, self.csi.node.node_unpublish_volume(unpublish).await);
            let unstage = unstage_request(&id, &self.staging);
            tolerate_not_found(&id, self.csi.node.node_unstage_volume(unstage).await);
            let deleted = self.csi.controller.delete_volume(delete_request(&id)).await;
            deleted.unwrap_or_else(|e| panic!("cleanup: DeleteVolume {id}: {e}"));
        }
        for dir in [&self.mount_dir, &self.staging] {
            std::fs::remove_dir(dir)
                .unwrap_or_else(|e| panic!("teardown: rmdir {}: {e}", dir.display()));
        }
    }

    fn target(&self) -> PathBuf {
        self.mount_dir.join("target")
    }

    fn unique(&self, prefix: &str) -> String {
        format!("{prefix}{}", self.suffix)
    }

    fn expand_size(&self) -> i64 {
        self.size + EXPAND_INCREMENT
    }

    /// `MakeCreateVolumeReq`: one single-node-writer mount capability, the test size as both
    /// bounds.
    fn create_request(&self, name: &str) -> CreateVolumeRequest {
        CreateVolumeRequest {
            capacity_range: Some(CapacityRange {
                required_bytes: self.size,
                limit_bytes: self.size,
            }),
            ..create_request(name, 0)
        }
    }

    /// CreateVolume, registering what it creates for cleanup.
    async fn create_volume(
        &mut self,
        req: CreateVolumeRequest,
    ) -> Result<tonic::Response<CreateVolumeResponse>, Status> {
        let reply = self.csi.controller.create_volume(req).await?;
        let id = reply.get_ref().volume.as_ref().map(|v| v.volume_id.clone());
        self.volumes.extend(id.filter(|id| !id.is_empty()));
        Ok(reply)
    }

    /// `MustCreateVolume`: a volume with an ID, or the spec fails.
    async fn must_create(&mut self, req: CreateVolumeRequest) -> Volume {
        let volume = self.create_volume(req).await.expect("volume create failed");
        let volume = volume.into_inner().volume.expect("volume in response");
        assert!(!volume.volume_id.is_empty(), "volume ID in response");
        volume
    }

    /// DeleteVolume, which unregisters the volume once it succeeded.
    async fn delete_volume(&mut self, id: &str) {
        let deleted = self.csi.controller.delete_volume(delete_request(id)).await;
        deleted.unwrap_or_else(|e| panic!("DeleteVolume {id}: {e}"));
        if let Some(at) = self.volumes.iter().position(|v| v == id) {
            self.volumes.remove(at);
        }
    }

    async fn list_ids(&mut self, max_entries: i32, starting_token: &str) -> (Vec<String>, String) {
        let request = ListVolumesRequest {
            max_entries,
            starting_token: starting_token.into(),
        };
        let page = self.csi.controller.list_volumes(request).await;
        let page = page.expect("ListVolumes").into_inner();
        let ids = page.entries.into_iter().map(|e| {
            let volume = e.volume.expect("every entry carries a volume");
            assert!(!volume.volume_id.is_empty(), "every volume has an ID");
            volume.volume_id
        });
        (ids.collect(), page.next_token)
    }

    async fn node_info(&mut self) -> NodeGetInfoResponse {
        let info = self.csi.node.node_get_info(NodeGetInfoRequest {}).await;
        let info = info.expect("NodeGetInfo").into_inner();
        assert!(!info.node_id.is_empty(), "a node ID");
        info
    }

    async fn stage(&mut self, id: &str, cap: VolumeCapability) {
        let request = NodeStageVolumeRequest {
            volume_capability: Some(cap),
            ..stage_request(id, &self.staging)
        };
        let staged = self.csi.node.node_stage_volume(request).await;
        staged.unwrap_or_else(|e| panic!("NodeStageVolume {id}: {e}"));
    }

    fn publish_request(
        &self,
        id: &str,
        target: &Path,
        cap: VolumeCapability,
    ) -> NodePublishVolumeRequest {
        NodePublishVolumeRequest {
            volume_capability: Some(cap),
            ..publish_request(id, &self.staging, target, false)
        }
    }

    async fn publish(&mut self, id: &str, cap: VolumeCapability) {
        let request = self.publish_request(id, &self.target(), cap);
        let published = self.csi.node.node_publish_volume(request).await;
        published.unwrap_or_else(|e| panic!("NodePublishVolume {id}: {e}"));
    }

    /// A fresh single-node-writer volume of the test size, staged and published.
    async fn published_volume(&mut self, name: &str) -> String {
        let id = self
            .must_create(self.create_request(&self.unique(name)))
            .await
            .volume_id;
        self.stage(&id, rwo()).await;
        self.publish(&id, rwo()).await;
        id
    }
}

/// How many mounts are stacked at `path`.
fn mounts_at(path: &Path) -> usize {
    let table = csi_nodekit::node_server::mountinfo::MountTable::read().expect("mount table");
    table
        .entries()
        .iter()
        .filter(|e| e.mount_point == path)
        .count()
}

/// Cleanup ignores NOT_FOUND and nothing else.
fn tolerate_not_found<T>(id: &str, result: Result<tonic::Response<T>, Status>) {
    if let Err(status) = result
        && status.code() != Code::NotFound
    {
        panic!("cleanup of {id}: {status}");
    }
}

/// csi-sanity's pattern for plugin names, stricter than the spec's (letters at both ends):
/// `^[a-zA-Z][A-Za-z0-9-\.\_]{0,61}[a-zA-Z]$`.
fn sanity_accepts_name(name: &str) -> bool {
    let b = name.as_bytes();
    let inner = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_');
    (2..=63).contains(&b.len())
        && b[0].is_ascii_alphabetic()
        && b[b.len() - 1].is_ascii_alphabetic()
        && b[1..b.len() - 1].iter().all(inner)
}

/// Each spec as its own test (its own server, between csi-sanity's setup and teardown), and
/// `whole_suite`: all of them in order against one server, as csi-sanity runs them.
macro_rules! sanity_specs {
    ($($(#[$doc:meta])* $spec:ident;)+) => {
        $(
            $(#[$doc])*
            #[tokio::test]
            async fn $spec() {
                let (sandbox, server, csi) = sanity_server().await;
                let mut s = Sanity::new(&sandbox, csi, TEST_VOLUME_SIZE);
                s.setup();
                spec::$spec(&mut s).await;
                s.teardown().await;
                server.stop().await;
            }
        )+

        async fn whole_suite(s: &mut Sanity) {
            $(
                s.setup();
                spec::$spec(s).await;
                s.teardown().await;
            )+
        }
    };
}

/// A server with `--capacity=11Gi`: the least that csi-sanity's defaults need (at most one
/// 10 GiB volume at a time, grown by 1 GiB).
async fn sanity_server() -> (MountSandbox, CsiServer, Csi) {
    let sandbox = MountSandbox::new();
    let config = Config {
        capacity: Some((TEST_VOLUME_SIZE + EXPAND_INCREMENT) as u64),
        ..config(&sandbox)
    };
    let server = start(&sandbox, config).await;
    let csi = server.client().await;
    (sandbox, server, csi)
}

sanity_specs! {
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
    // Node Service
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
}

#[path = "node_server_sanity/controller.rs"]
mod controller;
#[path = "node_server_sanity/node.rs"]
mod node;
mod spec {
    pub use super::controller::*;
    pub use super::node::*;
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_suite_in_order_on_one_server_leaves_no_mount_directory_or_volume_behind() {
    let (sandbox, server, csi) = sanity_server().await;
    let mut s = Sanity::new(&sandbox, csi, TEST_VOLUME_SIZE);
    whole_suite(&mut s).await;
    assert_eq!(s.list_ids(0, "").await.0, Vec::<String>::new());
    assert_eq!(sandbox.mounts(), Vec::<PathBuf>::new());
    let data = std::fs::read_dir(sandbox.path().join("state/volumes")).unwrap();
    assert_eq!(data.count(), 0, "no volume directory is left");
    server.stop().await;
}

/// The README's command, `csi-sanity --csi.endpoint=<socket> --csi.testvolumesize=1048576`,
/// against the real binary with its default capacity (each new volume must fit in the free
/// space; unsized ones get 1 GiB).
#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_command_passes_against_the_real_binary_with_its_default_capacity() {
    let sandbox = MountSandbox::new();
    let free = csi_nodekit::node_server::capacity::free_bytes(sandbox.path()).unwrap();
    let needed = csi_nodekit::node_server::capacity::DEFAULT_SIZE + (1 << 20);
    assert!(
        free >= needed,
        "this test needs {needed} bytes free under {} (csi-sanity's unsized volumes get our \
         1 GiB default); there are {free}",
        sandbox.path().display()
    );
    let socket = sandbox.path().join("csi.sock");
    let mut child = common::spawn_node_server(
        &socket,
        &sandbox.path().join("state"),
        &["--node-id=sanity-node"],
    );
    let up = common::wait_until(std::time::Duration::from_secs(10), || {
        common::is_socket(&socket)
    })
    .await;
    assert!(up, "socket never appeared");
    let mut s = Sanity::new(&sandbox, connect(&socket).await, 1 << 20);
    whole_suite(&mut s).await;
    assert_eq!(sandbox.mounts(), Vec::<PathBuf>::new());
    common::send_signal(&child.0, nix::sys::signal::Signal::SIGTERM);
    let status = common::wait_exit(&mut child.0, std::time::Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
}
