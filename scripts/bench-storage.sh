#!/usr/bin/env bash
# Prints figures for the storage building blocks: snapshot/restore of a 1 GiB, 10,000-file
# volume with and without reflinks on XFS, btrfs and ext4 loop filesystems; copy_file of a
# sparse block image; loop device attach/detach and look-up. Needs root, mkfs.xfs, mkfs.btrfs
# and mkfs.ext4; runs in a private mount namespace. An argument (trees, images, loops) runs one
# part. BENCH_DIR: where the scratch images go (4 GiB sparse, one at a time).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --example storage_bench >&2
exec unshare --mount --propagation private target/release/examples/storage_bench "$@"
