//! The generated gRPC code speaks the exact method paths of the CSI spec and the kubelet's
//! plugin-registration API: clients send them, servers answer on them.

use std::sync::{Arc, Mutex};

use csi_nodekit::proto::{csi, registration};
use tonic::codegen::http;
use tonic::server::NamedService;

type Seen = Arc<Mutex<Vec<String>>>;

/// A channel stand-in that records the path of every request and answers with an empty body.
type Recorder = tower::util::BoxCloneService<
    http::Request<tonic::body::Body>,
    http::Response<tonic::body::Body>,
    std::convert::Infallible,
>;

fn recorder() -> (Recorder, Seen) {
    let seen = Seen::default();
    let record = seen.clone();
    let service = tower::service_fn(move |req: http::Request<tonic::body::Body>| {
        record.lock().unwrap().push(req.uri().path().to_owned());
        async { Ok::<_, std::convert::Infallible>(http::Response::new(tonic::body::Body::empty())) }
    });
    (Recorder::new(service), seen)
}

macro_rules! path_of {
    ($client:path, $method:ident) => {{
        let (service, seen) = recorder();
        let mut client = <$client>::new(service);
        let _ = client
            .$method(tonic::Request::new(Default::default()))
            .await;
        let path = seen.lock().unwrap().pop().expect("a request was sent");
        path
    }};
}

#[tokio::test]
async fn clients_send_the_exact_method_paths() {
    use csi::controller_client::ControllerClient as C;
    use csi::identity_client::IdentityClient as I;
    use csi::node_client::NodeClient as N;
    use registration::registration_client::RegistrationClient as R;
    let table = [
        (
            path_of!(I<_>, get_plugin_info),
            "/csi.v1.Identity/GetPluginInfo",
        ),
        (
            path_of!(I<_>, get_plugin_capabilities),
            "/csi.v1.Identity/GetPluginCapabilities",
        ),
        (path_of!(I<_>, probe), "/csi.v1.Identity/Probe"),
        (
            path_of!(N<_>, node_stage_volume),
            "/csi.v1.Node/NodeStageVolume",
        ),
        (
            path_of!(N<_>, node_unstage_volume),
            "/csi.v1.Node/NodeUnstageVolume",
        ),
        (
            path_of!(N<_>, node_publish_volume),
            "/csi.v1.Node/NodePublishVolume",
        ),
        (
            path_of!(N<_>, node_unpublish_volume),
            "/csi.v1.Node/NodeUnpublishVolume",
        ),
        (
            path_of!(N<_>, node_get_volume_stats),
            "/csi.v1.Node/NodeGetVolumeStats",
        ),
        (
            path_of!(N<_>, node_expand_volume),
            "/csi.v1.Node/NodeExpandVolume",
        ),
        (
            path_of!(N<_>, node_get_capabilities),
            "/csi.v1.Node/NodeGetCapabilities",
        ),
        (path_of!(N<_>, node_get_info), "/csi.v1.Node/NodeGetInfo"),
        (
            path_of!(C<_>, create_volume),
            "/csi.v1.Controller/CreateVolume",
        ),
        (
            path_of!(C<_>, delete_volume),
            "/csi.v1.Controller/DeleteVolume",
        ),
        (
            path_of!(C<_>, controller_publish_volume),
            "/csi.v1.Controller/ControllerPublishVolume",
        ),
        (
            path_of!(C<_>, controller_unpublish_volume),
            "/csi.v1.Controller/ControllerUnpublishVolume",
        ),
        (
            path_of!(C<_>, validate_volume_capabilities),
            "/csi.v1.Controller/ValidateVolumeCapabilities",
        ),
        (
            path_of!(C<_>, list_volumes),
            "/csi.v1.Controller/ListVolumes",
        ),
        (
            path_of!(C<_>, get_capacity),
            "/csi.v1.Controller/GetCapacity",
        ),
        (
            path_of!(C<_>, controller_get_capabilities),
            "/csi.v1.Controller/ControllerGetCapabilities",
        ),
        (
            path_of!(C<_>, create_snapshot),
            "/csi.v1.Controller/CreateSnapshot",
        ),
        (
            path_of!(C<_>, delete_snapshot),
            "/csi.v1.Controller/DeleteSnapshot",
        ),
        (
            path_of!(C<_>, list_snapshots),
            "/csi.v1.Controller/ListSnapshots",
        ),
        (
            path_of!(C<_>, get_snapshot),
            "/csi.v1.Controller/GetSnapshot",
        ),
        (
            path_of!(C<_>, controller_expand_volume),
            "/csi.v1.Controller/ControllerExpandVolume",
        ),
        (
            path_of!(C<_>, controller_get_volume),
            "/csi.v1.Controller/ControllerGetVolume",
        ),
        (
            path_of!(C<_>, controller_modify_volume),
            "/csi.v1.Controller/ControllerModifyVolume",
        ),
        (
            path_of!(R<_>, get_info),
            "/pluginregistration.Registration/GetInfo",
        ),
        (
            path_of!(R<_>, notify_registration_status),
            "/pluginregistration.Registration/NotifyRegistrationStatus",
        ),
    ];
    for (sent, expected) in table {
        assert_eq!(sent, expected);
    }
}

#[test]
fn servers_are_named_after_their_proto_services() {
    struct Unused;
    fn name<S: NamedService>() -> &'static str {
        S::NAME
    }
    assert_eq!(
        name::<csi::identity_server::IdentityServer<Unused>>(),
        "csi.v1.Identity"
    );
    assert_eq!(
        name::<csi::node_server::NodeServer<Unused>>(),
        "csi.v1.Node"
    );
    assert_eq!(
        name::<csi::controller_server::ControllerServer<Unused>>(),
        "csi.v1.Controller"
    );
    assert_eq!(
        name::<csi::group_controller_server::GroupControllerServer<Unused>>(),
        "csi.v1.GroupController"
    );
    assert_eq!(
        name::<csi::snapshot_metadata_server::SnapshotMetadataServer<Unused>>(),
        "csi.v1.SnapshotMetadata"
    );
    assert_eq!(
        name::<registration::registration_server::RegistrationServer<Unused>>(),
        "pluginregistration.Registration"
    );
}

#[tokio::test]
async fn a_real_server_answers_on_the_exact_identity_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    let perms = csi_nodekit::socket::Permissions {
        mode: 0o600,
        gid: None,
    };
    let (listener, _guard) = csi_nodekit::socket::bind_tokio(&path, perms).unwrap();
    let (trigger, shutdown) = csi_nodekit::shutdown::Shutdown::manual();
    let config = csi_nodekit::node_server::Config::new(
        "paths.example.io",
        "node-1",
        dir.path().join("state"),
    );
    let plugin = crate::common::csi_node::open(config, csi_nodekit::node_server::Seams::linux());
    let server = tokio::spawn(csi_nodekit::node_server::serve(listener, plugin, shutdown));
    let channel = csi_nodekit::socket::connect(&path).await.unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let codec =
        tonic_prost::ProstCodec::<csi::GetPluginInfoRequest, csi::GetPluginInfoResponse>::default();
    let path_and_query = http::uri::PathAndQuery::from_static("/csi.v1.Identity/GetPluginInfo");
    let reply = grpc
        .unary(
            tonic::Request::new(csi::GetPluginInfoRequest {}),
            path_and_query,
            codec,
        )
        .await
        .unwrap();
    assert_eq!(reply.into_inner().name, "paths.example.io");
    trigger.fire();
    server.await.unwrap().unwrap();
}
