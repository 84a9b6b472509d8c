//! ControllerModifyVolume and mutable parameters through real gRPC: `rootMode` changing a
//! published volume at once and kept across a restart, the same keys at CreateVolume (from a
//! VolumeAttributesClass and from a StorageClass), and every refusal with its code, changing
//! nothing. (`inodeLimit` where sizes are enforced is tested under a Debian kernel, in
//! `booted::quota_vm`; here, where they are not, it must be refused.)

use crate::common;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::csi_node::*;
use csi_nodekit::proto::csi::*;
use tonic::Code;

fn parameters(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    (pairs.iter())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn modify(id: &str, pairs: &[(&str, &str)]) -> ControllerModifyVolumeRequest {
    ControllerModifyVolumeRequest {
        volume_id: id.into(),
        mutable_parameters: parameters(pairs),
        ..Default::default()
    }
}

fn with_class(name: &str, pairs: &[(&str, &str)]) -> CreateVolumeRequest {
    CreateVolumeRequest {
        mutable_parameters: parameters(pairs),
        ..create_request(name, 1 << 20)
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o7777
}

async fn created(csi: &mut Csi, request: CreateVolumeRequest) -> String {
    let reply = csi.controller.create_volume(request).await;
    reply
        .expect("CreateVolume")
        .into_inner()
        .volume
        .unwrap()
        .volume_id
}

#[ignore = "needs root: real bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_mode_reaches_a_published_volume_at_once_and_survives_a_restart() {
    let sandbox = MountSandbox::new();
    let staging = sandbox.dir("staging");
    let target = sandbox.dir("pods").join("t");
    let first = start(&sandbox, config(&sandbox)).await;
    let mut csi = first.client().await;
    let id = created(&mut csi, with_class("pvc-mode", &[("rootMode", "0750")])).await;
    csi.stage_and_publish(&id, &staging, &target, false).await;
    assert_eq!(mode(&target), 0o750, "the class's mode, as the pod sees it");
    std::fs::write(target.join("data"), b"kept").unwrap();
    let reply = csi
        .controller
        .controller_modify_volume(modify(&id, &[("rootMode", "2700")]));
    reply.await.expect("ControllerModifyVolume");
    assert_eq!(mode(&target), 0o2700, "changed in place, while published");
    let again = csi
        .controller
        .controller_modify_volume(modify(&id, &[("rootMode", "2700")]));
    again.await.expect("the same modification again");
    first.stop().await;

    let second = start(&sandbox, config(&sandbox)).await;
    let mut csi = second.client().await;
    // The record kept the modified value: the provisioner's retry with it finds the volume,
    // the original class's value is another volume's.
    let retry = created(&mut csi, with_class("pvc-mode", &[("rootMode", "2700")])).await;
    assert_eq!(retry, id);
    let other = csi
        .controller
        .create_volume(with_class("pvc-mode", &[("rootMode", "0750")]))
        .await;
    assert_eq!(code(other), Code::AlreadyExists);
    assert_eq!(mode(&target), 0o2700);
    assert_eq!(std::fs::read(target.join("data")).unwrap(), b"kept");
    csi.unpublish_and_unstage(&id, &target, &staging).await;
    csi.controller
        .delete_volume(delete_request(&id))
        .await
        .unwrap();
    second.stop().await;
}

#[tokio::test]
async fn a_storage_class_sets_the_same_keys_and_the_attribute_class_takes_precedence() {
    let (sandbox, server, mut csi) = setup().await;
    let volume_dir = |id: &str| sandbox.path().join("state/volumes").join(id);
    let from_class = CreateVolumeRequest {
        parameters: parameters(&[
            ("rootMode", "0755"),
            ("csi.storage.k8s.io/pvc/name", "data"),
        ]),
        ..create_request("pvc-class", 1 << 20)
    };
    let id = created(&mut csi, from_class).await;
    assert_eq!(mode(&volume_dir(&id)), 0o755);
    let both = CreateVolumeRequest {
        parameters: parameters(&[("rootMode", "0755")]),
        ..with_class("pvc-both", &[("rootMode", "0700")])
    };
    let id = created(&mut csi, both).await;
    assert_eq!(mode(&volume_dir(&id)), 0o700);
    let plain = created(&mut csi, create_request("pvc-plain", 1 << 20)).await;
    assert_eq!(mode(&volume_dir(&plain)), 0o777, "the default is untouched");
    let bad = CreateVolumeRequest {
        parameters: parameters(&[("rootMode", "rwx")]),
        ..create_request("pvc-bad", 1 << 20)
    };
    let status = csi.controller.create_volume(bad).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("rootMode"),
        "{}",
        status.message()
    );
    assert_eq!(csi.list().await.len(), 3, "the refused one was not created");
    server.stop().await;
}

