#!/usr/bin/env bash
# Writes packaging/text-order.txt, the functions scripts/build-static.sh has the linker place
# together at the start of .text: those on the pages of the binary that node-server, the
# registrar and `probe serve` touch in examples/footprint_bench (start-up, idle, the publish
# benchmark, probes, floods). Run it again after large changes (build-static.sh says how much
# of the list is still found). Root: a loop device and a private mount namespace.
#
# How the pages are found: the benchmark's copy of the binary lies on a scratch ext4 whose
# device has readahead off, its pages dropped from the cache, so a page enters the cache only
# when a process faults on it; the benchmark lists them (mincore) at the end. Every function
# on such a page is listed: a page's granularity, so the list is a superset of what runs.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "text-order.sh: needs root (a loop device, mounts)" >&2
  exit 1
fi
if [ -z "${TEXT_ORDER_NAMESPACE:-}" ]; then
  exec env TEXT_ORDER_NAMESPACE=1 unshare --mount --propagation private "$0" "$@"
fi
target=x86_64-unknown-linux-gnu
work=$(mktemp -d)
device=""
cleanup() {
  umount "$work/fs" 2>/dev/null || true
  [ -n "$device" ] && losetup -d "$device"
  rm -rf "$work"
}
trap cleanup EXIT

# Linked in the compiler's order, so the list does not depend on the one it replaces.
TEXT_ORDER=none scripts/build-static.sh --example footprint_bench
symbols="$work/csi-nodekit.symbols"
if ! cp "target/$target/release/csi-nodekit.symbols" "$symbols"; then
  echo "text-order.sh: the build kept no symbols for this binary; touch src/main.rs and run again" >&2
  exit 1
fi
truncate -s 1G "$work/fs.img"
mkfs.ext4 -q -F "$work/fs.img"
device=$(losetup --find --show "$work/fs.img")
mkdir "$work/fs"
mount "$device" "$work/fs"
blockdev --setra 0 "$device"
TMPDIR="$work/fs" FOOTPRINT_PAGES=from-disk FOOTPRINT_RESIDENT="$work/pages" \
  "target/$target/release/examples/footprint_bench"

# The executable segment: file offset and address of its start, its length.
read -r offset address size < <(readelf -lW "$symbols" |
  awk '$1 == "LOAD" && $8 == "E" { print $2, $3, $5 }')
out=packaging/text-order.txt
{
  echo "# Written by scripts/text-order.sh on $(date -u +%Y-%m-%d) from $(git rev-parse --short HEAD):"
  echo "# the functions on the pages node-server, the registrar and probe serve touch, in"
  echo "# address order; scripts/build-static.sh has the linker place them first in .text."
  nm -n -S --radix=d --defined-only "$symbols" |
    awk -v offset=$((offset)) -v address=$((address)) -v size=$((size)) '
      FNR == NR { touched[$1] = 1; next }
      NF == 4 && $3 ~ /^[tTwWi]$/ && $1 + 0 >= address && $1 + 0 < address + size && $2 + 0 > 0 {
        first = int(($1 - address + offset) / 4096)
        last = int(($1 + $2 - 1 - address + offset) / 4096)
        for (page = first; page <= last; page++) {
          if (page in touched && !($4 in listed)) { listed[$4] = 1; print $4; break }
        }
      }' "$work/pages" -
} >"$work/order"
mv "$work/order" "$out"
echo "$out: $(grep -vc '^#' "$out") functions"
