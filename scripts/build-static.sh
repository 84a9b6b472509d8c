#!/usr/bin/env bash
# Builds the fully static release binary and prints its size.
# There is no musl target on our build machines, so this links glibc statically
# (crt-static); the result runs in a FROM scratch image.
#
# Built with `cargo auditable`: the binary carries its dependency list (crate names, versions,
# sources, as zlib-compressed JSON) in an ELF section `.dep-v0`, which image scanners (Trivy,
# Grype, Syft) read to tell what is inside a FROM scratch image. It costs a few KiB.
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-unknown-linux-gnu
if ! cargo auditable --version >/dev/null 2>&1; then
  echo "build-static.sh: cargo-auditable is not installed; install it with" \
    "\`cargo install --locked cargo-auditable --version 0.7.7\` (.ci/run does) and run again" >&2
  exit 1
fi
# Relative relocations packed (DT_RELR, glibc 2.36+ and binutils 2.38+): a static-pie binary
# otherwise carries 24 bytes of `.rela.dyn` per pointer in its data (about 190 KiB), read at
# every start. Older glibc cannot apply them at start-up, so they stay unpacked there.
relocs=""
if [ "$(printf '%s\n' 2.36 "$(getconf GNU_LIBC_VERSION | cut -d' ' -f2)" | sort -V | head -1)" = 2.36 ]; then
  relocs="-C link-arg=-Wl,-z,pack-relative-relocs"
fi
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static $relocs" \
  cargo auditable build --release --locked --target "$target" "$@"
bin="${CARGO_TARGET_DIR:-target}/$target/release/csi-nodekit"
# The profile's `strip = true` leaves .symtab and .strtab (about 1.2 MiB) in this static-pie
# build; strip(1) from binutils, which links it, takes them out. It keeps the .dep-v0 section.
if command -v strip >/dev/null 2>&1; then
  strip --strip-all "$bin"
fi
if ldd "$bin" 2>&1 | grep -q "=>"; then
  echo "error: $bin is dynamically linked" >&2
  exit 1
fi
size=$(stat -c %s "$bin")
echo "$bin: static, $size bytes ($((size / 1024)) KiB)"