#[tokio::test]
async fn refused_modifications_get_their_codes_and_change_nothing() {
    let (sandbox, server, mut csi) = setup().await;
    let id = created(&mut csi, with_class("pvc-a", &[("rootMode", "0750")])).await;
    let dir = sandbox.path().join("state/volumes").join(&id);
    let record = || std::fs::read(sandbox.path().join("state/meta").join(format!("{id}.json")));
    let before = record().unwrap();
    let cases: [(ControllerModifyVolumeRequest, Code, &str); 8] = [
        (
            modify("", &[("rootMode", "0700")]),
            Code::InvalidArgument,
            "volume_id",
        ),
        (
            modify("../x", &[("rootMode", "0700")]),
            Code::InvalidArgument,
            "volume_id",
        ),
        (
            modify("vol-unknown", &[("rootMode", "0700")]),
            Code::NotFound,
            "does not exist",
        ),
        (modify("vol-unknown", &[]), Code::NotFound, "does not exist"),
        (
            modify(&id, &[]),
            Code::InvalidArgument,
            "mutable_parameters is required",
        ),
        (
            modify(&id, &[("rootMode", "0700"), ("size", "2Gi")]),
            Code::InvalidArgument,
            "\"size\"",
        ),
        (
            modify(&id, &[("rootMode", "0800")]),
            Code::InvalidArgument,
            "octal",
        ),
        (
            modify(&id, &[("inodeLimit", "-5")]),
            Code::InvalidArgument,
            "whole number",
        ),
    ];
    for (request, expected, said) in cases {
        let shown = format!("{:?}", request.mutable_parameters);
        let status = csi
            .controller
            .controller_modify_volume(request)
            .await
            .unwrap_err();
        assert_eq!(status.code(), expected, "{shown}: {}", status.message());
        assert!(
            status.message().contains(said),
            "{shown}: {}",
            status.message()
        );
    }
    assert_eq!(mode(&dir), 0o750, "no refused change reached the volume");
    assert_eq!(record().unwrap(), before, "nor its record");
    server.stop().await;
}

#[tokio::test]
async fn an_inode_limit_is_refused_where_sizes_are_not_enforced() {
    // This machine's kernel has no XFS or ext4 quotas, so volumes here have no project.
    let (_sandbox, server, mut csi) = setup().await;
    let reply = csi
        .controller
        .create_volume(with_class("pvc-inodes", &[("inodeLimit", "1000")]))
        .await;
    let status = reply.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("inodeLimit"),
        "{}",
        status.message()
    );
    assert!(csi.list().await.is_empty(), "nothing was created");
    let id = created(&mut csi, create_request("pvc-plain", 1 << 20)).await;
    let reply = csi
        .controller
        .controller_modify_volume(modify(&id, &[("inodeLimit", "1000"), ("rootMode", "0700")]))
        .await;
    let status = reply.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());
    assert!(
        status
            .message()
            .contains("sizes are accounted, not enforced"),
        "{}",
        status.message()
    );
    server.stop().await;
}

#[tokio::test]
async fn validate_volume_capabilities_confirms_our_mutable_parameters_and_not_others() {
    let (_sandbox, server, mut csi) = setup().await;
    let id = created(&mut csi, create_request("pvc-v", 1 << 20)).await;
    let request = |pairs: &[(&str, &str)]| ValidateVolumeCapabilitiesRequest {
        volume_id: id.clone(),
        volume_capabilities: vec![rwo()],
        mutable_parameters: parameters(pairs),
        ..Default::default()
    };
    let ours = csi
        .controller
        .validate_volume_capabilities(request(&[("rootMode", "0770")]));
    let confirmed = ours
        .await
        .unwrap()
        .into_inner()
        .confirmed
        .expect("confirmed");
    assert_eq!(
        confirmed.mutable_parameters,
        parameters(&[("rootMode", "0770")])
    );
    let fake = csi
        .controller
        .validate_volume_capabilities(request(&[("XXX_FakeKey", "v")]));
    let reply = fake.await.unwrap().into_inner();
    assert!(reply.confirmed.is_none());
    assert!(reply.message.contains("XXX_FakeKey"), "{}", reply.message);
    server.stop().await;
}
