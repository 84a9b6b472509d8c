//! csi-sanity's Identity Service and Controller Service specs (`identity.go`, `controller.go`).

use csi_nodekit::proto::csi::*;
use tonic::Code;

use super::*;

pub async fn get_plugin_capabilities_returns_only_capabilities_csi_sanity_knows(s: &mut Sanity) {
    use plugin_capability::{Type, service, volume_expansion};
    let reply = s
        .csi
        .identity
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {});
    let caps = reply.await.expect("GetPluginCapabilities").into_inner();
    let (mut services, mut expansion) = (Vec::new(), Vec::new());
    for cap in &caps.capabilities {
        match &cap.r#type {
            Some(Type::Service(svc)) => services.push(service::Type::try_from(svc.r#type)),
            Some(Type::VolumeExpansion(e)) => {
                expansion.push(volume_expansion::Type::try_from(e.r#type))
            }
            None => panic!("csi-sanity fails on a capability of no type: {cap:?}"),
        }
    }
    for known in &services {
        assert!(
            matches!(
                known,
                Ok(service::Type::ControllerService
                    | service::Type::VolumeAccessibilityConstraints
                    | service::Type::GroupControllerService)
            ),
            "csi-sanity fails on service {known:?}"
        );
    }
    for known in &expansion {
        assert!(
            matches!(
                known,
                Ok(volume_expansion::Type::Online | volume_expansion::Type::Offline)
            ),
            "csi-sanity fails on expansion {known:?}"
        );
    }
    // What the specs below assume: the controller, topology and the group controller are
    // there, expansion online.
    assert_eq!(services.len(), 3);
    assert_eq!(expansion, [Ok(volume_expansion::Type::Online)]);
}

pub async fn probe_returns_appropriate_information(s: &mut Sanity) {
    let reply = s.csi.identity.probe(ProbeRequest {}).await;
    assert!(
        reply
            .expect("Probe")
            .into_inner()
            .ready
            .is_some_and(|ready| ready)
    );
}

pub async fn get_plugin_info_returns_a_name_csi_sanity_accepts(s: &mut Sanity) {
    let reply = s
        .csi
        .identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await;
    let info = reply.expect("GetPluginInfo").into_inner();
    assert!(sanity_accepts_name(&info.name), "{:?}", info.name);
    assert!(!info.vendor_version.is_empty());
    // The name a plain `csi-node-server` reports passes too.
    assert!(sanity_accepts_name(DEFAULT_DRIVER_NAME));
}

/// The RPC capabilities csi-sanity v5.4 knows (`ControllerGetCapabilities` "should return
/// appropriate capabilities" fails on any other).
const KNOWN_V5_4: [Type; 14] = [
    Type::CreateDeleteVolume,
    Type::PublishUnpublishVolume,
    Type::ListVolumes,
    Type::GetCapacity,
    Type::CreateDeleteSnapshot,
    Type::ListSnapshots,
    Type::PublishReadonly,
    Type::CloneVolume,
    Type::ExpandVolume,
    Type::ModifyVolume,
    Type::ListVolumesPublishedNodes,
    Type::GetVolume,
    Type::VolumeCondition,
    Type::SingleNodeMultiWriter,
];

use controller_service_capability::rpc::Type;

/// The controller's RPC capabilities, each checked against csi-sanity's list `known`.
pub async fn controller_capabilities(s: &mut Sanity, known: &[Type]) -> Vec<Type> {
    use controller_service_capability::Type as Kind;
    let reply = s
        .csi
        .controller
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {});
    let caps = reply
        .await
        .expect("ControllerGetCapabilities")
        .into_inner()
        .capabilities;
    let kinds: Vec<Type> = (caps.iter())
        .map(|cap| match &cap.r#type {
            Some(Kind::Rpc(rpc)) => Type::try_from(rpc.r#type).expect("a known RPC type"),
            None => panic!("csi-sanity fails on a capability without an RPC"),
        })
        .collect();
    for kind in &kinds {
        assert!(known.contains(kind), "csi-sanity fails on {kind:?}");
    }
    kinds
}

/// What the controller advertises by default, in the enum's order; with
/// `--advertise-get-snapshot`, GET_SNAPSHOT too.
pub const ADVERTISED: [Type; 9] = [
    Type::CreateDeleteVolume,
    Type::ListVolumes,
    Type::GetCapacity,
    Type::CreateDeleteSnapshot,
    Type::ListSnapshots,
    Type::CloneVolume,
    Type::ExpandVolume,
    Type::SingleNodeMultiWriter,
    Type::ModifyVolume,
];

/// The capabilities as a set, in the enum's order (csi-sanity does not care for the order).
async fn advertised(s: &mut Sanity, known: &[Type]) -> Vec<Type> {
    let mut kinds = controller_capabilities(s, known).await;
    kinds.sort_by_key(|kind| *kind as i32);
    kinds
}

pub async fn controller_get_capabilities_returns_only_capabilities_csi_sanity_knows(
    s: &mut Sanity,
) {
    // What decides which controller specs run: these, and no controller publish.
    assert_eq!(advertised(s, &KNOWN_V5_4).await, ADVERTISED);
}

/// The same spec in csi-sanity v5.5, which knows GET_SNAPSHOT too.
pub async fn controller_get_capabilities_with_get_snapshot_returns_only_capabilities_v5_5_knows(
    s: &mut Sanity,
) {
    let known: Vec<Type> = KNOWN_V5_4.into_iter().chain([Type::GetSnapshot]).collect();
    let expected: Vec<Type> = ADVERTISED.into_iter().chain([Type::GetSnapshot]).collect();
    assert_eq!(advertised(s, &known).await, expected);
}

pub async fn get_capacity_returns_capacity_with_no_optional_values(s: &mut Sanity) {
    let reply = s
        .csi
        .controller
        .get_capacity(GetCapacityRequest::default())
        .await;
    assert!(reply.expect("GetCapacity").into_inner().available_capacity >= 0);
}

pub async fn list_volumes_returns_entries_that_each_carry_a_volume_id(s: &mut Sanity) {
    // csi-sanity checks whatever exists; one volume makes the check mean something.
    let id = s
        .must_create(s.create_request(&s.unique("sanity-list")))
        .await
        .volume_id;
    let (ids, _) = s.list_ids(0, "").await;
    assert!(ids.contains(&id));
}

pub async fn list_volumes_fails_with_aborted_on_an_invalid_starting_token(s: &mut Sanity) {
    let request = ListVolumesRequest {
        max_entries: 0,
        starting_token: "invalid-token".into(),
    };
    assert_eq!(
        code(s.csi.controller.list_volumes(request).await),
        Code::Aborted
    );
}

/// CreateVolume as csi-sanity's ListVolumes specs send it: a capability and nothing else, so
/// the volume gets our default size.
fn unsized_request(s: &Sanity, name: &str) -> CreateVolumeRequest {
    s.with_access(CreateVolumeRequest {
        capacity_range: None,
        ..create_request(name, 0)
    })
}

pub async fn list_volumes_shows_new_volumes_and_forgets_deleted_ones(s: &mut Sanity) {
    let before = s.list_ids(0, "").await.0.len();
    let id = s.must_create(unsized_request(s, "sanity")).await.volume_id;
    assert_eq!(s.list_ids(0, "").await.0.len(), before + 1);
    s.delete_volume(&id).await;
    assert_eq!(s.list_ids(0, "").await.0.len(), before);
}

/// Pending upstream (`XIt`: fragile for index-based tokens, csi-test#223), kept here because
/// our tokens name the next volume and must survive exactly this.
pub async fn list_volumes_pagination_survives_volumes_added_and_the_page_deleted_between_pages(
    s: &mut Sanity,
) {
    let (min_volumes, max_entries) = (3, 2);
    let mut existing: std::collections::HashMap<String, bool> = s
        .list_ids(0, "")
        .await
        .0
        .into_iter()
        .map(|id| (id, true))
        .collect();
    for i in existing.len()..min_volumes {
        let id = s
            .must_create(unsized_request(s, &format!("sanity{i}")))
            .await
            .volume_id;
        existing.insert(id, true);
    }
    let min_volumes = existing.len().max(min_volumes);
    let (page, token) = s.list_ids(max_entries as i32, "").await;
    assert_eq!(page.len(), max_entries);
    for id in &page {
        assert_eq!(existing.get(id), Some(&true));
        s.delete_volume(id).await;
        existing.insert(id.clone(), false);
    }
    let added = s
        .must_create(unsized_request(s, "new-addition"))
        .await
        .volume_id;
    existing.insert(added, true);
    let (rest, _) = s.list_ids(0, &token).await;
    assert!(rest.len() <= min_volumes - max_entries + 1, "{rest:?}");
    for id in rest {
        // Present, not deleted, and not listed twice.
        assert_eq!(existing.insert(id, false), Some(true));
    }
}

pub async fn create_volume_fails_without_a_name(s: &mut Sanity) {
    let reply = s.create_volume(CreateVolumeRequest::default()).await;
    assert_eq!(code(reply), Code::InvalidArgument);
}

pub async fn create_volume_fails_without_volume_capabilities(s: &mut Sanity) {
    let request = CreateVolumeRequest {
        name: s.unique("sanity-controller-create-no-volume-capabilities"),
        ..Default::default()
    };
    assert_eq!(code(s.create_volume(request).await), Code::InvalidArgument);
}

/// CreateVolume with the test size as the only bound.
fn sized_request(s: &Sanity, name: &str, size: i64) -> CreateVolumeRequest {
    s.with_access(create_request(name, size))
}

pub async fn create_volume_succeeds_for_a_single_node_writer_of_the_test_size(s: &mut Sanity) {
    let name = s.unique("sanity-controller-create-single-no-capacity");
    s.must_create(sized_request(s, &name, s.size)).await;
}

pub async fn create_volume_returns_at_least_the_capacity_asked_for(s: &mut Sanity) {
    let name = s.unique("sanity-controller-create-single-with-capacity");
    let volume = s.must_create(sized_request(s, &name, s.size)).await;
    assert!(volume.capacity_bytes >= s.size, "{}", volume.capacity_bytes);
}

pub async fn create_volume_with_an_existing_name_and_the_same_capacity_returns_the_same_volume(
    s: &mut Sanity,
) {
    let name = s.unique("sanity-controller-create-twice");
    let first = s.must_create(sized_request(s, &name, s.size)).await;
    let second = s.must_create(sized_request(s, &name, s.size)).await;
    assert!(first.capacity_bytes >= s.size && second.capacity_bytes >= s.size);
    assert_eq!(first.volume_id, second.volume_id);
}

pub async fn create_volume_with_an_existing_name_and_a_different_capacity_already_exists(
    s: &mut Sanity,
) {
    let name = s.unique("sanity-controller-create-twice-different");
    s.must_create(s.create_request(&name)).await;
    let twice = CreateVolumeRequest {
        capacity_range: Some(CapacityRange {
            required_bytes: 2 * s.size,
            limit_bytes: 2 * s.size,
        }),
        ..s.create_request(&name)
    };
    assert_eq!(code(s.create_volume(twice).await), Code::AlreadyExists);
}

pub async fn create_volume_accepts_a_name_of_the_maximum_length(s: &mut Sanity) {
    let mut name = s.unique("sanity-controller-create-maxlen");
    name.extend(std::iter::repeat_n('x', MAX_NAME_LENGTH - name.len()));
    let volume = s.must_create(sized_request(s, &name, s.size)).await;
    assert!(volume.capacity_bytes >= s.size);
}

pub async fn delete_volume_fails_without_a_volume_id(s: &mut Sanity) {
    let reply = s.csi.controller.delete_volume(delete_request("")).await;
    assert_eq!(code(reply), Code::InvalidArgument);
}

pub async fn delete_volume_succeeds_for_an_invalid_volume_id(s: &mut Sanity) {
    let reply = s
        .csi
        .controller
        .delete_volume(delete_request(INVALID_VOLUME_ID))
        .await;
    reply.expect("DeleteVolume of an ID that names nothing");
}

pub async fn delete_volume_deletes_a_created_volume(s: &mut Sanity) {
    let name = s.unique("sanity-controller-create-appropriate");
    let id = s
        .must_create(sized_request(s, &name, s.size))
        .await
        .volume_id;
    s.delete_volume(&id).await;
    assert!(!s.list_ids(0, "").await.0.contains(&id));
}

fn validate_request(id: &str, caps: Vec<VolumeCapability>) -> ValidateVolumeCapabilitiesRequest {
    ValidateVolumeCapabilitiesRequest {
        volume_id: id.into(),
        volume_capabilities: caps,
        ..Default::default()
    }
}

pub async fn validate_volume_capabilities_fails_without_a_volume_id(s: &mut Sanity) {
    let reply = s
        .csi
        .controller
        .validate_volume_capabilities(validate_request("", vec![]));
    assert_eq!(code(reply.await), Code::InvalidArgument);
}

pub async fn validate_volume_capabilities_fails_without_capabilities(s: &mut Sanity) {
    let name = s.unique("sanity-controller-validate-nocaps");
    let id = s
        .must_create(sized_request(s, &name, s.size))
        .await
        .volume_id;
    let reply = s
        .csi
        .controller
        .validate_volume_capabilities(validate_request(&id, vec![]));
    assert_eq!(code(reply.await), Code::InvalidArgument);
}

pub async fn validate_volume_capabilities_confirms_with_the_capabilities(s: &mut Sanity) {
    let name = s.unique("sanity-controller-validate");
    let id = s
        .must_create(sized_request(s, &name, s.size))
        .await
        .volume_id;
    let request = validate_request(&id, vec![s.rwo()]);
    let reply = s.csi.controller.validate_volume_capabilities(request).await;
    let reply = reply.expect("ValidateVolumeCapabilities").into_inner();
    // csi-sanity: a confirmation must carry the capabilities. Ours confirms a mount volume.
    let confirmed = reply.confirmed.expect("a mount capability is confirmed");
    assert!(!confirmed.volume_capabilities.is_empty());
}

pub async fn validate_volume_capabilities_fails_with_not_found_for_an_unknown_volume(
    s: &mut Sanity,
) {
    let request = validate_request(&unknown_volume_id(), vec![s.rwo()]);
    let reply = s.csi.controller.validate_volume_capabilities(request).await;
    assert_eq!(code(reply), Code::NotFound);
}

/// `MakeExpandVolumeReq`: the expand size, and the capability.
fn expand_request(s: &Sanity, id: &str, size: i64) -> ControllerExpandVolumeRequest {
    ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: size,
            limit_bytes: 0,
        }),
        volume_capability: Some(s.rwo()),
        ..Default::default()
    }
}

