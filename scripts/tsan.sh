#!/usr/bin/env bash
# ThreadSanitizer over the tests of the parts that run threads: the rendezvous store (its server
# thread), the tcp transport (I/O threads), the shm transport, the communicator (iallreduce's
# progress thread, sub-communicators), the C ABI (calls and destroy from several threads) and the
# transport conformance suite (every backend built here, the verbs emulator's NIC thread
# included), and the daemon's engine (its job threads against raw protocol clients).
# Builds only those tests in build/tsan (the tsan preset: -O1 -g, DPDK and CUDA off).
# Left out (they run in the release and ASan builds): the cases that fork() after starting threads,
# which TSan does not support; the exhaustive size/dtype sweeps and the 1,000-communicator leak
# test, which test arithmetic and resources rather than threads and take minutes under TSan.
# tests/tsan.supp lists what is suppressed and why.
# usage: scripts/tsan.sh [build|run]   (default both; scripts/test.sh builds ahead, in the
#                                      background, and runs later)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tests=(store_test tcp_transport_test shm_transport_test communicator_test communicator_split_test
       capi_test transport_conformance_test daemon_server_test)
step="${1:-all}"
start=$(date +%s)
if [ "$step" != run ]; then
  cmake --preset tsan >/dev/null
  cmake --build --preset tsan -j"$(nproc)" --target "${tests[@]}"
  echo "tsan.sh: build took $(( $(date +%s) - start )) s"
  [ "$step" = build ] && exit 0
fi
# Where each test's executable is (tests/ or a folder below it).
exe() { find build/tsan/tests -name "$1" -type f -perm -u+x | head -1; }
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:history_size=7:suppressions=$PWD/tests/tsan.supp"
filter='-*Process*:*EveryRankCountSize*:*LargeAllreduce*:*ThousandCommunicators*'
failed=()
for t in "${tests[@]}"; do
  t0=$(date +%s)
  if timeout 900 "$(exe "$t")" --gtest_filter="$filter" --gtest_brief=1 \
      >"build/tsan/$t.log" 2>&1; then
    echo "tsan.sh: $t passed in $(( $(date +%s) - t0 )) s"
  else
    echo "tsan.sh: $t FAILED (build/tsan/$t.log):"
    grep -E -A30 "WARNING: ThreadSanitizer|FAILED|Failure" "build/tsan/$t.log" | head -80
    failed+=("$t")
  fi
done
echo "tsan.sh: $(( ${#tests[@]} - ${#failed[@]} ))/${#tests[@]} passed in $(( $(date +%s) - start )) s"
[ ${#failed[@]} -eq 0 ]
