#!/usr/bin/env bash
# Builds the fully static release binary and prints its size.
# There is no musl target on our build machines, so this links glibc statically
# (crt-static); the result runs in a FROM scratch image.
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-unknown-linux-gnu
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
  cargo build --release --locked --target "$target" "$@"
bin="${CARGO_TARGET_DIR:-target}/$target/release/csi-nodekit"
if ldd "$bin" 2>&1 | grep -q "=>"; then
  echo "error: $bin is dynamically linked" >&2
  exit 1
fi
size=$(stat -c %s "$bin")
echo "$bin: static, $size bytes ($((size / 1024)) KiB)"
