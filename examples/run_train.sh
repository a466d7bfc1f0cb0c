#!/usr/bin/env bash
# Builds (if needed) and runs the compressed data-parallel training example: 4 local ranks over
# loopback TCP, one line per codec (final loss, ratio to uncompressed, bytes sent per step, wall
# time). usage: bash examples/run_train.sh [extra args for train_compressed, e.g. --steps 500 sign]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${GW_BUILD_DIR:-$root/build/examples}"
if [[ ! -f "$build/build.ninja" && ! -f "$build/Makefile" ]]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGW_BUILD_TESTS=OFF \
    $(command -v ninja >/dev/null && echo -G Ninja) >/dev/null
fi
cmake --build "$build" --target train_compressed -j "${GW_BUILD_JOBS:-2}" >/dev/null
exec "$build/examples/train_compressed" "$@"
