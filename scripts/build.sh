#!/usr/bin/env bash
# Configures and builds gradwire with a CMake preset: release (default) or debug (ASan + UBSan).
# usage: scripts/build.sh [release|debug]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

preset="${1:-release}"
case "$preset" in
  release|debug) ;;
  *) echo "usage: $0 [release|debug]" >&2; exit 2 ;;
esac

start=$(date +%s)
cmake --preset "$preset"
cmake --build --preset "$preset" -j"$(nproc)"
echo "build.sh: $preset build finished in $(( $(date +%s) - start )) s (build/$preset)"
