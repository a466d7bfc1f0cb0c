#!/usr/bin/env bash
# The test runs, chosen by the labels of tests/CMakeLists.txt through CMakePresets.json's test
# presets:
#   scripts/test.sh quick   the inner loop: release build, the unit tests but the slow ones
#                           (preset quick), the Python tests but the slow ones.
#   scripts/test.sh         the full suite, as CI runs it (.ci/run): dependencies; release build;
#                           every unit test (release-unit), the integration tests (namespaces,
#                           faults, timing: release-integration, once, one retry each) and beside
#                           them every Python test; the ASan+UBSan build's unit tests (debug);
#                           ThreadSanitizer over the tests labelled tsan (scripts/tsan.sh); the
#                           libFuzzer targets for GW_TEST_FUZZ_SECONDS each (default 5; 0 skips
#                           them).
# After the release build, the sanitizer and libFuzzer builds and the fuzzing run one after
# another in the background, at the lowest priority, beside the tests. Fails on the first
# failure; an integration test that passed only on its retry is listed at the end as a flake.
# usage: scripts/test.sh [quick]   (GW_TEST_JOBS overrides ctest's parallelism, default 2 and 3
#                                   for the TSan tests; GW_TEST_TIMEOUT_SCALE the harness
#                                   deadlines', default 2)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

mode="${1:-full}"
case "$mode" in
  quick|full) ;;
  *) echo "usage: $0 [quick]" >&2; exit 2 ;;
esac
jobs="${GW_TEST_JOBS:-2}"
# The deadlines of the tests' own harnesses (tests/daemon/daemon_pair.h) times this: two tests at
# once beside a nice-19 build make a 2-core machine slow, not wrong. A hang still reports within
# the scaled deadline. Set GW_TEST_TIMEOUT_SCALE=1 for the deadlines as written.
export GW_TEST_TIMEOUT_SCALE="${GW_TEST_TIMEOUT_SCALE:-2}"
t0=$(date +%s)
phase_start=$t0
phase() {
  local now
  now=$(date +%s)
  echo "test.sh: $1 took $(( now - phase_start )) s (total $(( now - t0 )) s)"
  phase_start=$now
}

# A ctest run failed: why, printed last (a CI log is read from its tail), then the end.
explain_failures() {  # BUILD_DIR
  bash scripts/ctest_failures.sh "$1"
  exit 1
}

# The Python package and the torch backend against the release libgradwire.so, with Debian's
# python3 (its torch); a few ranks and short deadlines.
pytests() {
  GRADWIRE_LIBRARY="$PWD/build/release/capi/libgradwire.so" GW_TIMEOUT_MS=10000 \
    /usr/bin/python3 -m pytest -q -p no:cacheprovider "$@" tests/python
}

if [ "$mode" = quick ]; then
  bash scripts/build.sh release
  phase "release build"
  ctest --preset quick -j"$jobs" || explain_failures build/release
  phase "unit tests (not slow)"
  pytests -m "not slow"
  phase "python tests (not slow)"
  echo "test.sh quick: all passed in $(( $(date +%s) - t0 )) s"
  exit 0
fi

bash scripts/install-deps.sh
phase "install-deps"

# The later phases' builds run in the background at the lowest CPU priority while the tests run:
# the tests wait a lot (shaped links, deadlines, the soak and chaos scripts) and a nice-19 build
# takes only the CPU they leave idle, so the tests keep their timing and the suite saves most of
# a build. Each build's output goes to build/bg-NAME.log, shown if it fails. setsid gives the build
# a scheduler autogroup of its own (kernel.sched_autogroup_enabled, on in Debian's kernels), where
# nice alone would weigh it against its own processes only and the autogroup would take half the
# CPUs from the tests: the autogroup gets nice 19 too (where the kernel has no autogroups, the
# write fails and nice alone does it).
mkdir -p build
bg_start() {  # NAME COMMAND...: in a process group of its own, ended with this script
  local name=$1
  shift
  setsid bash -c '{ echo 19 >/proc/self/autogroup; } 2>/dev/null || true
    nice -n 19 "$@" >"build/bg-$0.log" 2>&1; echo $? >"build/bg-$0.rc"' \
    "$name" "$@" &
  bg_pids[$name]=$!
}
bg_wait() {  # NAME
  wait "${bg_pids[$1]}" || true
  if [ "$(cat "build/bg-$1.rc" 2>/dev/null || echo 1)" != 0 ]; then
    tail -60 "build/bg-$1.log"
    echo "test.sh: $1 failed (build/bg-$1.log)"
    exit 1
  fi
}
declare -A bg_pids
trap 'for p in "${bg_pids[@]}"; do kill -- -"$p" 2>/dev/null || true; done' EXIT
rm -f build/bg-*.rc
bash scripts/build.sh release
phase "release build"

