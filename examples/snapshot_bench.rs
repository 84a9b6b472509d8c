//! Figures for snapshots through the real gRPC path, printed (not asserted), with node-server
//! served in-process on a Unix socket and its state directory on a scratch filesystem:
//! - CreateSnapshot of a 1 GiB volume of 10,000 files, CreateVolume restoring it, and a clone:
//!   time and extra disk space, on XFS (reflink), btrfs (reflink) and ext4 (a plain copy);
//! - CreateVolumeGroupSnapshot of four volumes of 2,500 files (1 GiB in all), and how far apart
//!   the members' copies ran: the window from the first copy's start to the last one's end,
//!   with the members copied back to back (as the GroupController does) and in parallel
//!   threads.
//!
//! - the same calls on image volumes (`layout: image`): one instant each, a reflink of the
//!   volume's file where the filesystem has them, whatever the files inside.
//!
//! Needs root in a private mount namespace; `scripts/bench-storage.sh grpc` sets that up.
//! Scratch images go under `BENCH_DIR` (6 GiB sparse, one at a time); `BENCH_FS` picks
//! filesystems, as for `storage_bench`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use csi_nodekit::node_server::state::orphans::Orphans;
use csi_nodekit::node_server::state::snapshots::{Snapshots, spread};
use csi_nodekit::node_server::state::state_dir::StateDir;
use csi_nodekit::proto::csi::controller_client::ControllerClient;
use csi_nodekit::proto::csi::group_controller_client::GroupControllerClient;
use csi_nodekit::proto::csi::volume_capability::access_mode::Mode;
use csi_nodekit::proto::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_nodekit::proto::csi::*;
use tonic::transport::Channel;

#[allow(dead_code)]
#[path = "support/bench.rs"]
mod bench;
use bench::scratch_fs::{Kind, ScratchFs};
use bench::selected;
use bench::{GIB, mib};

/// An image volume's request (`layout: image`): `request`'s, with the parameter.
fn image_request(
    name: &str,
    bytes: u64,
    source: Option<volume_content_source::Type>,
) -> CreateVolumeRequest {
    CreateVolumeRequest {
        parameters: [("layout".into(), "image".into())].into(),
        ..request(name, bytes, source)
    }
}

fn request(
    name: &str,
    bytes: u64,
    source: Option<volume_content_source::Type>,
) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![VolumeCapability {
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(AccessType::Mount(MountVolume::default())),
        }],
        volume_content_source: source.map(|t| VolumeContentSource { r#type: Some(t) }),
        ..Default::default()
    }
}

struct Bench {
    fs: ScratchFs,
    state: StateDir,
    controller: ControllerClient<Channel>,
    group: GroupControllerClient<Channel>,
}

impl Bench {
    async fn volume(&mut self, name: &str, files: u64, bytes: u64) -> String {
        let reply = self
            .controller
            .create_volume(request(name, 2 * bytes, None))
            .await;
        let id = reply
            .expect("create")
            .into_inner()
            .volume
            .expect("volume")
            .volume_id;
        bench::volume(&self.state.volume(&id), files, bytes);
        id
    }

    /// An image volume of `bytes` whose file holds `bytes` written in `chunks` pieces, as a
    /// volume holding `bytes` in as many files would (its ext4 cannot be grown past 16 MiB to
    /// fill it through a mount where root lacks CAP_SYS_RESOURCE; a copy of the file costs
    /// what its extents cost, whatever the files inside).
    async fn image_volume(&mut self, name: &str, chunks: u64, bytes: u64) -> String {
        let mut c = self.controller.clone();
        let create = c.create_volume(image_request(name, bytes, None));
        let id = self
            .measure(
                &format!("CreateVolume, image of {} MiB", bytes >> 20),
                create,
            )
            .await
            .expect("create")
            .into_inner()
            .volume
            .expect("volume")
            .volume_id;
        let file = self.state.volume(&id).join("volume.img");
        let out = std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .expect("image");
        let size = (bytes / chunks) as usize;
        let mut buf = vec![0u8; size];
        // Past the template's 16 MiB, which hold its empty filesystem.
        let start = 16 << 20;
        for i in 0..chunks {
            bench::fill(&mut buf, i);
            let at = start + (i * size as u64) % (bytes - start - size as u64);
            std::os::unix::fs::FileExt::write_all_at(&out, &buf, at).expect("write");
        }
        out.sync_all().expect("sync");
        id
    }

