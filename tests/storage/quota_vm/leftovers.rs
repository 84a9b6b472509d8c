//! Inside the VM: a quota'd volume's limit never silently left behind — an expansion while
//! sizes are not enforced is refused, and applied once they are.

use csi_nodekit::linux::quota::FsKind;
use csi_nodekit::proto::csi::*;

use super::cases::{MIB, open};
use super::fixtures::{Prep, TestFs};
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

pub fn expanding_a_quotad_volume_under_quota_off_is_refused_and_applied_once_enforced(
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
        csi.unpublish_and_unstage(&id, &pod.target, &pod.staging)
            .await;
        csi.controller
            .delete_volume(csi_node::delete_request(&id))
            .await
            .expect("delete volume");
    });
    assert_eq!(on.stop(), 0);
}
