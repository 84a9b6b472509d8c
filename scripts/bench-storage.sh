#!/usr/bin/env bash
# Prints figures for storage: snapshot/restore of a 1 GiB, 10,000-file volume with and without
# reflinks on XFS, btrfs and ext4 loop filesystems, by the copy engine alone and through
# node-server's gRPC path (CreateSnapshot, restore, clone, a group snapshot and the spread of
# its members), then the same calls on image volumes (layout: image) in the same run; copy_file
# of a sparse block image; loop device attach/detach and look-up; 4 KiB direct I/O inside an
# image volume against the host filesystem (`io`); and, only when asked for (`maps`), the
# SnapshotMetadata service's delta of a 10 GiB block volume with 1 % changed against reading it
# whole (MAPS_GIB sets the size; it writes the volume in full, up to three copies on ext4).
# Needs root, mkfs.xfs, mkfs.btrfs and mkfs.ext4; runs in a private mount namespace. An
# argument (trees, images, loops, grpc, io, maps) runs one part. BENCH_DIR: where the scratch images go
# (up to 6 GiB sparse, one at a time); BENCH_FS=xfs,btrfs,ext4 picks filesystems.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --example storage_bench --example snapshot_bench \
  --example image_io_bench --example block_maps_bench >&2
part="${1:-}"
if [ "$part" = maps ]; then
  exec unshare --mount --propagation private target/release/examples/block_maps_bench
fi
if [ "$part" = io ]; then
  exec unshare --mount --propagation private target/release/examples/image_io_bench
fi
if [ "$part" != grpc ]; then
  unshare --mount --propagation private target/release/examples/storage_bench "$@"
fi
if [ -z "$part" ] || [ "$part" = grpc ]; then
  unshare --mount --propagation private target/release/examples/snapshot_bench
fi
if [ -z "$part" ]; then
  unshare --mount --propagation private target/release/examples/image_io_bench
fi
