#!/usr/bin/env bash
# ThreadSanitizer over the tests labelled `tsan` (tests/CMakeLists.txt): the threaded parts (the
# rendezvous store's server thread, the tcp transport's I/O threads, shm, the communicator's
# progress thread and sub-communicators, the C ABI called from several threads, point-to-point
# (its engine's progress thread beside callers that drive it: p2p_test), the transport
# conformance suite with the verbs emulator's NIC thread, the daemon's job threads). The tsan
# preset (-O1 -g1, DPDK and CUDA off) builds only those binaries (target gw_tsan_tests) and runs
# their cases but the slow ones (sweeps and leak loops test arithmetic and resources, not threads);
# cases that fork() after starting threads skip themselves (tests/support/sanitizers.h).
# tests/tsan.supp lists what is suppressed and why.
# usage: scripts/tsan.sh [build|run]   (default both; scripts/test.sh builds ahead, in the
#                                      background, and runs later)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step="${1:-all}"
start=$(date +%s)
if [ "$step" != run ]; then
  cmake --preset tsan >/dev/null
  cmake --build --preset tsan -j"$(nproc)"
  echo "tsan.sh: build took $(( $(date +%s) - start )) s"
  [ "$step" = build ] && exit 0
fi
ctest --preset tsan -j"${GW_TEST_JOBS:-2}" || {
  bash scripts/ctest_failures.sh build/tsan  # why, printed last (CI logs are read from the tail)
  exit 1
}
echo "tsan.sh: tests took $(( $(date +%s) - start )) s"
