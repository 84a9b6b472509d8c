#!/usr/bin/env bash
# The whole node-side flow in one command, as root, with no cluster, no container runtime and
# no network: builds the binary if needed, then runs `csi-nodekit demo` (see README, "Try it").
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "demo: run as root (it mounts volumes in a private mount namespace)" >&2
  exit 1
fi
cargo build --release --locked --quiet
exec target/release/csi-nodekit demo "$@"
