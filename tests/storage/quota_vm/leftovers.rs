//! Inside the VM: a quota'd volume's limit never silently left behind — an expansion while
//! sizes are not enforced is refused, and a deleted volume whose project still holds a file
//! elsewhere keeps a least limit on it.

use csi_nodekit::linux::quota::FsKind;
use csi_nodekit::proto::csi::*;

use super::cases::{MIB, open};
use super::fixtures::{NOBODY, Prep, TestFs, write_until_error};
use super::served::{Served, create_and_publish, expand, runtime};
use crate::common::csi_node;

fn expand_request(id: &str, bytes: u64) -> ControllerExpandVolumeRequest {
    ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        ..Default::default()
    }
}

pub fn expanding_a_quotad_volume_under_quota_off_is_refused_and_a_deleted_ones_leftovers_stay_limited(
    kind: FsKind,
) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let rt = runtime();
    let mut served = Served::start(&fs, "state", &["--quota=on"]);
    let pod = served.pod("a");
    let id = rt.block_on(async {
        let mut csi = served.client().await;
        create_and_publish(&mut csi, "pvc-a", 8 * MIB, &pod).await
    });
    let project = served.recorded_project(&id).expect("project");
    // Stopped, not dropped: its scratch directory holds the pod's mounts.
    assert_eq!(served.stop(), 0);
    let off = Served::start(&fs, "state", &["--quota=off"]);
    rt.block_on(async {
        let mut csi = off.client().await;
        let refused = csi
            .controller
            .controller_expand_volume(expand_request(&id, 16 * MIB))
            .await
            .expect_err("the limit would stay at 8 MiB");
        assert_eq!(
            refused.code(),
            tonic::Code::FailedPrecondition,
            "{refused:?}"
        );
        assert!(
            refused
                .message()
                .contains(&format!("project quota {project}")),
            "{}",
            refused.message()
        );
    });
    assert_eq!(
        q.usage(project).unwrap().limits.bytes,
        8 * MIB,
        "the limit in force"
    );
    drop(off);
    let mut on = Served::start(&fs, "state", &["--quota=on"]);
    rt.block_on(async {
        let mut csi = on.client().await;
        // Applied once sizes are enforced again.
        expand(&mut csi, &id, 16 * MIB, &pod.target).await;
        assert_eq!(q.usage(project).unwrap().limits.bytes, 16 * MIB);
        // A file of the volume hard-linked outside it (a directory without a project
        // allows it) stays charged to the project after the volume goes.
        // Linked through the volume's own directory: the pod's bind mount is another mount.
        let file = on.volume_dir(&id).join("kept");
        std::fs::write(&file, vec![1u8; MIB as usize]).unwrap();
        nix::unistd::chown(&file, Some(NOBODY.into()), Some(NOBODY.into())).unwrap();
        let outside = fs.mnt.join("kept-outside");
        std::fs::hard_link(&file, &outside).unwrap();
        csi.unpublish_and_unstage(&id, &pod.target, &pod.staging)
            .await;
        csi.controller
            .delete_volume(csi_node::delete_request(&id))
            .await
            .expect("delete volume");
    });
    fs.sync();
    let left = q.usage(project).unwrap();
    assert!(left.bytes >= MIB, "{left:?}");
    assert_eq!(
        (left.limits.bytes, left.limits.inodes),
        (4096, 1),
        "a least limit kept"
    );
    let w = write_until_error(&fs.mnt.join("kept-outside"), 8 * MIB, NOBODY);
    assert_eq!(
        w.errno,
        fs.limit_errno(),
        "the leftover writes no further: {w:?}"
    );
    assert!(w.bytes <= 64 << 10, "{w:?}");
    let logs = on.logs();
    assert!(
        logs.contains("still charged to its project quota"),
        "{logs}"
    );
    // Its ID is not handed out again while the file lives.
    rt.block_on(async {
        let mut csi = on.client().await;
        let b = csi_node::create(&mut csi, "pvc-b", MIB as i64).await;
        assert_ne!(on.recorded_project(&b), Some(project));
    });
    assert_eq!(on.stop(), 0);
}
