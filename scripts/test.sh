#!/usr/bin/env bash
# The whole test suite, as CI runs it: dependencies, release build + ctest, then the debug build
# (AddressSanitizer + UndefinedBehaviorSanitizer) + ctest. Fails on the first failure.
# usage: scripts/test.sh            (GW_TEST_JOBS overrides ctest's parallelism, default 2)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

jobs="${GW_TEST_JOBS:-2}"
t0=$(date +%s)
phase_start=$t0
phase() {
  local now
  now=$(date +%s)
  echo "test.sh: $1 took $(( now - phase_start )) s (total $(( now - t0 )) s)"
  phase_start=$now
}

bash scripts/install-deps.sh
phase "install-deps"

bash scripts/build.sh release
phase "release build"
# Tests are independent (every port is chosen by the kernel), so they may run side by side.
ctest --preset release -j"$jobs" --timeout 900
phase "release tests"

bash scripts/build.sh debug
phase "debug (ASan+UBSan) build"
ctest --preset debug -j"$jobs" --timeout 900
phase "debug (ASan+UBSan) tests"

echo "test.sh: all passed in $(( $(date +%s) - t0 )) s"
