//! An image volume on a state filesystem that has no room for its whole file, though
//! `--capacity` says there is (an operator's figure larger than the disk, or a disk that
//! something else filled): CreateVolume is RESOURCE_EXHAUSTED and an expansion OUT_OF_RANGE,
//! each naming what it asked and what is free, never INTERNAL; nothing is left behind.

use std::time::Duration;

use super::image::image_create;
use crate::common;
use crate::common::csi_node::*;
use crate::common::scratch_fs::{Kind, ScratchFs};
use csi_nodekit::proto::csi::*;
use tonic::Code;

const MIB: u64 = 1 << 20;

#[ignore = "needs root: a small tmpfs for the state directory in a private mount namespace (the README's test command)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_that_the_disk_cannot_hold_is_refused_as_out_of_room_not_internal() {
    let fs = ScratchFs::with_options(Kind::Tmpfs, "size=40m");
    let sandbox = MountSandbox::new();
    let (socket, state) = (sandbox.path().join("csi.sock"), fs.path().join("state"));
    let child = common::spawn_node_server(&socket, &state, &["--node-id=n", "--capacity=1Gi"]);
    let up = common::wait_until(Duration::from_secs(20), || common::is_socket(&socket)).await;
    assert!(up, "{}", child.stderr());
    let mut csi = connect(&socket).await;

    let err = (csi
        .controller
        .create_volume(image_create("pvc-big", 64 * MIB, &[]))
        .await)
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("67108864 bytes asked for"),
        "{}",
        err.message()
    );
    assert!(csi.list().await.is_empty());
    let volumes = std::fs::read_dir(state.join("volumes")).unwrap().count();
    assert_eq!(volumes, 0, "nothing left in volumes/");

    let small = (csi
        .controller
        .create_volume(image_create("pvc-small", 16 * MIB, &[]))
        .await)
        .expect("16 MiB fits")
        .into_inner()
        .volume
        .unwrap();
    let expand = ControllerExpandVolumeRequest {
        volume_id: small.volume_id.clone(),
        capacity_range: Some(CapacityRange {
            required_bytes: (64 * MIB) as i64,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    let err = csi
        .controller
        .controller_expand_volume(expand)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    assert!(err.message().contains("does not fit"), "{}", err.message());
    let listed = csi.list().await;
    assert_eq!(
        listed[0].capacity_bytes,
        (16 * MIB) as i64,
        "the record back at its file's size"
    );
    eprintln!("refused: {}", err.message());
    drop(child);
}