    /// Runs `call`, printing its time and the space it took.
    async fn measure<T>(&self, what: &str, call: impl std::future::Future<Output = T>) -> T {
        let before = self.fs.free_bytes();
        let start = Instant::now();
        let out = call.await;
        let took = start.elapsed();
        let used = before.saturating_sub(self.fs.free_bytes());
        println!(
            "  {what:<40} {:>8.2} s  {:>8.1} MiB extra",
            took.as_secs_f64(),
            mib(used)
        );
        out
    }
}

async fn single(b: &mut Bench) {
    let id = b.volume("source", 10_000, GIB).await;
    let snapshot = CreateSnapshotRequest {
        name: "snap".into(),
        source_volume_id: id.clone(),
        ..Default::default()
    };
    let mut c = b.controller.clone();
    let snapshot = b
        .measure("CreateSnapshot", c.create_snapshot(snapshot))
        .await;
    let snapshot_id = snapshot
        .expect("snapshot")
        .into_inner()
        .snapshot
        .expect("a snapshot")
        .snapshot_id;
    let source = volume_content_source::Type::Snapshot(volume_content_source::SnapshotSource {
        snapshot_id: snapshot_id.clone(),
    });
    let restore = request("restored", 0, Some(source));
    b.measure("CreateVolume from the snapshot", c.create_volume(restore))
        .await
        .expect("restore");
    let source = volume_content_source::Type::Volume(volume_content_source::VolumeSource {
        volume_id: id.clone(),
    });
    let clone = request("clone", 0, Some(source));
    b.measure("CreateVolume cloning the volume", c.create_volume(clone))
        .await
        .expect("clone");
    let delete = DeleteSnapshotRequest {
        snapshot_id,
        ..Default::default()
    };
    b.measure("DeleteSnapshot", c.delete_snapshot(delete))
        .await
        .expect("delete");
    // Room for the group part.
    delete_all(&mut c).await;
}

/// Deletes every volume, for room.
async fn delete_all(c: &mut ControllerClient<Channel>) {
    let listed = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .expect("list");
    for entry in listed.into_inner().entries {
        let volume_id = entry.volume.expect("volume").volume_id;
        c.delete_volume(DeleteVolumeRequest {
            volume_id,
            ..Default::default()
        })
        .await
        .expect("delete");
    }
}

fn window(cuts: &[csi_nodekit::node_server::state::snapshots::Cut]) -> (Duration, Duration) {
    spread(cuts).expect("copies were made")
}

async fn group(b: &mut Bench) {
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(b.volume(&format!("member{i}"), 2_500, GIB / 4).await);
    }
    let create = CreateVolumeGroupSnapshotRequest {
        name: "group".into(),
        source_volume_ids: ids.clone(),
        ..Default::default()
    };
    let mut g = b.group.clone();
    let made = b
        .measure(
            "CreateVolumeGroupSnapshot, 4 volumes",
            g.create_volume_group_snapshot(create),
        )
        .await;
    let made = made
        .expect("group")
        .into_inner()
        .group_snapshot
        .expect("a group");
    let delete = DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: made.group_snapshot_id,
        snapshot_ids: made
            .snapshots
            .iter()
            .map(|s| s.snapshot_id.clone())
            .collect(),
        ..Default::default()
    };
    g.delete_volume_group_snapshot(delete)
        .await
        .expect("delete group");

    // The copies the GroupController makes (back to back), timed member by member, and the
    // same copies made in parallel threads instead.
    let dirs: Vec<PathBuf> = ids.iter().map(|id| b.state.volume(id)).collect();
    let spare = b.fs.path().join("spread");
    let snapshots =
        Snapshots::open(&StateDir::open(&spare).expect("spare"), &Orphans::new()).expect("open");
    let (_, cuts) = snapshots.cut(&dirs).expect("cut back to back");
    let (serial, serial_longest) = window(&cuts);
    for cut in &cuts {
        snapshots.discard(&cut.id).expect("discard");
    }
    let cuts: Vec<_> = std::thread::scope(|scope| {
        let threads: Vec<_> = (dirs.iter())
            .map(|dir| scope.spawn(|| snapshots.cut(std::slice::from_ref(dir)).expect("cut")))
            .collect();
        let joined = threads.into_iter().map(|t| t.join().expect("join"));
        joined.flat_map(|(_, cuts)| cuts).collect()
    });
    let (parallel, parallel_longest) = window(&cuts);
    for cut in &cuts {
        snapshots.discard(&cut.id).expect("discard");
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "  members copied within {:.0} ms back to back (each copy up to {:.0} ms), \
         {:.0} ms in parallel threads (each up to {:.0} ms)",
        ms(serial),
        ms(serial_longest),
        ms(parallel),
        ms(parallel_longest)
    );
}

