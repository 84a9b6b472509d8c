//! The size the project promises: the binary in the image (static, stripped) stays within
//! 5.5 MB (5,500,000 bytes) as features come in. docs/figures.md says what it holds.

use super::image::{first_build, unpack};

/// 5.5 MB, in bytes.
const LIMIT: u64 = 5_500_000;

#[ignore = "needs root and buildah: builds the image (see image.rs)"]
#[test]
fn the_binary_in_the_image_stays_within_5_5_mb() {
    let dir = tempfile::tempdir().unwrap();
    let (_, rootfs) = unpack(&first_build().archive, dir.path());
    let size = std::fs::metadata(rootfs.join("csi-nodekit")).unwrap().len();
    println!(
        "the shipped binary: {size} bytes, {} under 5.5 MB",
        LIMIT as i64 - size as i64
    );
    assert!(
        size <= LIMIT,
        "the shipped binary has {size} bytes, {} over 5.5 MB",
        size - LIMIT
    );
}
