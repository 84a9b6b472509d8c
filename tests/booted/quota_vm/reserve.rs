//! Inside the VM: no overcommit, as pods and the provisioner meet it — sizes and (on ext4)
//! inode limits reserved when volumes are created, GetCapacity less what is promised, a volume
//! that no longer fits refused with RESOURCE_EXHAUSTED unless `--overcommit`, and a volume's
//! stats never claiming more bytes or inodes than the filesystem has free once something
//! outside the volumes fills it.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use csi_nodekit::linux::quota::FsKind;
use csi_nodekit::proto::csi::*;
use tonic::Code;

use super::cases::{MIB, figure};
use super::fixtures::{NOBODY, Prep, TestFs, write_until_error};
use super::served::{Served, create_and_publish, runtime, stats};
use crate::common::csi_node::{self, Csi};

fn statvfs(path: &Path) -> nix::sys::statvfs::Statvfs {
    nix::sys::statvfs::statvfs(path).expect("statvfs")
}

/// Free bytes as GetCapacity and stats count them (an unprivileged user's).
fn free_bytes(path: &Path) -> u64 {
    let stat = statvfs(path);
    stat.blocks_available() * stat.fragment_size()
}

async fn capacity(csi: &mut Csi) -> u64 {
    let reply = csi.controller.get_capacity(GetCapacityRequest::default());
    reply
        .await
        .expect("GetCapacity")
        .into_inner()
        .available_capacity as u64
}

fn with_inode_limit(name: &str, bytes: u64, inodes: u64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        mutable_parameters: HashMap::from([("inodeLimit".to_owned(), inodes.to_string())]),
        ..csi_node::create_request(name, bytes as i64)
    }
}

/// Fills the filesystem from outside the volumes (root, as another tenant of the node's
/// disk would) until ENOSPC, then gives back `leave` bytes more than root's reserve.
fn fill_bytes_outside(fs: &TestFs, leave: u64) {
    let stat = statvfs(&fs.mnt);
    let reserve = (stat.blocks_free() - stat.blocks_available()) * stat.fragment_size();
    let path = fs.mnt.join("outside-bytes");
    let mut file = std::fs::File::create(&path).expect("create");
    let chunk = vec![0x11u8; MIB as usize];
    let mut wrote = 0u64;
    while file.write_all(&chunk).is_ok() {
        wrote += MIB;
    }
    let _ = file.sync_all();
    file.set_len(wrote.saturating_sub(leave + reserve))
        .expect("give back");
    fs.sync();
}

/// Creates empty files outside the volumes until the filesystem has no inode left, then
/// removes `leave` of them; how many it made.
fn fill_inodes_outside(fs: &TestFs, leave: u64) -> u64 {
    let dir = fs.dir("outside-inodes");
    let mut made = 0u64;
    while std::fs::File::create_new(dir.join(made.to_string())).is_ok() {
        made += 1;
    }
    for i in 0..leave.min(made) {
        std::fs::remove_file(dir.join(i.to_string())).expect("give back");
    }
    fs.sync();
    made
}

