//! csi-sanity's specs of mutable parameters (`controller.go`: CreateVolume "with a volume
//! attribute class", and `ModifyVolume [Controller Server]`), run with a
//! `--csi.testvolumemutableparameters` file holding [`MUTABLE_PARAMETERS`].

use std::collections::HashMap;

use csi_nodekit::proto::csi::*;
use tonic::Code;

use super::*;

fn fake_parameters() -> HashMap<String, String> {
    let (key, value) = FAKE_MUTABLE_PARAMETER;
    [(key.to_owned(), value.to_owned())].into()
}

/// `MakeCreateVolumeReq` with `mutable_parameters`.
fn with_class(s: &Sanity, name: &str, parameters: HashMap<String, String>) -> CreateVolumeRequest {
    CreateVolumeRequest {
        mutable_parameters: parameters,
        ..s.create_request(name)
    }
}

pub async fn create_volume_with_a_volume_attribute_class_succeeds(s: &mut Sanity) {
    let name = s.unique("sanity-controller-vol-with-mutable-parameters");
    let request = with_class(s, &name, s.mutable_parameters.clone());
    s.create_volume(request).await.expect("CreateVolume");
}

pub async fn create_volume_with_an_invalid_volume_attribute_class_fails_with_invalid_argument(
    s: &mut Sanity,
) {
    let name = s.unique("sanity-controller-vol-with-mutable-parameters");
    let reply = s
        .create_volume(with_class(s, &name, fake_parameters()))
        .await;
    assert_eq!(code(reply), Code::InvalidArgument);
}

pub async fn modify_volume_fails_without_a_volume_id(s: &mut Sanity) {
    let reply = s
        .csi
        .controller
        .controller_modify_volume(s.modify_request(""));
    assert_eq!(code(reply.await), Code::InvalidArgument);
}

pub async fn modify_volume_fails_with_not_found_for_an_unknown_volume(s: &mut Sanity) {
    // As csi-sanity sends it with and without its parameters file.
    for parameters in [s.mutable_parameters.clone(), HashMap::new()] {
        let request = ControllerModifyVolumeRequest {
            mutable_parameters: parameters,
            ..s.modify_request("non-existing-volume-id")
        };
        let reply = s.csi.controller.controller_modify_volume(request).await;
        assert_eq!(code(reply), Code::NotFound);
    }
}

pub async fn modify_volume_fails_for_mutable_parameters_the_volume_does_not_support(
    s: &mut Sanity,
) {
    let name = s.unique("sanity-modify-volume-unsupported");
    let id = s.must_create(s.create_request(&name)).await.volume_id;
    let request = ControllerModifyVolumeRequest {
        mutable_parameters: fake_parameters(),
        ..s.modify_request(&id)
    };
    let reply = s.csi.controller.controller_modify_volume(request).await;
    assert_eq!(code(reply), Code::InvalidArgument);
}

pub async fn modify_volume_of_a_volume_created_without_a_volume_attribute_class_succeeds(
    s: &mut Sanity,
) {
    let name = s.unique("sanity-modify-volume");
    let id = s.must_create(s.create_request(&name)).await.volume_id;
    let reply = s
        .csi
        .controller
        .controller_modify_volume(s.modify_request(&id));
    reply.await.expect("ControllerModifyVolume");
}

pub async fn modify_volume_of_a_volume_created_with_a_volume_attribute_class_succeeds(
    s: &mut Sanity,
) {
    let name = s.unique("sanity-modify-volume-with-vac");
    let request = with_class(s, &name, s.mutable_parameters.clone());
    let id = s.must_create(request).await.volume_id;
    let reply = s
        .csi
        .controller
        .controller_modify_volume(s.modify_request(&id));
    reply
        .await
        .expect("ControllerModifyVolume to the same parameters");
}

pub async fn modify_volume_of_a_volume_created_with_a_volume_attribute_class_fails_for_unsupported_new_parameters(
    s: &mut Sanity,
) {
    let name = s.unique("sanity-modify-volume-with-vac-not-supported");
    let request = with_class(s, &name, s.mutable_parameters.clone());
    let id = s.must_create(request).await.volume_id;
    let request = ControllerModifyVolumeRequest {
        mutable_parameters: fake_parameters(),
        ..s.modify_request(&id)
    };
    let reply = s.csi.controller.controller_modify_volume(request).await;
    assert_eq!(code(reply), Code::InvalidArgument);
}
