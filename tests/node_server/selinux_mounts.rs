//! SELinux `context=` mounts, as the kubelet asks for them when the CSIDriver says
//! `seLinuxMount: true`: an image volume's filesystem takes the context at stage (its own
//! superblock, so every file has the label and nothing is relabelled), and a directory volume,
//! a bind mount showing the state directory's label, is refused with a reason, at stage and at
//! publish. On this machine's kernel (no SELinux) the context reaches the mount and the kernel
//! refuses it — the stage fails naming it, and leaves nothing mounted or attached; the quota VM
//! has no SELinux policy to load, so the accepted path is not exercised here.

use crate::common::csi_block::*;
use crate::common::csi_node::*;
use crate::common::scratch_fs::Kind;
use csi_nodekit::proto::csi::volume_capability::access_mode::Mode;
use csi_nodekit::proto::csi::*;
use tonic::Code;

use super::image::image_create;

const LABEL: &str = "system_u:object_r:container_file_t:s0:c12,c34";

/// A mount capability with the context flag as the kubelet writes it (quoted: the level has a
/// comma), beside an ordinary flag.
fn with_context() -> VolumeCapability {
    capability(
        Mode::SingleNodeWriter,
        &["noatime", &format!("context=\"{LABEL}\"")],
    )
}

/// Whether this kernel runs SELinux with a policy loaded.
fn selinux_enabled() -> bool {
    std::path::Path::new("/sys/fs/selinux/enforce").exists()
}

#[ignore = "needs root: real loop devices, ext4, XFS and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_volume_refuses_an_selinux_context_at_stage_and_publish_naming_the_layout_that_takes_one()
 {
    let (node, _server, mut csi) = start_block_node(Kind::Xfs).await;
    let sandbox = &node.sandbox;
    let id = create_with(&mut csi, create_request("pvc-dir", MIB as i64)).await;
    let staging = sandbox.dir("staging");
    let stage = NodeStageVolumeRequest {
        volume_capability: Some(with_context()),
        ..stage_request(&id, &staging)
    };
    let refused = csi.node.node_stage_volume(stage).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    for named in [LABEL, "layout: image", "seLinuxMount: false"] {
        assert!(
            refused.message().contains(named),
            "{named}: {}",
            refused.message()
        );
    }
    assert!(sandbox.mounts().is_empty(), "nothing mounted");

    csi.node
        .node_stage_volume(stage_request(&id, &staging))
        .await
        .expect("stage without a context");
    let target = sandbox.dir("pods").join("t");
    let publish = NodePublishVolumeRequest {
        volume_capability: Some(with_context()),
        ..publish_request(&id, &staging, &target, false)
    };
    let refused = csi.node.node_publish_volume(publish).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains(LABEL), "{}", refused.message());
    assert_eq!(sandbox.mounts(), vec![staging], "the target not mounted");

    let malformed = NodeStageVolumeRequest {
        volume_capability: Some(capability(Mode::SingleNodeWriter, &["context=nolabel"])),
        ..stage_request(&id, &sandbox.dir("staging"))
    };
    let refused = csi.node.node_stage_volume(malformed).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().contains("not an SELinux context"),
        "{}",
        refused.message()
    );
}

#[ignore = "needs root: real loop devices, ext4 and bind mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_volumes_stage_hands_the_selinux_context_to_its_filesystems_mount() {
    let (node, _server, mut csi) = start_block_node(Kind::Ext4).await;
    let (state, sandbox) = (node.state.clone(), &node.sandbox);
    let id = create_with(&mut csi, image_create("pvc-image", 16 * MIB, &[])).await;
    let staging = sandbox.dir("staging");
    let stage = NodeStageVolumeRequest {
        volume_capability: Some(with_context()),
        ..stage_request(&id, &staging)
    };
    let staged = csi.node.node_stage_volume(stage).await;
    if selinux_enabled() {
        staged.expect("stage with the context");
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line = (table.lines())
            .find(|l| l.contains(&format!(" {} ", staging.display())))
            .expect("the staging mount");
        assert!(
            line.contains(LABEL),
            "the context on the superblock: {line}"
        );
        return;
    }
    // No SELinux here: the kernel (ext4, with no security module to take the key) refuses the
    // context, which proves it reached the mount, and the stage undoes itself.
    let refused = staged.unwrap_err();
    assert_eq!(refused.code(), Code::Internal, "{refused:?}");
    for named in ["context=", LABEL, "SELinux"] {
        assert!(
            refused.message().contains(named),
            "{named}: {}",
            refused.message()
        );
    }
    assert!(sandbox.mounts().is_empty(), "nothing mounted");
    assert_eq!(attached_under(&state), 0, "no loop device left attached");
    eprintln!("NOTE: no SELinux on this kernel: the context reached the mount and was refused");
    csi.node
        .node_stage_volume(stage_request(&id, &staging))
        .await
        .expect("the same volume stages without a context");
}
