//! Every RPC of every service validates the same way: a table with one row per method that the
//! services' descriptors (compiled from `proto/`, as `build.rs` does) declare, so a method
//! added to the protos fails this test until it has a row. Each row says what a request over
//! the spec's size limits gets back, through real gRPC: INVALID_ARGUMENT for a field over its
//! limit, ABORTED for a paging token we could not have issued, UNIMPLEMENTED for a method this
//! plugin does not serve; a method whose request has no fields at all says so, and the
//! descriptor is checked to agree.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::common::csi_node::*;
use csi_nodekit::proto::csi::snapshot_metadata_client::SnapshotMetadataClient;
use csi_nodekit::proto::csi::*;
use tonic::Code;

/// What an over-limit request to a method gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Row {
    /// This code (the request carries a field over its limit, or a forged token).
    Refused(Code),
    /// The request has no fields, so nothing can be over a limit: answered OK.
    NoFields,
    /// Not served by this plugin.
    NotServed,
}

const TABLE: &[(&str, Row)] = &[
    ("Identity/GetPluginInfo", Row::NoFields),
    ("Identity/GetPluginCapabilities", Row::NoFields),
    ("Identity/Probe", Row::NoFields),
    (
        "Controller/CreateVolume",
        Row::Refused(Code::InvalidArgument),
    ),
    (
        "Controller/DeleteVolume",
        Row::Refused(Code::InvalidArgument),
    ),
    ("Controller/ControllerPublishVolume", Row::NotServed),
    ("Controller/ControllerUnpublishVolume", Row::NotServed),
    (
        "Controller/ValidateVolumeCapabilities",
        Row::Refused(Code::InvalidArgument),
    ),
    ("Controller/ListVolumes", Row::Refused(Code::Aborted)),
    (
        "Controller/GetCapacity",
        Row::Refused(Code::InvalidArgument),
    ),
    ("Controller/ControllerGetCapabilities", Row::NoFields),
    (
        "Controller/CreateSnapshot",
        Row::Refused(Code::InvalidArgument),
    ),
    (
        "Controller/DeleteSnapshot",
        Row::Refused(Code::InvalidArgument),
    ),
    ("Controller/ListSnapshots", Row::Refused(Code::Aborted)),
    (
        "Controller/GetSnapshot",
        Row::Refused(Code::InvalidArgument),
    ),
    (
        "Controller/ControllerExpandVolume",
        Row::Refused(Code::InvalidArgument),
    ),
    ("Controller/ControllerGetVolume", Row::NotServed),
    (
        "Controller/ControllerModifyVolume",
        Row::Refused(Code::InvalidArgument),
    ),
    (
        "GroupController/GroupControllerGetCapabilities",
        Row::NoFields,
    ),
    (
        "GroupController/CreateVolumeGroupSnapshot",
        Row::Refused(Code::InvalidArgument),
    ),
    (
        "GroupController/DeleteVolumeGroupSnapshot",
        Row::Refused(Code::InvalidArgument),
    ),
    (
        "GroupController/GetVolumeGroupSnapshot",
        Row::Refused(Code::InvalidArgument),
    ),
    (
        "SnapshotMetadata/GetMetadataAllocated",
        Row::Refused(Code::InvalidArgument),
    ),
    (
        "SnapshotMetadata/GetMetadataDelta",
        Row::Refused(Code::InvalidArgument),
    ),
    ("Node/NodeStageVolume", Row::Refused(Code::InvalidArgument)),
    (
        "Node/NodeUnstageVolume",
        Row::Refused(Code::InvalidArgument),
    ),
    (
        "Node/NodePublishVolume",
        Row::Refused(Code::InvalidArgument),
    ),
    (
        "Node/NodeUnpublishVolume",
        Row::Refused(Code::InvalidArgument),
    ),
    (
        "Node/NodeGetVolumeStats",
        Row::Refused(Code::InvalidArgument),
    ),
    ("Node/NodeExpandVolume", Row::Refused(Code::InvalidArgument)),
    ("Node/NodeGetCapabilities", Row::NoFields),
    ("Node/NodeGetInfo", Row::NoFields),
];