# One chain in the background, each step at nice 19 as soon as the one before it ends: the ASan
# build (for the ASan tests, the first to need one), the TSan build, the libFuzzer build, then the
# fuzzing itself: every libFuzzer target (clang, ASan+UBSan, coverage-guided) from its checked-in
# corpus, for fuzz_seconds of wall-clock time each, two at a time (scripts/fuzz.sh). The tests
# leave idle CPU in every phase (they wait on deadlines, shaped links and peers: alone at -j2 the
# TSan tests kept this 2-core machine 58 % busy, 117 CPU-s in 101 s), and a chain that always has
# work takes it; the fuzzers that run beside tests get the CPU those leave (fewer executions in
# their time: each target's count is in the summary at the end). The gtest drivers (label fuzz)
# only replay seeds and fixed mutations in the release build, as regression tests.
# 5 s per target (store_client_frames about 500,000 executions, verbs_wire about 700): a cold run
# keeps both cores busy from start to end (vmstat: under 2 % idle in every two minutes of it), so
# every fuzzing second adds to it. A deeper search is `bash scripts/fuzz.sh 300` after a change to
# a decoder.
fuzz_seconds="${GW_TEST_FUZZ_SECONDS:-5}"
wait_for() {  # FILE: returns once it exists (exported: the background steps' shells call it)
  while [ ! -f "$1" ]; do sleep 2; done
}
export -f wait_for
bg_after() {  # NAME AFTER COMMAND...: bg_start NAME once AFTER's step has ended
  local name=$1 after=$2
  shift 2
  bg_start "$name" bash -c 'wait_for "build/bg-$0.rc"; "$@"' "$after" "$@"
}
bg_start debug bash scripts/build.sh debug
bg_after tsan debug bash scripts/tsan.sh build
# The fuzz runs wait for the sanitizer tests too (build/bg-gate.rc): beside the release unit tests,
# which keep both cores busy, a target would get next to no CPU in its time (a warm run, whose
# builds have nothing to do, would reach them that early).
if [ "$fuzz_seconds" -gt 0 ]; then
  bg_after fuzzing tsan bash -c "GW_FUZZ_STEP=build bash scripts/fuzz.sh && \
    wait_for build/bg-gate.rc && \
    GW_FUZZ_STEP=run bash scripts/fuzz.sh $fuzz_seconds"
fi

# Tests are independent (every port is chosen by the kernel), so they may run side by side. Unit
# tests must pass at the first attempt. Integration tests (real processes, network namespaces,
# AF_XDP on veth) share the CPUs with each other and the kernel's softirq work, so each gets one
# retry (the preset's until-pass:2); a test that fails twice fails the run, one that passed on its
# retry is a flake, listed at the end.
ctest --preset release-unit -j"$jobs" || explain_failures build/release
phase "release unit tests"
# The Python tests run beside the integration tests: those wait for the most part (shaped links,
# deadlines, daemons meeting; the phase used about 290 CPU-s) and the Python tests' ranks about
# 200 CPU-s in 156 s. Each keeps its own deadlines (the integration tests their one retry,
# GW_TIMEOUT_MS the Python ranks'). Their output goes to build/python-tests.log, shown when they
# end.
py_log=build/python-tests.log
export -f pytests
setsid bash -c 'pytests' >"$py_log" 2>&1 &  # a process group of its own, ended with this script
py_pid=$!
bg_pids[python]=$py_pid
ctest_log=build/release/integration-ctest.log
ctest --preset release-integration -j"$jobs" | tee "$ctest_log" || explain_failures build/release
phase "release integration tests (the Python tests beside them)"
# ctest prints a line per attempt ("Test #N: name ....***Failed", then "Test #N: name ....
# Passed"): a name with both is a flake.
flakes=$(awk '/Test +#[0-9]+: /{ name = $0; sub(/^.*Test +#[0-9]+: /, "", name); sub(/ .*/, "", name);
              if ($0 ~ /\*\*\*|Failed|Timeout|Exception/) failed[name] = 1; else if ($0 ~ / Passed /) passed[name] = 1 }
              END { for (n in failed) if (n in passed) print n }' "$ctest_log" | sort)

py_rc=0
wait "$py_pid" || py_rc=$?
cat "$py_log"
if [ "$py_rc" != 0 ]; then
  echo "test.sh: the Python tests failed ($py_log)"
  exit 1
fi
phase "python tests, what was left of them"

bg_wait debug
phase "debug (ASan+UBSan) build, what was left of it"
echo 0 >build/bg-gate.rc  # the fuzz runs may start
ctest --preset debug -j"$jobs" || explain_failures build/debug
phase "debug (ASan+UBSan) unit tests"
bg_wait tsan
phase "ThreadSanitizer build, what was left of it"
# -j3: the TSan tests wait more than they compute (76 s at -j3, 101 at -j2, same machine).
GW_TEST_JOBS="${GW_TEST_JOBS:-3}" bash scripts/tsan.sh run
phase "ThreadSanitizer tests"
if [ "$fuzz_seconds" -gt 0 ]; then
  bg_wait fuzzing
  grep '^fuzz.sh: ' build/bg-fuzzing.log
  phase "libFuzzer build and runs, what was left of them"
fi

if [ -n "$flakes" ]; then
  echo "test.sh: flakes (integration tests that passed only on their retry):"
  echo "$flakes" | sed 's/^/  /'
fi
echo "test.sh: all passed in $(( $(date +%s) - t0 )) s"
