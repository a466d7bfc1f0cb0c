#!/usr/bin/env bash
# Builds (if needed) and runs the compressed data-parallel training example: 4 local ranks over
# loopback TCP, one line per codec (final loss, ratio to uncompressed, bytes sent per step, wall
# time). It builds the one target in the release tree (build/release, as scripts/demo.sh and
# scripts/test.sh do; GW_BUILD_DIR names another configured tree).
# usage: bash examples/run_train.sh [extra args for train_compressed, e.g. --steps 500 sign]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${GW_BUILD_DIR:-$root/build/release}"
if [[ ! -f "$build/build.ninja" && ! -f "$build/Makefile" ]]; then
  if [[ -n "${GW_BUILD_DIR:-}" ]]; then
    echo "run_train.sh: $build is not a configured build tree" >&2
    exit 2
  fi
  echo "run_train.sh: configuring build/release (cmake --preset release)" >&2
  (cd "$root" && cmake --preset release >/dev/null)
fi
echo "run_train.sh: building train_compressed in $build" >&2
cmake --build "$build" --target train_compressed -j "${GW_BUILD_JOBS:-$(nproc)}" >/dev/null
exec "$build/examples/train_compressed" "$@"