/// `Service/Method` → how many fields its request message has, from the descriptors.
fn methods() -> BTreeMap<String, usize> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/proto");
    let files = protox::compile(["csi/v1/csi.proto"], [root]).expect("compile the protos");
    let fields: HashMap<String, usize> = (files.file.iter())
        .flat_map(|f| {
            let package = f.package().to_owned();
            (f.message_type.iter())
                .map(move |m| (format!(".{package}.{}", m.name()), m.field.len()))
        })
        .collect();
    let mut methods = BTreeMap::new();
    for service in files.file.iter().flat_map(|f| &f.service) {
        for method in &service.method {
            let name = format!("{}/{}", service.name(), method.name());
            methods.insert(name, fields[method.input_type()]);
        }
    }
    methods
}

#[test]
fn the_table_has_a_row_for_every_method_the_protos_declare_and_no_other() {
    let declared: BTreeSet<String> = methods().into_keys().collect();
    let rows: BTreeSet<String> = TABLE.iter().map(|(m, _)| m.to_string()).collect();
    assert_eq!(
        declared, rows,
        "a method without a row, or a row without a method"
    );
    for (method, fields) in methods() {
        let no_fields = TABLE
            .iter()
            .any(|(m, r)| *m == method && *r == Row::NoFields);
        assert_eq!(no_fields, fields == 0, "{method}: {fields} fields");
    }
}

const LONG: usize = 129;

fn long() -> String {
    "x".repeat(LONG)
}

fn caps() -> Vec<VolumeCapability> {
    vec![rwo()]
}

