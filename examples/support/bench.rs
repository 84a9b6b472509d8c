//! What the storage benchmarks share: scratch filesystems, the volume they copy (files of
//! incompressible bytes in directories of 100), `BENCH_FS` and `BENCH_DIR`.

use std::fs;
use std::path::Path;

#[path = "../../tests/common/scratch_fs.rs"]
pub mod scratch_fs;
use scratch_fs::Kind;

pub const GIB: u64 = 1 << 30;
pub const MIB: u64 = 1 << 20;

/// Bytes that neither compress nor dedupe.
pub fn fill(buf: &mut [u8], mut seed: u64) {
    seed = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in buf.chunks_mut(8) {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        chunk.copy_from_slice(&seed.to_le_bytes()[..chunk.len()]);
    }
}

/// `files` files in directories of 100, `bytes` in all, under `root` (created if missing).
pub fn volume(root: &Path, files: u64, bytes: u64) {
    let size = (bytes / files) as usize;
    let mut buf = vec![0u8; size];
    for i in 0..files {
        let dir = root.join(format!("d{:02}", i / 100));
        if i % 100 == 0 {
            fs::create_dir_all(&dir).expect("mkdir");
        }
        fill(&mut buf, i);
        fs::write(dir.join(format!("f{i:05}")), &buf).expect("write");
    }
}

pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

/// `BENCH_FS=xfs,ext4` limits the filesystems (default: all).
pub fn selected(kind: Kind) -> bool {
    std::env::var("BENCH_FS").map_or(true, |list| {
        list.split(',')
            .any(|name| name.eq_ignore_ascii_case(&format!("{kind:?}")))
    })
}

/// Checks for root and points temporary files (the scratch images) at `BENCH_DIR`. Call it
/// before any thread starts.
pub fn prepare(part: &str) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root: run scripts/bench-storage.sh {part}"
    );
    if let Ok(dir) = std::env::var("BENCH_DIR") {
        // SAFETY: no other thread runs yet (the caller's promise); tempfile reads TMPDIR.
        unsafe { std::env::set_var("TMPDIR", dir) };
    }
}
