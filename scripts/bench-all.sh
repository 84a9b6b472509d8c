#!/usr/bin/env bash
# One benchmark run for the figures table in docs/figures.md: the machine it ran on, then
# every benchmark's printed figures, in one log. docs/figures.md's table comes from this log,
# and its section "The run behind the table" holds the log's machine lines: after a new run,
# update both from the log. Needs root (mounts, loop devices), mkfs.xfs, mkfs.btrfs and
# mkfs.ext4, and for the quota figures QEMU (scripts/vm-kernel.sh installs it). Takes 20-30
# minutes on 2 cores, most of it release builds, 1 GiB copies and the VM.
# Usage: scripts/bench-all.sh [LOG] (default: target/bench-all.log).
set -euo pipefail
cd "$(dirname "$0")/.."
log="${1:-target/bench-all.log}"
mkdir -p "$(dirname "$log")"
{
  echo "== machine"
  date -u '+%Y-%m-%d %H:%M UTC'
  sed -n 's/^model name\s*: //p' /proc/cpuinfo | sort | uniq -c
  echo "cores: $(nproc); memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
  echo "kernel: $(uname -r); load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "rustc: $(rustc --version)"
  echo "== static binary"
  scripts/build-static.sh 2>&1 | tail -n 3
  echo "== cargo bench --bench sidecars"
  cargo bench --locked --bench sidecars 2>/dev/null
  echo "== cargo bench --bench doctor"
  cargo bench --locked --bench doctor 2>/dev/null
  echo "== scripts/bench-node-server.sh"
  scripts/bench-node-server.sh 2>/dev/null
  echo "== scripts/bench-node-scale.sh"
  scripts/bench-node-scale.sh 2>/dev/null
  echo "== examples/footprint_bench (RSS, PSS and anonymous memory per mode, idle, loaded, flooded)"
  scripts/build-static.sh --bins --example footprint_bench >/dev/null 2>&1
  unshare --mount --propagation private \
    "${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-gnu/release/examples/footprint_bench"
  echo "== scripts/bench-storage.sh"
  scripts/bench-storage.sh 2>/dev/null
  echo "== the quota VM test's figures (QEMU software emulation; compare them with each other)"
  bash scripts/vm-kernel.sh
  unshare --mount --propagation private cargo test --locked --test integration booted::quota_vm -- \
    --include-ignored --nocapture 2>&1 | grep -E '^quota VM (figure|: boot)'
  echo "== load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
} 2>&1 | tee "$log"
