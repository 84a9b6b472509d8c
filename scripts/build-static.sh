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
# The compiler is pinned (packaging/rust-toolchain.txt, what `rustc --version` prints): another
# one gives other bytes, so another image digest from the same commit. Not rust-toolchain.toml,
# which rustup would try to fetch under that name, and the build machines have one Rust, named
# `stable`, and cannot fetch another. ALLOW_OTHER_RUSTC=1 builds anyway, saying so.
pinned=$(cat packaging/rust-toolchain.txt)
running=$(rustc --version)
if [ "$running" != "$pinned" ]; then
  if [ "${ALLOW_OTHER_RUSTC:-}" != 1 ]; then
    echo "build-static.sh: this checkout pins $pinned (packaging/rust-toolchain.txt), and" \
      "rustc is $running: its bytes would not be the pinned build's; install the pinned" \
      "toolchain, or set ALLOW_OTHER_RUSTC=1 to build anyway" >&2
    exit 1
  fi
  echo "build-static.sh: warning: building with $running, not the pinned $pinned" >&2
fi
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
# The functions the three long-running modes run, placed together at the start of .text
# (packaging/text-order.txt, written by scripts/text-order.sh): the kernel maps a binary's
# code 64 KiB around each page fault, so code that runs, scattered among code that does not,
# maps most of the binary into every process. Needs LLD, rustc's linker here since 1.90;
# set TEXT_ORDER=none to link in the compiler's order.
order=""
rust_minor=$(echo "$running" | cut -d' ' -f2 | cut -d. -f2)
if [ "${TEXT_ORDER:-}" != none ] && [ -f packaging/text-order.txt ] && [ "$rust_minor" -ge 90 ]; then
  order="-C link-arg=-Wl,--symbol-ordering-file=$PWD/packaging/text-order.txt"
  order="$order -C link-arg=-Wl,--no-warn-symbol-ordering"
fi
# Paths in panic locations and debug strings name where the source was, not where it was
# built: the same commit built in any directory, by any user, gives the same bytes. The target
# directory (prost's generated code lives there) and cargo's home (the crates' sources) are
# remapped too. (Directories with spaces in their names are not supported here.)
# (Made first: a target directory that does not exist yet is still the one to remap.)
mkdir -p "${CARGO_TARGET_DIR:-target}"
target_dir=$(cd "${CARGO_TARGET_DIR:-target}" && pwd)
remap="--remap-path-prefix=$PWD=/build/csi-nodekit"
remap="$remap --remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}=/cargo"
remap="$remap --remap-path-prefix=$target_dir=/build/target"
build() {
  RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static $relocs $order $remap" \
    cargo auditable build --release --locked --target "$target" "$@"
}
# The binary alone first, as the image gets it: built in one cargo call with examples or
# benches, it would get the features their dev-dependencies add (cargo unifies them), and so
# other code, and other symbol names than the text order lists. Examples and benches asked
# for come after, in a call of their own; feature flags go to both.
features=()
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bins) ;;
    --example | --bench) targets+=("$1" "$2"); shift ;;
    --example=* | --bench=* | --examples | --benches) targets+=("$1") ;;
    *) features+=("$1") ;;
  esac
  shift
done
build --bins ${features[@]+"${features[@]}"}
if [ ${#targets[@]} -gt 0 ]; then
  build "${targets[@]}" ${features[@]+"${features[@]}"}
fi
bin="${CARGO_TARGET_DIR:-target}/$target/release/csi-nodekit"
# The profile's `strip = true` leaves .symtab and .strtab (about 1.2 MiB) in this static-pie
# build; strip(1) from binutils, which links it, takes them out. It keeps the .dep-v0 section.
# The binary as linked, with its symbol table, is kept beside it as csi-nodekit.symbols (for
# scripts/text-order.sh and for profiles), and strip writes a new file, so cargo's own copy
# (a hard link) keeps its symbols for a later build that finds it up to date.
if command -v strip >/dev/null 2>&1; then
  if readelf -S "$bin" 2>/dev/null | grep -q '\.symtab'; then
    cp "$bin" "$bin.symbols"
    strip --strip-all -o "$bin.stripped" "$bin"
    mv -f "$bin.stripped" "$bin"
  elif [ -f "$bin.symbols" ]; then
    # Stripped by an earlier run: its symbols are the ones kept only if they strip to it.
    strip --strip-all -o "$bin.check" "$bin.symbols"
    cmp -s "$bin.check" "$bin" || rm -f "$bin.symbols"
    rm -f "$bin.check"
  fi
fi
if [ -n "$order" ] && [ -f "$bin.symbols" ]; then
  # Names change when code is renamed or moved, and with the toolchain: say how much of the
  # list still names something, so a stale one is seen.
  listed=$(grep -vc '^#' packaging/text-order.txt || true)
  found=$(nm --defined-only "$bin.symbols" | awk '{print $NF}' | sort -u |
    comm -12 - <(grep -v '^#' packaging/text-order.txt | sort -u) | wc -l)
  echo "text order: $found of $listed listed functions are in this build" \
    "(scripts/text-order.sh writes the list again)"
fi
if ldd "$bin" 2>&1 | grep -q "=>"; then
  echo "error: $bin is dynamically linked" >&2
  exit 1
fi
size=$(stat -c %s "$bin")
echo "$bin: static, $size bytes ($((size / 1024)) KiB)"
