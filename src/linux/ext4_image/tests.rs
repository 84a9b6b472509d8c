use super::*;

/// The superblock (the 1,024 bytes at byte 1024), put together from the template's runs.
fn superblock() -> Vec<u8> {
    let mut first = vec![0u8; BLOCK_BYTES as usize];
    for run in runs().filter(|r| r.offset < BLOCK_BYTES) {
        let at = run.offset as usize;
        first[at..at + run.bytes.len()].copy_from_slice(run.bytes);
    }
    first[1024..2048].to_vec()
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

#[test]
fn the_template_is_an_ext4_of_16_mib_in_4_kib_blocks_with_no_blocks_reserved() {
    let sb = superblock();
    assert_eq!(u16::from_le_bytes([sb[56], sb[57]]), 0xEF53, "ext4 magic");
    assert_eq!(u32_at(&sb, 24), 2, "log2(block size) - 10: 4 KiB");
    assert_eq!(u64::from(u32_at(&sb, 4)) * BLOCK_BYTES, TEMPLATE_BYTES);
    assert_eq!(u32_at(&sb, 8), 0, "blocks reserved for root");
    assert_eq!(u32_at(&sb, 40), 8192, "inodes per group");
    let incompat = u32_at(&sb, 0x60);
    for (flag, name) in [
        (0x40, "extent"),
        (0x80, "64bit"),
        (0x200, "flex_bg"),
        (0x2000, "csum_seed"),
    ] {
        assert!(incompat & flag != 0, "{name} missing: {incompat:#x}");
    }
    let ro_compat = u32_at(&sb, 0x64);
    assert!(
        ro_compat & 0x400 != 0,
        "metadata_csum missing: {ro_compat:#x}"
    );
}

#[test]
fn the_template_runs_lie_in_order_apart_inside_its_size_and_are_few() {
    let ends: Vec<(u64, u64)> = runs()
        .map(|r| (r.offset, r.offset + r.bytes.len() as u64))
        .collect();
    assert!(ends.windows(2).all(|w| w[0].1 < w[1].0), "{ends:?}");
    assert!(ends.iter().all(|(_, end)| *end <= TEMPLATE_BYTES));
    let bytes: usize = runs().map(|r| r.bytes.len()).sum();
    assert!(bytes < 16 << 10, "{bytes} bytes in the binary");
}

#[test]
fn written_out_the_template_is_16_mib_with_holes_between_its_blocks() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let file = File::create_new(dir.path().join("image")).unwrap();
    write_template(&file).unwrap();
    let meta = file.metadata().unwrap();
    assert_eq!(meta.len(), TEMPLATE_BYTES);
    assert!(
        meta.blocks() * 512 <= 256 << 10,
        "{} bytes allocated",
        meta.blocks() * 512
    );
    let mut first = vec![0; 2048];
    file.read_exact_at(&mut first, 0).unwrap();
    assert_eq!(&first[1024 + 56..1024 + 58], &[0x53, 0xEF]);
}

#[test]
fn sizes_round_up_to_whole_blocks_and_never_below_the_template() {
    assert_eq!(fs_bytes(0), TEMPLATE_BYTES);
    assert_eq!(fs_bytes(1 << 20), TEMPLATE_BYTES);
    assert_eq!(fs_bytes(TEMPLATE_BYTES + 1), TEMPLATE_BYTES + BLOCK_BYTES);
    assert_eq!(fs_bytes(1 << 30), 1 << 30);
}

#[test]
fn a_thick_image_is_allocated_to_its_size_and_its_superblock_reads_back() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let file = File::create_new(dir.path().join("image")).unwrap();
    write_thick(&file, 32 << 20).unwrap();
    let meta = file.metadata().unwrap();
    assert_eq!(meta.len(), 32 << 20);
    assert!(
        meta.blocks() * 512 >= 32 << 20,
        "{} bytes allocated",
        meta.blocks() * 512
    );
    let read = super::superblock(&file).unwrap();
    assert_eq!(read.bytes, TEMPLATE_BYTES, "the filesystem is still 16 MiB");
    let empty = File::create_new(dir.path().join("empty")).unwrap();
    empty.set_len(4096 * 4).unwrap();
    let err = super::superblock(&empty).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
}

#[test]
fn each_volume_id_gives_a_uuid_of_its_own_that_stays_the_same() {
    let a = volume_uuid("vol-1f2e3d4c5b6a7988");
    assert_eq!(a, volume_uuid("vol-1f2e3d4c5b6a7988"));
    assert_ne!(a, volume_uuid("vol-1f2e3d4c5b6a7989"));
    assert_eq!(a[6] >> 4, 8, "version 8");
    assert_eq!(a[8] >> 6, 0b10, "the RFC 9562 variant");
    let template = super::superblock(&{
        let dir = tempfile::tempdir().unwrap();
        let file = File::create_new(dir.path().join("image")).unwrap();
        write_template(&file).unwrap();
        file
    })
    .unwrap();
    assert_ne!(a, template.uuid, "not the template's");
}