pub fn node_server_reserves_sizes_and_inodes_and_stats_never_claim_more_than_the_filesystem_has(
    kind: FsKind,
) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let served = Served::start(&fs, "state", &["--quota=on"]);
    let rt = runtime();
    let pod = served.pod("a");
    let close = |a: u64, b: u64| a.abs_diff(b) <= MIB;
    let (a, half) = rt.block_on(async {
        let mut csi = served.client().await;
        let first = capacity(&mut csi).await;
        assert!(
            close(first, free_bytes(&fs.mnt)),
            "nothing promised: {first}"
        );
        let a = create_and_publish(&mut csi, "pvc-a", 48 * MIB, &pod).await;
        let left = capacity(&mut csi).await;
        let expected = free_bytes(&fs.mnt) - 48 * MIB;
        assert!(
            close(left, expected),
            "48 MiB promised: {left} against {expected}"
        );
        // The pod writes 8 MiB: what it may still write stays promised.
        let w = write_until_error(&pod.target.join("data"), 8 * MIB, NOBODY);
        assert_eq!(w.errno, 0, "{w:?}");
        fs.sync();
        let left = capacity(&mut csi).await;
        let expected = free_bytes(&fs.mnt) - 40 * MIB;
        assert!(
            close(left, expected),
            "40 MiB promised: {left} against {expected}"
        );
        let too_big = csi_node::create_request("pvc-too-big", (left + 8 * MIB) as i64);
        let refused = (csi.controller.create_volume(too_big).await)
            .expect_err("a volume the promised space leaves no room for");
        assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
        figure(
            kind,
            format_args!(
                "reserved: {first} bytes free, a 48 MiB volume holding 8 MiB leaves {left} for \
                 new volumes; {} bytes refused with RESOURCE_EXHAUSTED",
                left + 8 * MIB
            ),
        );

        // Inode limits: half the free inodes each.
        let half = statvfs(&fs.mnt).files_available() / 2;
        let request = with_inode_limit("pvc-inodes-1", MIB, half);
        (csi.controller.create_volume(request).await).expect("the first half");
        let second = csi
            .controller
            .create_volume(with_inode_limit("pvc-inodes-2", MIB, half));
        match (kind, second.await) {
            (FsKind::Ext4, Err(refused)) => {
                assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
                assert!(refused.message().contains("inodes"), "{refused:?}");
            }
            // XFS makes inodes from free space: nothing is kept aside (docs).
            (FsKind::Xfs, Ok(_)) => {}
            (kind, other) => panic!("{kind:?}: {other:?}"),
        }
        (a, half)
    });
    if kind == FsKind::Ext4 {
        // Overcommitted, the same volume is made.
        let over = Served::start(&fs, "over", &["--quota=on", "--overcommit"]);
        rt.block_on(async {
            let mut csi = over.client().await;
            let request = with_inode_limit("pvc-inodes-2", MIB, half);
            (csi.controller.create_volume(request).await).expect("with --overcommit");
        });
    }
    rt.block_on(async {
        let mut csi = served.client().await;
        figure(
            kind,
            format_args!(
                "inodeLimit {half} (half the free inodes) twice: the second {}",
                match kind {
                    FsKind::Ext4 => "RESOURCE_EXHAUSTED (made with --overcommit)",
                    FsKind::Xfs => "made (inodes are not reserved on XFS)",
                }
            ),
        );

        // Something outside the volumes takes the filesystem's inodes (ext4, where their
        // number is fixed), then its bytes: the stats follow the filesystem down.
        if kind == FsKind::Ext4 {
            let made = fill_inodes_outside(&fs, 100);
            let favail = statvfs(&fs.mnt).files_available();
            let (_, inodes, _) = stats(&mut csi, &a, &pod.target).await;
            let (limit, used) = (inodes.total as u64, inodes.used as u64);
            assert_eq!(limit, 3072, "48 MiB / 16 KiB");
            assert!(
                inodes.available as u64 <= favail && favail < limit - used,
                "inodes available {} against {favail} free and {} under the limit",
                inodes.available,
                limit - used
            );
            let refused = csi
                .controller
                .create_volume(csi_node::create_request("pvc-no-inodes", 64 << 10))
                .await
                .expect_err("a filesystem without inodes");
            assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
            figure(
                kind,
                format_args!(
                    "{made} files made outside the volumes, 100 given back: stats inodes \
                     available={} (the filesystem's {favail}, not {} under the limit)",
                    inodes.available,
                    limit - used
                ),
            );
        }
        fill_bytes_outside(&fs, MIB);
        let free = free_bytes(&fs.mnt);
        let (bytes, inodes, _) = stats(&mut csi, &a, &pod.target).await;
        let under_limit = (bytes.total - bytes.used) as u64;
        assert!(
            bytes.available as u64 <= free && free < under_limit,
            "bytes available {} against {free} free and {under_limit} under the limit",
            bytes.available
        );
        assert!(inodes.available as u64 <= statvfs(&fs.mnt).files_available());
        figure(
            kind,
            format_args!(
                "filesystem filled from outside to {free} bytes free: stats available={} \
                 (not the {under_limit} under the volume's limit)",
                bytes.available
            ),
        );
    });
}
