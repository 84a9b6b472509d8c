//! The time of each call of a volume's life, for directory and image volumes in one run:
//! CreateVolume, NodeStageVolume, NodePublishVolume, NodeUnpublishVolume, NodeUnstageVolume,
//! DeleteVolume, each the median (and slowest) of `rounds` volumes of `bytes`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use csi_nodekit::proto::csi::controller_client::ControllerClient;
use csi_nodekit::proto::csi::node_client::NodeClient;
use csi_nodekit::proto::csi::*;
use tonic::transport::Channel;

use super::image_volumes::{capability, create_request};

const CALLS: [&str; 6] = [
    "create",
    "stage",
    "publish",
    "unpublish",
    "unstage",
    "delete",
];

/// Prints one line per layout.
pub async fn print(channel: &Channel, dir: &Path, bytes: u64, rounds: usize) {
    for layout in ["directory", "image"] {
        let mut times = BTreeMap::<&str, Vec<Duration>>::new();
        for round in 0..rounds {
            let took = life(channel, dir, &format!("{layout}-{round}"), layout, bytes).await;
            for (call, took) in CALLS.iter().zip(took) {
                times.entry(call).or_default().push(took);
            }
        }
        let mut line = format!("  {layout:<9} volumes, {rounds} lives, median (slowest) ms:");
        for call in CALLS {
            let mut spent = times.remove(call).unwrap_or_default();
            spent.sort();
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            let (median, most) = (spent[spent.len() / 2], spent[spent.len() - 1]);
            line += &format!(" {call} {:.1} ({:.1})", ms(median), ms(most));
        }
        println!("{line}");
    }
}

/// One volume made, staged, published, unpublished, unstaged and deleted: each call's time.
async fn life(
    channel: &Channel,
    dir: &Path,
    name: &str,
    layout: &str,
    bytes: u64,
) -> Vec<Duration> {
    let mut controller = ControllerClient::new(channel.clone());
    let mut node = NodeClient::new(channel.clone());
    let mut took = Vec::new();
    let create = create_request(name, bytes, &[("layout", layout)]);
    let (staging, target) = (dir.join(format!("s-{name}")), dir.join(format!("t-{name}")));
    std::fs::create_dir(&staging).expect("staging path");
    let mut clock = Instant::now();
    let mut lap = |took: &mut Vec<Duration>| {
        took.push(clock.elapsed());
        clock = Instant::now();
    };
    let created = controller.create_volume(create).await.expect("create");
    lap(&mut took);
    let id = created.into_inner().volume.expect("volume").volume_id;
    let stage = NodeStageVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(capability()),
        ..Default::default()
    };
    node.node_stage_volume(stage).await.expect("stage");
    lap(&mut took);
    let publish = NodePublishVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(capability()),
        ..Default::default()
    };
    node.node_publish_volume(publish).await.expect("publish");
    lap(&mut took);
    let unpublish = NodeUnpublishVolumeRequest {
        volume_id: id.clone(),
        target_path: target.display().to_string(),
    };
    node.node_unpublish_volume(unpublish)
        .await
        .expect("unpublish");
    lap(&mut took);
    let unstage = NodeUnstageVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
    };
    node.node_unstage_volume(unstage).await.expect("unstage");
    lap(&mut took);
    let delete = DeleteVolumeRequest {
        volume_id: id,
        ..Default::default()
    };
    controller.delete_volume(delete).await.expect("delete");
    lap(&mut took);
    std::fs::remove_dir(&staging).expect("remove the staging path");
    took
}
