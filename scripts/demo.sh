#!/usr/bin/env bash
# Installs dependencies, builds the release preset and runs a checked allreduce sweep with 4 ranks
# forked on this machine (no launcher needed).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-deps.sh
bash scripts/build.sh release
echo
echo "demo.sh: gradwire-perf allreduce -b 1K -e 64M -f 4 --np 4 --check"
build/release/perf/gradwire-perf allreduce -b 1K -e 64M -f 4 --np 4 --check
