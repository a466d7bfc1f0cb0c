#!/usr/bin/env bash
# The first result: installs what building needs, builds only what the demo runs (libgradwire and
# gradwire-perf, in build/release, the tree the tests reuse) and runs a checked allreduce sweep
# with 4 ranks forked on this machine (no launcher needed). On a 2-core machine the build takes
# about 2 minutes cold (about 240 CPU seconds; the README has the measured time), seconds warm.
# It ends with one line saying why the cost model chose the header's algorithm (its figures, as
# the library logs them at INFO) and how to force another (--algo, GW_ALGO).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Why the header's algorithm, in the library's own words: each rank logs (INFO) the cost model's
# figure for every algorithm the first time it runs a size class, and one 1 KiB and one 64 MiB
# call of rank 0 say it (a second or two; nothing is printed if the log says nothing).
# `demo.sh --why-only [GRADWIRE_PERF]` prints this line alone (its test), building nothing.
# From GW_SHM_DIRECT_MIN bytes (1 MiB) the ranks of one host read each other's buffers instead of
# running an algorithm of the table; rank 0's INFO line says so once, and then the line does too.
why_line() {
  local perf=$1 log why picked figures steps="" direct
  log=$(GW_LOG_LEVEL=info "$perf" allreduce -b 1K -e 64M -f 65536 --np 4 -n 1 -w 0 2>&1 >/dev/null ||
    true)
  why=$(sed -nE 's/^\[gradwire 0 [0-9]+\] info allreduce (1 KiB|64 MiB): ([a-z_]+),[^(]*\(cost model: (.*)\)$/\2 \1: \3/p' <<<"$log")
  direct=$(sed -nE 's/^\[gradwire 0 [0-9]+\] info allreduce within the host: ranks read .* from ([0-9]+) bytes \(GW_SHM_DIRECT_MIN\)$/\1/p' <<<"$log" | head -1)
  [[ -n $why ]] || return 0
  picked=$(head -1 <<<"$why" | cut -d' ' -f1)
  figures=$(cut -d' ' -f2- <<<"$why" | paste -sd';' - | sed 's/;/; /g')
  [[ $picked == rhd ]] && steps=": 2 log2(p) steps, not ring's 2(p-1), for the same bytes"
  [[ -n $direct ]] &&
    steps+="; from $direct bytes the ranks read each other's buffers into the sum (GW_SHM_DIRECT_MIN)"
  echo "demo.sh: why $picked: the cost model's cheapest here ($figures)$steps." \
    "Force another with --algo ring (or tree, bblocks; or GW_ALGO=ring)"
}
if [[ ${1:-} == --why-only ]]; then
  why_line "${2:-build/release/perf/gradwire-perf}"
  exit 0
fi

t0=$(date +%s)
bash scripts/install-deps.sh --build
echo "demo.sh: building libgradwire and gradwire-perf in build/release ($(nproc) cores;" \
  "about 4 CPU-minutes cold, seconds warm)"
cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)" --target gradwire-perf
echo
echo "demo.sh: ready after $(( $(date +%s) - t0 )) s"
echo "demo.sh: gradwire-perf allreduce -b 1K -e 64M -f 4 --np 4 --check"
build/release/perf/gradwire-perf allreduce -b 1K -e 64M -f 4 --np 4 --check
why_line build/release/perf/gradwire-perf
echo "demo.sh: done in $(( $(date +%s) - t0 )) s"
