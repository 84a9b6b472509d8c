//! Act two: one volume's life through the CSI calls the external-provisioner and the kubelet
//! make — create, stage, publish, use, stats, unpublish, unstage, delete — on real mounts.

use std::path::Path;

use super::Layout;
use crate::BoxError;
use crate::linux::mountinfo::{MountEntry, MountTable};
use crate::proto::csi::controller_client::ControllerClient;
use crate::proto::csi::node_client::NodeClient;
use crate::proto::csi::volume_capability::{
    AccessMode, AccessType, MountVolume, access_mode::Mode,
};
use crate::proto::csi::*;

const NAME: &str = "pvc-0d3e1f2a-demo";
const SIZE: i64 = 64 << 20;

fn capability() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// The mounts at `path`, from the kernel's mount table: what "mounted" means.
fn mounts_at(path: &Path) -> Vec<MountEntry> {
    let table = MountTable::read().unwrap_or_default();
    table
        .entries()
        .iter()
        .filter(|entry| entry.mount_point == path)
        .cloned()
        .collect()
}

fn show_mounts(path: &Path) {
    let mounts = mounts_at(path);
    if mounts.is_empty() {
        println!("   (nothing mounted at {})", path.display());
    }
    for entry in mounts {
        println!(
            "   mountinfo: {} from {}:{} {} ({})",
            entry.mount_point.display(),
            entry.dev.0,
            entry.dev.1,
            entry
                .root
                .as_deref()
                .map_or("(no path)".into(), Path::to_string_lossy),
            entry.options.join(",")
        );
    }
}

pub async fn life(layout: &Layout, csi: &Path) -> Result<(), BoxError> {
    let channel = crate::socket::connect(csi).await?;
    let mut controller = ControllerClient::new(channel.clone());
    let mut node = NodeClient::new(channel);

    let request = CreateVolumeRequest {
        name: NAME.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: SIZE,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability()],
        ..Default::default()
    };
    let volume = controller
        .create_volume(request)
        .await?
        .into_inner()
        .volume
        .ok_or("CreateVolume returned no volume")?;
    let id = volume.volume_id.clone();
    let topology: Vec<_> = volume
        .accessible_topology
        .iter()
        .map(|t| &t.segments)
        .collect();
    println!(
        "CreateVolume {NAME}: id {id}, {} bytes, accessible from {topology:?}",
        volume.capacity_bytes
    );

    let staging = layout
        .pods()
        .join(format!("plugins/kubernetes.io/csi/{id}/globalmount"));
    std::fs::create_dir_all(&staging)?;
    let stage = NodeStageVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(capability()),
        volume_context: volume.volume_context.clone(),
        ..Default::default()
    };
    node.node_stage_volume(stage).await?;
    println!("NodeStageVolume: staged at {}", staging.display());
    show_mounts(&staging);

    let target = layout.pods().join(format!(
        "pods/0d3e1f2a/volumes/kubernetes.io~csi/{NAME}/mount"
    ));
    std::fs::create_dir_all(target.parent().ok_or("target has no parent")?)?;
    let publish = NodePublishVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(capability()),
        volume_context: volume.volume_context.clone(),
        ..Default::default()
    };
    node.node_publish_volume(publish).await?;
    println!("NodePublishVolume: published at {}", target.display());
    show_mounts(&target);

    let file = target.join("hello.txt");
    std::fs::write(&file, "written by the demo pod\n")?;
    println!(
        "the pod writes {}: reads back {:?}",
        file.display(),
        std::fs::read_to_string(&file)?.trim_end()
    );
    let stats = node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: target.display().to_string(),
            staging_target_path: String::new(),
        })
        .await?
        .into_inner();
    for usage in &stats.usage {
        let unit = if usage.unit == volume_usage::Unit::Inodes as i32 {
            "inodes"
        } else {
            "bytes"
        };
        println!(
            "NodeGetVolumeStats: {unit}: {} used, {} available, {} total",
            usage.used, usage.available, usage.total
        );
    }
    say_what_the_stats_are(&stats);

    node.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: id.clone(),
        target_path: target.display().to_string(),
    })
    .await?;
    println!(
        "NodeUnpublishVolume: {} unmounted and removed: {}",
        target.display(),
        !target.exists()
    );
    node.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
    })
    .await?;
    println!(
        "NodeUnstageVolume: staging path unmounted: {}",
        mounts_at(&staging).is_empty()
    );
    controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: id.clone(),
            secrets: Default::default(),
        })
        .await?;
    println!("DeleteVolume {id}: done");
    Ok(())
}

/// Says plainly what the stats show: a volume held to its size reports its own figures; one
/// whose size is only accounted reports the filesystem it shares with every other volume.
fn say_what_the_stats_are(stats: &NodeGetVolumeStatsResponse) {
    let bytes = stats
        .usage
        .iter()
        .find(|u| u.unit == volume_usage::Unit::Bytes as i32);
    if let Some(condition) = &stats.volume_condition {
        println!("   condition: {}", condition.message);
    }
    match bytes {
        Some(bytes) if bytes.total == SIZE => println!(
            "   => the volume's {SIZE} bytes are accounted and enforced (a project quota): \
             its pod's writes stop there, and these are the volume's own figures"
        ),
        _ => println!(
            "   => the volume's {SIZE} bytes are accounted (set aside in node-server's \
             capacity) but not enforced on this machine: these are the figures of the \
             filesystem all volumes share, not the volume's; the condition says why"
        ),
    }
}
