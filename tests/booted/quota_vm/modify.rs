//! Inside the VM: ControllerModifyVolume's `inodeLimit` on the real node-server binary — a
//! pod's writer stopped at the limit a VolumeAttributesClass set at CreateVolume, let on once
//! it is raised while the volume is published, the limit put back from the record after a
//! restart, and lifted again with `0`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use csi_nodekit::linux::quota::{FsKind, Limits};
use csi_nodekit::proto::csi::*;

use super::cases::{MIB, figure, open};
use super::fixtures::{NOBODY, Prep, TestFs, create_until_error};
use super::served::{Served, remove, runtime, stats};
use crate::common::csi_node::{self, Csi};

async fn modify_inode_limit(csi: &mut Csi, id: &str, limit: &str) {
    let request = ControllerModifyVolumeRequest {
        volume_id: id.into(),
        mutable_parameters: HashMap::from([("inodeLimit".to_owned(), limit.to_owned())]),
        ..Default::default()
    };
    let reply = csi.controller.controller_modify_volume(request).await;
    reply.expect("ControllerModifyVolume");
}

/// A directory the unprivileged writer may fill.
fn writable_dir(parent: &Path, name: &str) -> PathBuf {
    let dir = parent.join(name);
    std::fs::create_dir(&dir).expect("mkdir");
    nix::unistd::chown(&dir, Some(NOBODY.into()), Some(NOBODY.into())).expect("chown");
    dir
}

pub fn node_server_holds_a_volume_to_its_inode_limit_and_modify_volume_changes_it_live(
    kind: FsKind,
) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let mut served = Served::start(&fs, "state", &["--quota=on"]);
    let pod = served.pod("a");
    let limits = |inodes| Limits {
        bytes: 8 * MIB,
        inodes,
    };
    let (id, project) = runtime().block_on(async {
        let mut csi = served.client().await;
        let request = CreateVolumeRequest {
            mutable_parameters: HashMap::from([("inodeLimit".to_owned(), "20".to_owned())]),
            ..csi_node::create_request("pvc-inodes", (8 * MIB) as i64)
        };
        let reply = csi.controller.create_volume(request).await;
        let id = reply
            .expect("create")
            .into_inner()
            .volume
            .unwrap()
            .volume_id;
        let project = served.recorded_project(&id).expect("a recorded project ID");
        csi.stage_and_publish(&id, &pod.staging, &pod.target, false)
            .await;
        assert_eq!(q.usage(project).unwrap().limits, limits(20));
        // The volume's directory is one of its 20 inodes.
        let w = create_until_error(&pod.target, 1000, NOBODY);
        assert_eq!((w.bytes, w.errno), (19, fs.limit_errno()), "files, errno");
        let (_, inodes, _) = stats(&mut csi, &id, &pod.target).await;
        assert_eq!((inodes.total, inodes.used, inodes.available), (20, 20, 0));

        modify_inode_limit(&mut csi, &id, "50").await;
        assert_eq!(q.usage(project).unwrap().limits, limits(50));
        // The writer names its files from f0 again: a directory of its own (inode 21).
        let more = writable_dir(&pod.target, "more");
        let w = create_until_error(&more, 1000, NOBODY);
        assert_eq!(
            (w.bytes, w.errno),
            (29, fs.limit_errno()),
            "more files, errno"
        );
        figure(
            kind,
            format_args!("node-server volume: inodeLimit 20 then 50 stopped a pod at 20, then 50"),
        );

        (id, project)
    });
    // Knocked off behind node-server's back; the record puts it back at start-up.
    q.set_limits(project, limits(0)).unwrap();
    served.restart();
    assert_eq!(q.usage(project).unwrap().limits, limits(50));
    runtime().block_on(async {
        let mut csi = served.client().await;

        modify_inode_limit(&mut csi, &id, "0").await;
        assert_eq!(q.usage(project).unwrap().limits, limits(0), "0: no limit");
        let w = create_until_error(&writable_dir(&pod.target, "free"), 10, NOBODY);
        assert_eq!((w.bytes, w.errno), (10, 0), "no inode limit any more");
        remove(&mut csi, &id, &pod).await;
    });
}

/// Without an `inodeLimit`, a volume is held to one inode per 16 KiB of its size, at least
/// 1024: a pod making empty files stops there, not at the filesystem's last inode, and the
/// limit grows with an expansion.
pub fn node_server_bounds_a_volumes_inodes_by_default_from_its_size(kind: FsKind) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let served = Served::start(&fs, "state", &["--quota=on"]);
    let pod = served.pod("a");
    runtime().block_on(async {
        let mut csi = served.client().await;
        let request = csi_node::create_request("pvc-default-inodes", (8 * MIB) as i64);
        let reply = csi.controller.create_volume(request).await.expect("create");
        let id = reply.into_inner().volume.unwrap().volume_id;
        let project = served.recorded_project(&id).expect("a recorded project ID");
        let limits = q.usage(project).unwrap().limits;
        assert_eq!(
            (limits.bytes, limits.inodes),
            (8 * MIB, 1024),
            "8 MiB: the floor"
        );
        csi.stage_and_publish(&id, &pod.staging, &pod.target, false)
            .await;
        // The root and the writer's directory are two of the 1024.
        let w = create_until_error(&writable_dir(&pod.target, "empty"), 5000, NOBODY);
        assert_eq!((w.bytes, w.errno), (1022, fs.limit_errno()), "files, errno");
        let (_, inodes, _) = stats(&mut csi, &id, &pod.target).await;
        assert_eq!(
            (inodes.total, inodes.used, inodes.available),
            (1024, 1024, 0)
        );
        figure(
            kind,
            format_args!(
                "node-server volume of 8 MiB without inodeLimit: empty files stopped at 1024 inodes"
            ),
        );
        let expand = ControllerExpandVolumeRequest {
            volume_id: id.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: (32 * MIB) as i64,
                limit_bytes: 0,
            }),
            ..Default::default()
        };
        csi.controller
            .controller_expand_volume(expand)
            .await
            .expect("expand");
        assert_eq!(
            q.usage(project).unwrap().limits.inodes,
            2048,
            "32 MiB / 16 KiB"
        );
        remove(&mut csi, &id, &pod).await;
    });
}
