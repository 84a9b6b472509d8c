//! Inline ephemeral volumes of the image layout (`volumeAttributes: {layout: image}`) through
//! the real binary: an ext4 of their own mounted at the target itself, held to their size,
//! gone with their device at the unpublish; a layout that is neither is refused naming it.

use std::collections::HashMap;
use std::path::Path;

use super::image::spawn;
use crate::common::csi_block::*;
use crate::common::csi_node::*;
use crate::common::scratch_fs::Kind;
use csi_nodekit::proto::csi::*;
use tonic::Code;

fn inline(id: &str, target: &Path, layout: &str) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.display().to_string(),
        volume_capability: Some(rwo()),
        volume_context: HashMap::from([
            ("csi.storage.k8s.io/ephemeral".into(), "true".into()),
            ("csi.storage.k8s.io/pod.name".into(), "p".into()),
            ("size".into(), "10Mi".into()),
            ("layout".into(), layout.into()),
        ]),
        ..Default::default()
    }
}

#[ignore = "needs root: real loop devices, ext4 and mounts in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_image_volume_is_an_ext4_of_its_own_at_the_target_gone_with_its_device_at_unpublish()
 {
    let node = BlockNode::new(Kind::Ext4);
    let (state, sandbox) = (node.state.clone(), &node.sandbox);
    let (child, mut csi) = spawn(sandbox.path(), &state).await;
    let target = sandbox.dir("pods").join("inline");
    let id = "csi-00112233445566778899";
    for _ in 0..2 {
        (csi.node
            .node_publish_volume(inline(id, &target, "image"))
            .await)
            .expect("publish");
    }
    let device = the_one_direct_io_device(&state, id);
    let fs = nix::sys::statfs::statfs(&target).unwrap();
    assert_eq!(fs.filesystem_type(), nix::sys::statfs::EXT4_SUPER_MAGIC);
    let root = std::fs::metadata(&target).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::dev(&root), device.rdev());
    let listed = csi.list().await;
    assert_eq!(
        listed[0].capacity_bytes,
        16 << 20,
        "10Mi rounded up to the template's size"
    );
    // Held to its size by its own filesystem.
    let mut file = std::fs::File::create(target.join("fill")).unwrap();
    let chunk = vec![1u8; 1 << 20];
    let mut written = 0u64;
    let stopped = loop {
        match std::io::Write::write_all(&mut file, &chunk) {
            Ok(()) => written += 1 << 20,
            Err(e) => break e,
        }
        assert!(written <= 16 << 20, "wrote past the size");
    };
    assert_eq!(stopped.raw_os_error(), Some(libc::ENOSPC), "{stopped}");
    drop(file);
    for _ in 0..2 {
        (csi.node
            .node_unpublish_volume(unpublish_request(id, &target))
            .await)
            .expect("unpublish");
    }
    let attached = (std::fs::read_dir("/sys/block").unwrap().flatten()).filter(|entry| {
        let backing = std::fs::read_to_string(entry.path().join("loop/backing_file"));
        backing.is_ok_and(|file| file.contains(id))
    });
    assert_eq!(attached.count(), 0, "its device detached");
    assert!(!state.join("volumes").join(id).exists(), "its file gone");
    assert!(sandbox.mounts().is_empty(), "{:?}", sandbox.mounts());
    assert!(csi.list().await.is_empty());

    let err = (csi
        .node
        .node_publish_volume(inline("csi-ffee", &target, "zfs"))
        .await)
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("layout"), "{}", err.message());
    assert!(csi.list().await.is_empty(), "nothing made");
    eprintln!("an inline image volume of 16 MiB: a writer stopped by ENOSPC after {written} bytes");
    drop(child);
}
