#!/usr/bin/env bash
# node-server on a crowded node, in one run: for mount tables of 20, 1,000 and 3,000 lines
# (unrelated tmpfs mounts added, as a node's pods add theirs), NodePublish+NodeUnpublish pairs
# per second at concurrency 1, 8 and 32 with p50/p99, NodeGetVolumeStats latency and the
# kernel's floor under a pair (mkdir, bind, umount, rmdir in one thread); block volumes' pairs
# against their own floor; then start-up with many volume records. The machine (cores, CPU,
# kernel) and its load before and after are printed with the figures: on a shared machine they
# are what the figures mean. docs/figures.md's table takes its node-server rows from this.
#
# Runs itself in a private mount namespace (`unshare -m`), so neither the added mounts nor the
# benchmark's reach the host. Needs root. Environment:
#   BENCH_SECONDS  time per measurement (default 3)
#   MOUNT_TABLES   mount table sizes to measure at (default "20 1000 3000"; a size below what
#                  the table already has is measured as it is)
#   STARTUP_RECORDS volume records for the start-up figure (default 1000; 0 skips it)
#   NODEKIT_BIN    the binary to measure (default: the static release build, built here)
#   BENCH_EXAMPLES where the benchmark clients are (default: the static release build's)
#   BASELINE_BIN   a second binary, measured the same way right after the first at each size
#                  (say, a build of main), so before and after share one run and one load
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${BENCH_NODE_SCALE_UNSHARED:-}" != 1 ]]; then
  # The benchmarks built as the binary is (static, same target), so they share its build.
  scripts/build-static.sh --bins --example node_server_bench --example block_bench >&2
  exec env BENCH_NODE_SCALE_UNSHARED=1 unshare --mount --propagation private "$0" "$@"
fi

bin="${NODEKIT_BIN:-${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-gnu/release/csi-nodekit}"
examples="${BENCH_EXAMPLES:-${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-gnu/release/examples}"
scratch=$(mktemp -d)
# The added mounts live inside one tmpfs of our own, so one lazy unmount takes them all.
mount -n -t tmpfs -o size=1m,mode=0755 nodescale "$scratch"
trap 'umount -l "$scratch"; rmdir "$scratch"' EXIT

load() { cut -d' ' -f1-3 /proc/loadavg; }

machine() {
  echo "== machine"
  date -u '+%Y-%m-%d %H:%M UTC'
  echo "cores: $(nproc); CPU: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | sort -u | paste -sd';');" \
    "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
  echo "kernel: $(uname -r)"
  echo "binary: $bin ($(stat -c %s "$bin") bytes)"
  if [[ -n "${BASELINE_BIN:-}" ]]; then
    echo "baseline: $BASELINE_BIN ($(stat -c %s "$BASELINE_BIN") bytes)"
  fi
  echo "load before: $(load)"
}

# Adds unrelated tmpfs mounts until the mount table has at least $1 lines.
grow_mount_table() {
  local want=$1 n
  n=$(wc -l </proc/self/mountinfo)
  while ((n < want)); do
    mkdir -p "$scratch/m/$n"
    mount -n -t tmpfs -o size=4k,mode=0755 nodescale "$scratch/m/$n"
    n=$((n + 1))
  done
}

# The publish, stats, floor and block figures of binary $1 (labelled $2) at this table size.
measure() {
  local binary=$1 label=$2
  echo "-- $label (load $(load))"
  NODEKIT_BIN=$binary "$examples/node_server_bench" --scale
  NODEKIT_BIN=$binary "$examples/block_bench" --scale
}

# Start-up with $STARTUP_RECORDS volume records: node-server's spawn to its first GetPluginInfo
# answered. A function of its own so that start-up work can grow here (snapshots, leftovers).
startup() {
  local binary=$1 label=$2 records=${STARTUP_RECORDS:-1000}
  ((records > 0)) || return 0
  echo "-- $label (load $(load))"
  NODEKIT_BIN=$binary "$examples/node_server_bench" --startup "$records"
}

machine
for size in ${MOUNT_TABLES:-20 1000 3000}; do
  grow_mount_table "$size"
  echo "== mount table: $(wc -l </proc/self/mountinfo) lines"
  measure "$bin" "this build"
  if [[ -n "${BASELINE_BIN:-}" ]]; then
    measure "$BASELINE_BIN" baseline
  fi
done
echo "== start-up (mount table: $(wc -l </proc/self/mountinfo) lines)"
startup "$bin" "this build"
if [[ -n "${BASELINE_BIN:-}" ]]; then
  startup "$BASELINE_BIN" baseline
fi
echo "== load after: $(load)"