pub async fn controller_expand_volume_fails_without_a_volume_id(s: &mut Sanity) {
    let reply = s
        .csi
        .controller
        .controller_expand_volume(expand_request(s, "", s.expand_size()));
    assert_eq!(code(reply.await), Code::InvalidArgument);
}

pub async fn controller_expand_volume_fails_without_a_capacity_range(s: &mut Sanity) {
    // csi-sanity sends no volume ID either; the range alone must be refused as well.
    let name = s.unique("sanity-expand-no-range");
    let id = s.must_create(s.create_request(&name)).await.volume_id;
    for id in ["", id.as_str()] {
        let request = ControllerExpandVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        };
        let reply = s.csi.controller.controller_expand_volume(request).await;
        assert_eq!(code(reply), Code::InvalidArgument, "volume_id {id:?}");
    }
}

pub async fn controller_expand_volume_returns_exactly_the_size_asked_for(s: &mut Sanity) {
    let name = s.unique("sanity-expand-volume");
    let id = s
        .must_create(sized_request(s, &name, s.size))
        .await
        .volume_id;
    let reply = s
        .csi
        .controller
        .controller_expand_volume(expand_request(s, &id, s.expand_size()));
    let reply = reply.await.expect("ControllerExpandVolume").into_inner();
    assert_eq!(reply.capacity_bytes, s.expand_size());
}
