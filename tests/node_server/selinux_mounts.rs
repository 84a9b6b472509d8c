//! SELinux `context=` mounts, as the kubelet asks for them when the CSIDriver says
//! `seLinuxMount: true`: an image volume's filesystem takes the context at stage (its own
//! superblock, so every file has the label and nothing is relabelled), and a directory volume,
//! a bind mount showing the state directory's label, is refused with a reason, at stage and at
//! publish. On this machine's kernel (no SELinux) the context reaches the mount and the kernel
//! refuses it — the stage fails naming it, and leaves nothing mounted or attached. The accepted
//! path runs under Debian's kernel booted with SELinux and its reference policy loaded
//! (`booted/selinux_vm.rs` runs the image test there): the label is on the filesystem's
//! superblock, the publish shows it, and a file a pod makes has it without any relabelling.

use crate::common::csi_block::*;
use crate::common::csi_node::*;
use crate::common::scratch_fs::Kind;
use csi_nodekit::proto::csi::volume_capability::access_mode::Mode;
use csi_nodekit::proto::csi::*;
use tonic::Code;

use super::image::image_create;

/// The label a pod's containers run with on an SELinux node (container-selinux's type, and an
/// MCS pair as the runtime picks one).
const LABEL: &str = "system_u:object_r:container_file_t:s0:c12,c34";
/// Where the loaded policy has no `container_file_t` (Debian's reference policy has no
/// container module), a label it has: `CSI_NODEKIT_SELINUX_LABEL`.
pub const LABEL_VARIABLE: &str = "CSI_NODEKIT_SELINUX_LABEL";
/// What the test prints when it took the accepted path, for the VM test to see.
pub const ACCEPTED: &str = "SELinux: the context is on the volume's filesystem and its files";

fn label() -> String {
    std::env::var(LABEL_VARIABLE).unwrap_or_else(|_| LABEL.to_owned())
}

/// A mount capability with the context flag as the kubelet writes it (quoted: the level has a
/// comma), beside an ordinary flag.
fn with_context() -> VolumeCapability {
    capability(
        Mode::SingleNodeWriter,
        &["noatime", &format!("context=\"{}\"", label())],
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
    for named in [&*label(), "layout: image", "seLinuxMount: false"] {
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
    assert!(
        refused.message().contains(&label()),
        "{}",
        refused.message()
    );
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
    let label = label();
    if selinux_enabled() {
        staged.expect("stage with the context");
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line = (table.lines())
            .find(|l| l.contains(&format!(" {} ", staging.display())))
            .expect("the staging mount");
        assert!(
            line.contains(&label),
            "the context on the superblock: {line}"
        );
        // The pod's bind shows it, and what the pod writes carries it: nothing to relabel.
        let target = sandbox.dir("pods").join("t");
        let publish = NodePublishVolumeRequest {
            volume_capability: Some(with_context()),
            ..publish_request(&id, &staging, &target, false)
        };
        csi.node
            .node_publish_volume(publish)
            .await
            .expect("publish with the context");
        std::fs::create_dir(target.join("data")).unwrap();
        std::fs::write(target.join("data/file"), b"x").unwrap();
        for made in ["data", "data/file", ""] {
            let xattr = xattr::get(target.join(made), "security.selinux").unwrap();
            let shown = String::from_utf8_lossy(&xattr.expect("a label"))
                .trim_end_matches('\0')
                .to_owned();
            assert_eq!(shown, label, "{made:?}");
        }
        csi.node
            .node_unpublish_volume(unpublish_request(&id, &target))
            .await
            .expect("unpublish");
        csi.node
            .node_unstage_volume(unstage_request(&id, &staging))
            .await
            .expect("unstage");
        eprintln!("{ACCEPTED}: {label}");
        return;
    }
    // No SELinux here: the kernel (ext4, with no security module to take the key) refuses the
    // context, which proves it reached the mount, and the stage undoes itself.
    let refused = staged.unwrap_err();
    assert_eq!(refused.code(), Code::Internal, "{refused:?}");
    for named in ["context=", &*label, "SELinux"] {
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
