#!/usr/bin/env bash
# Prints node-server figures: resident memory of the static release binary (idle, after a
# lifecycle, after load) and NodePublish+NodeUnpublish pairs per second with real bind
# mounts at concurrency 1, 8 and 32; then the same pairs for raw block volumes (a loop device's
# node bound onto a target file) at concurrency 1 and 8, read-write and read-only; and the state
# directory's hand-over from one instance to the next (examples/handover_bench.rs); the registrar's
# hand-over among three on one socket (examples/standby_bench.rs); and a surge
# rollout of both generations under load (examples/rollout_bench.rs). Needs root; runs in a private mount namespace so the
# benchmark's mounts never reach the host. BENCH_SECONDS sets the time per level (default 3).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build-static.sh >&2
cargo build --release --locked --example node_server_bench --example block_bench --example handover_bench --example standby_bench --example rollout_bench >&2
unshare --mount --propagation private target/release/examples/node_server_bench
echo
unshare --mount --propagation private target/release/examples/block_bench
echo
target/release/examples/handover_bench
echo
# Three registrars on one registration socket: the hand-over when the serving one dies.
target/release/examples/standby_bench
echo
# A surge rollout of node-server + registrar under publish load, probe kubelet watching.
exec unshare --mount --propagation private target/release/examples/rollout_bench
