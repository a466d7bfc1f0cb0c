#!/usr/bin/env bash
# The first result: installs what building needs, builds only what the demo runs (libgradwire and
# gradwire-perf, in build/release, the tree the tests reuse) and runs a checked allreduce sweep
# with 4 ranks forked on this machine (no launcher needed). On a 2-core machine the build takes
# about 5-6 minutes cold (about 580 CPU seconds; the README has the measured time), seconds warm.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

t0=$(date +%s)
bash scripts/install-deps.sh --build
echo "demo.sh: building libgradwire and gradwire-perf in build/release ($(nproc) cores;" \
  "about 10 CPU-minutes cold, seconds warm)"
cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)" --target gradwire-perf
echo
echo "demo.sh: ready after $(( $(date +%s) - t0 )) s"
echo "demo.sh: gradwire-perf allreduce -b 1K -e 64M -f 4 --np 4 --check"
build/release/perf/gradwire-perf allreduce -b 1K -e 64M -f 4 --np 4 --check
echo "demo.sh: done in $(( $(date +%s) - t0 )) s"
