#!/usr/bin/env bash
# Makes the empty ext4 filesystem that image volumes start from (src/linux/ext4_image/), so that
# node-server needs no mkfs: it writes these blocks into a new image, and the kernel grows the
# filesystem to the volume's size online (EXT4_IOC_RESIZE_FS). Run it again only to change the
# template; the output is the same bytes every time for one e2fsprogs version (fixed time,
# UUID and hash seed).
#
#   scripts/make-ext4-template.sh [OUT]     (default src/linux/ext4_image/template.bin)
#
# The filesystem: 16 MiB, 4 KiB blocks (mke2fs picks 1 KiB below 512 MiB, which would stay
# after growth); 8,192 inodes per group, which every group the kernel adds copies (16 KiB per
# inode, the ext4 default ratio, at any size); no blocks reserved for root (a volume is all
# its pod's); metadata_csum_seed, so each volume gets a UUID of its own while mounted
# (EXT4_IOC_SETFSUUID); lazy inode-table and journal init. Not resize=max: its 1,024 reserved
# GDT blocks made the first grow fail on journal credits (ENOSPC) at 128 MiB.
#
# Made with e2fsprogs 1.47.0 (Debian 12). The output is data mke2fs wrote, not e2fsprogs code.
#
# The encoding: "NKX4", u32 version 2, u64 image bytes, u32 block size, then each run of
# non-zero bytes (runs closer than 16 zero bytes joined): u64 offset, u32 length, the bytes;
# all little-endian. The 16 MiB hold 7,196 non-zero bytes in 43 runs.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-src/linux/ext4_image/template.bin}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
E2FSPROGS_FAKE_TIME=1767225600 mke2fs -q -F -t ext4 -b 4096 -N 8192 -m 0 \
  -O metadata_csum_seed \
  -U 6e6f6465-6b69-7400-0000-000000000001 \
  -E hash_seed=6e6f6465-6b69-7400-0000-000000000002,lazy_itable_init=1,lazy_journal_init=1 \
  "$scratch/template.img" 16M >/dev/null
python3 - "$scratch/template.img" "$out" <<'PY'
import re, struct, sys
image = open(sys.argv[1], "rb").read()
out = [b"NKX4", struct.pack("<IQI", 2, len(image), 4096)]
for run in re.finditer(rb"[^\x00](?:[^\x00]|\x00{1,15}(?=[^\x00]))*", image):
    out.append(struct.pack("<QI", run.start(), len(run.group())) + run.group())
open(sys.argv[2], "wb").write(b"".join(out))
PY
echo "wrote $out ($(stat -c %s "$out") bytes)"
