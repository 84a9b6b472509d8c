#!/usr/bin/env bash
# Writes packaging/text-order.txt, the functions scripts/build-static.sh has the linker place
# together at the start of .text: those node-server, the registrar and `probe serve` run in
# examples/footprint_bench (start-up, idle, the publish benchmark, probes, floods). Run it again
# after large changes (build-static.sh says how much of the list is still found). Root: uprobes
# (tracefs) and a private mount namespace.
#
# How the functions are found: before any mode starts, the benchmark's hook puts a uprobe on
# the entry of every function of its copy of the binary; the kernel counts each probe's hits.
# Not on glibc's hand-written string variants (`__memset_avx2_unaligned_erms` and the like,
# which it picks by IFUNC): with those probed, node-server never got past building its runtime
# (a map's control bytes left unset, its insert looping), and their probes never fired anyway.
# The counts are read after each step, and the list is every function with a hit: first those
# run by the idle step (start-up and the idle loops of all three modes), then those the publish
# load added, then the floods; within a step, most hits first. Under the probes the benchmark
# runs some 30 times slower, which only lowers its rates.
set -euo pipefail
cd "$(dirname "$0")/.."
tracing=/sys/kernel/tracing
group=nodekit_text_order

# The benchmark's FOOTPRINT_HOOK: this script again, with the work directory in the environment.
if [ -n "${TEXT_ORDER_WORK:-}" ]; then
  work=$TEXT_ORDER_WORK
  case "$1" in
  copied)
    # A probe at each function's file offset; aliases (one address, several names) share one.
    read -r offset address size < <(readelf -lW "$work/symbols" |
      awk '$1 == "LOAD" && $8 == "E" { print $2, $3, $5 }')
    nm -n -S --radix=d --defined-only "$work/symbols" |
      awk -v offset=$((offset)) -v address=$((address)) -v size=$((size)) \
        -v path="$2" -v group=$group -v names="$work/names" '
        NF == 4 && $3 ~ /^[tTwWi]$/ && $1 + 0 >= address && $1 + 0 < address + size && $2 + 0 > 0 &&
          $4 !~ /_(sse2|ssse3|sse4_[12]|avx|avx2|avx512[a-z]*|evex|evex512|erms|unaligned)(_|$)/ {
          if (!($1 in probe)) {
            probe[$1] = "f" n++
            printf "p:%s/%s %s:0x%x\n", group, probe[$1], path, $1 - address + offset
          }
          print probe[$1], $4 > names
        }' >"$work/probes"
    refused=0
    while IFS= read -r probe; do
      echo "$probe" >>$tracing/uprobe_events 2>/dev/null || refused=$((refused + 1))
    done <"$work/probes"
    echo "text-order.sh: $(wc -l <"$work/probes") functions probed, $refused refused" >&2
    echo 1 >$tracing/events/$group/enable
    ;;
  *) awk '{ print $2, $3 }' $tracing/uprobe_profile >"$work/hits.$1" ;;
  esac
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  echo "text-order.sh: needs root (uprobes, mounts)" >&2
  exit 1
fi
if [ -z "${TEXT_ORDER_NAMESPACE:-}" ]; then
  exec env TEXT_ORDER_NAMESPACE=1 unshare --mount --propagation private "$0" "$@"
fi
target=x86_64-unknown-linux-gnu
work=$(mktemp -d)
cleanup() {
  if [ -d $tracing/events/$group ]; then
    echo 0 >$tracing/events/$group/enable
    # Read whole before the first removal: a removal shifts what a reader still to come sees.
    probes=$(grep -o "^p:$group/[^ ]*" $tracing/uprobe_events || true)
    for probe in $probes; do echo "-:${probe#p:}" >>$tracing/uprobe_events; done
  fi
  rm -rf "$work"
}
trap cleanup EXIT
[ -e $tracing/uprobe_events ] || mount -t tracefs nodev $tracing

scripts/build-static.sh --example footprint_bench
if ! cp "target/$target/release/csi-nodekit.symbols" "$work/symbols"; then
  echo "text-order.sh: the build kept no symbols for this binary; touch src/main.rs and run again" >&2
  exit 1
fi
TEXT_ORDER_WORK="$work" FOOTPRINT_HOOK="$PWD/scripts/text-order.sh" BENCH_SECONDS=1 \
  "target/$target/release/examples/footprint_bench"

out=packaging/text-order.txt
{
  echo "# Written by scripts/text-order.sh on $(date -u +%Y-%m-%d) from $(git rev-parse --short HEAD):"
  echo "# the functions node-server, the registrar and probe serve ran (uprobes on every"
  echo "# function's entry): the idle step's, then the publish load's, then the floods'; most"
  echo "# hits first within a step. scripts/build-static.sh has the linker place them first."
  previous=/dev/null
  for step in idle load flood; do
    awk 'FILENAME == ARGV[1] { names[$1] = names[$1] " " $2; next }
      FILENAME == ARGV[2] { before[$1] = $2; next }
      $2 > 0 && !(before[$1] > 0) { print $2, names[$1] }' \
      "$work/names" "$previous" "$work/hits.$step" | sort -s -k1,1nr | cut -d' ' -f2- | tr ' ' '\n' |
      { grep -v '^$' || true; }
    previous="$work/hits.$step"
  done
} >"$work/order"
mv "$work/order" "$out"
echo "$out: $(grep -vc '^#' "$out") functions"