/// One over-limit request to `method`; the code it gets (OK if it succeeded).
async fn over_limit(
    csi: &mut Csi,
    metadata: &mut SnapshotMetadataClient<tonic::transport::Channel>,
    method: &str,
) -> Code {
    fn code_of<T>(result: Result<tonic::Response<T>, tonic::Status>) -> Code {
        result.map_or_else(|s| s.code(), |_| Code::Ok)
    }
    let path = std::path::Path::new("/no/such/place");
    let (c, n, g, i) = (
        &mut csi.controller,
        &mut csi.node,
        &mut csi.group,
        &mut csi.identity,
    );
    match method {
        "Identity/GetPluginInfo" => code_of(i.get_plugin_info(GetPluginInfoRequest {}).await),
        "Identity/GetPluginCapabilities" => code_of(
            i.get_plugin_capabilities(GetPluginCapabilitiesRequest {})
                .await,
        ),
        "Identity/Probe" => code_of(i.probe(ProbeRequest {}).await),
        "Controller/CreateVolume" => code_of(c.create_volume(create_request(&long(), 1)).await),
        "Controller/DeleteVolume" => code_of(c.delete_volume(delete_request(&long())).await),
        "Controller/ControllerPublishVolume" => code_of(
            c.controller_publish_volume(ControllerPublishVolumeRequest {
                volume_id: long(),
                ..Default::default()
            })
            .await,
        ),
        "Controller/ControllerUnpublishVolume" => code_of(
            c.controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                volume_id: long(),
                ..Default::default()
            })
            .await,
        ),
        "Controller/ValidateVolumeCapabilities" => code_of(
            c.validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
                volume_id: long(),
                volume_capabilities: caps(),
                ..Default::default()
            })
            .await,
        ),
        "Controller/ListVolumes" => code_of(
            c.list_volumes(ListVolumesRequest {
                starting_token: "ab".repeat(10_000),
                ..Default::default()
            })
            .await,
        ),
        "Controller/GetCapacity" => code_of(
            c.get_capacity(GetCapacityRequest {
                parameters: [(long(), "v".repeat(4096))].into(),
                ..Default::default()
            })
            .await,
        ),
        "Controller/ControllerGetCapabilities" => code_of(
            c.controller_get_capabilities(ControllerGetCapabilitiesRequest {})
                .await,
        ),
        "Controller/CreateSnapshot" => code_of(
            c.create_snapshot(CreateSnapshotRequest {
                name: long(),
                source_volume_id: "vol-x".into(),
                ..Default::default()
            })
            .await,
        ),
        "Controller/DeleteSnapshot" => code_of(
            c.delete_snapshot(DeleteSnapshotRequest {
                snapshot_id: long(),
                ..Default::default()
            })
            .await,
        ),
        "Controller/ListSnapshots" => code_of(
            c.list_snapshots(ListSnapshotsRequest {
                starting_token: "ab".repeat(10_000),
                ..Default::default()
            })
            .await,
        ),
        "Controller/GetSnapshot" => code_of(
            c.get_snapshot(GetSnapshotRequest {
                snapshot_id: long(),
                ..Default::default()
            })
            .await,
        ),
        "Controller/ControllerExpandVolume" => code_of(
            c.controller_expand_volume(ControllerExpandVolumeRequest {
                volume_id: long(),
                capacity_range: Some(CapacityRange {
                    required_bytes: 1,
                    limit_bytes: 0,
                }),
                ..Default::default()
            })
            .await,
        ),
        "Controller/ControllerGetVolume" => code_of(
            c.controller_get_volume(ControllerGetVolumeRequest { volume_id: long() })
                .await,
        ),
        "Controller/ControllerModifyVolume" => code_of(
            c.controller_modify_volume(ControllerModifyVolumeRequest {
                volume_id: long(),
                ..Default::default()
            })
            .await,
        ),
        "GroupController/GroupControllerGetCapabilities" => code_of(
            g.group_controller_get_capabilities(GroupControllerGetCapabilitiesRequest {})
                .await,
        ),
        "GroupController/CreateVolumeGroupSnapshot" => code_of(
            g.create_volume_group_snapshot(CreateVolumeGroupSnapshotRequest {
                name: "group".into(),
                source_volume_ids: vec![long()],
                ..Default::default()
            })
            .await,
        ),
        "GroupController/DeleteVolumeGroupSnapshot" => code_of(
            g.delete_volume_group_snapshot(DeleteVolumeGroupSnapshotRequest {
                group_snapshot_id: long(),
                ..Default::default()
            })
            .await,
        ),
        "GroupController/GetVolumeGroupSnapshot" => code_of(
            g.get_volume_group_snapshot(GetVolumeGroupSnapshotRequest {
                group_snapshot_id: "group-1".into(),
                snapshot_ids: vec![long()],
                ..Default::default()
            })
            .await,
        ),
        "SnapshotMetadata/GetMetadataAllocated" => code_of(
            metadata
                .get_metadata_allocated(GetMetadataAllocatedRequest {
                    snapshot_id: long(),
                    ..Default::default()
                })
                .await,
        ),
        "SnapshotMetadata/GetMetadataDelta" => code_of(
            metadata
                .get_metadata_delta(GetMetadataDeltaRequest {
                    base_snapshot_id: long(),
                    ..Default::default()
                })
                .await,
        ),
        "Node/NodeStageVolume" => code_of(n.node_stage_volume(stage_request(&long(), path)).await),
        "Node/NodeUnstageVolume" => {
            code_of(n.node_unstage_volume(unstage_request(&long(), path)).await)
        }
        "Node/NodePublishVolume" => code_of(
            n.node_publish_volume(publish_request(&long(), path, path, false))
                .await,
        ),
        "Node/NodeUnpublishVolume" => code_of(
            n.node_unpublish_volume(unpublish_request(&long(), path))
                .await,
        ),
        "Node/NodeGetVolumeStats" => code_of(
            n.node_get_volume_stats(stats_request(&long(), "/no/such"))
                .await,
        ),
        "Node/NodeExpandVolume" => code_of(
            n.node_expand_volume(NodeExpandVolumeRequest {
                volume_id: long(),
                volume_path: "/no/such".into(),
                ..Default::default()
            })
            .await,
        ),
        "Node/NodeGetCapabilities" => {
            code_of(n.node_get_capabilities(NodeGetCapabilitiesRequest {}).await)
        }
        "Node/NodeGetInfo" => code_of(n.node_get_info(NodeGetInfoRequest {}).await),
        other => panic!("no request for {other}: add one with its row"),
    }
}

#[tokio::test]
async fn every_method_refuses_a_request_over_the_spec_limits_with_its_rows_code() {
    let (_sandbox, server, mut csi) = setup().await;
    let channel = csi_nodekit::socket::connect(&server.socket)
        .await
        .expect("connect");
    let mut metadata = SnapshotMetadataClient::new(channel);
    for (method, row) in TABLE {
        let want = match row {
            Row::Refused(code) => *code,
            Row::NoFields => Code::Ok,
            Row::NotServed => Code::Unimplemented,
        };
        let got = over_limit(&mut csi, &mut metadata, method).await;
        assert_eq!(got, want, "{method}");
    }
    server.stop().await;
}