/// The same calls on image volumes (`layout: image`): a snapshot, restore and clone of one
/// 1 GiB image, a group of four of 256 MiB.
async fn images(b: &mut Bench) {
    let mut c = b.controller.clone();
    delete_all(&mut c).await;
    let id = b.image_volume("image-source", 10_000, GIB).await;
    let snapshot = CreateSnapshotRequest {
        name: "image-snap".into(),
        source_volume_id: id.clone(),
        ..Default::default()
    };
    let snapshot = b
        .measure("CreateSnapshot, image", c.create_snapshot(snapshot))
        .await;
    let snapshot_id = (snapshot.expect("snapshot").into_inner().snapshot)
        .expect("a snapshot")
        .snapshot_id;
    let source = volume_content_source::Type::Snapshot(volume_content_source::SnapshotSource {
        snapshot_id: snapshot_id.clone(),
    });
    let restore = image_request("image-restored", 0, Some(source));
    b.measure(
        "CreateVolume from the snapshot, image",
        c.create_volume(restore),
    )
    .await
    .expect("restore");
    let source = volume_content_source::Type::Volume(volume_content_source::VolumeSource {
        volume_id: id.clone(),
    });
    let clone = image_request("image-clone", 0, Some(source));
    b.measure(
        "CreateVolume cloning the volume, image",
        c.create_volume(clone),
    )
    .await
    .expect("clone");
    let delete = DeleteSnapshotRequest {
        snapshot_id,
        ..Default::default()
    };
    b.measure("DeleteSnapshot, image", c.delete_snapshot(delete))
        .await
        .expect("delete");
    delete_all(&mut c).await;
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(
            b.image_volume(&format!("image-member{i}"), 2_500, GIB / 4)
                .await,
        );
    }
    let create = CreateVolumeGroupSnapshotRequest {
        name: "image-group".into(),
        source_volume_ids: ids,
        ..Default::default()
    };
    let mut g = b.group.clone();
    b.measure(
        "CreateVolumeGroupSnapshot, 4 images",
        g.create_volume_group_snapshot(create),
    )
    .await
    .expect("group");
    println!(
        "  (the extra space above is the reflinks' until the background unshare of each copy, \
         which --capacity counts in full)"
    );
}

async fn run(kind: Kind) {
    println!("{kind:?}: through gRPC, 1 GiB in 10,000 files; a group of 4 × 2,500 files");
    let fs = ScratchFs::sized(kind, "noatime", 6 * GIB);
    let state = fs.path().join("state");
    // Sizes are only accounted on a scratch filesystem without project quotas, so each
    // volume would keep its whole size promised: the copies measured here would not fit.
    let served = bench::Served::start(fs.path(), &state).await;
    let channel = served.channel.clone();
    let mut bench = Bench {
        fs,
        state: StateDir::open(&state).expect("state"),
        controller: ControllerClient::new(channel.clone()),
        group: GroupControllerClient::new(channel),
    };
    single(&mut bench).await;
    group(&mut bench).await;
    println!("{kind:?}: the same through gRPC on image volumes (layout: image)");
    images(&mut bench).await;
    served.stop().await;
}

fn main() {
    bench::prepare("grpc");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    for kind in [Kind::Xfs, Kind::Btrfs, Kind::Ext4] {
        if selected(kind) {
            runtime.block_on(run(kind));
        }
    }
}
