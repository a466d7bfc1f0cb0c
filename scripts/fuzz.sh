#!/usr/bin/env bash
# Builds the libFuzzer targets (the fuzz preset: clang 14, ASan + UBSan; its build preset builds
# only gw_libfuzzers, every fuzz_* binary, and what they link) and runs each for a bounded time on
# a copy of its checked-in corpus (tests/fuzz/corpus/<target>/), GW_FUZZ_JOBS targets at a time
# (default 2). The targets are those the build lists in build/fuzz/libfuzzers.txt (one per row of
# tests/fuzz/fuzz_targets.cc's table, plus daemon_proto and dpdk_decoder).
# usage: scripts/fuzz.sh [seconds per target, default 20] [target ...]
# A crash leaves its input in build/fuzz/artifacts/; make it a regression seed and a fix.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

secs="${1:-20}"
shift || true
jobs="${GW_FUZZ_JOBS:-2}"

# GW_FUZZ_STEP=build only builds, =run only runs (scripts/test.sh builds ahead in the
# background); default both.
step="${GW_FUZZ_STEP:-all}"
t0=$(date +%s)
[ "$step" = run ] || cmake --preset fuzz >/dev/null
mapfile -t all <build/fuzz/libfuzzers.txt
targets=("$@")
build=()  # the preset's gw_libfuzzers, or only the targets named
[ ${#targets[@]} -gt 0 ] && build=(--target "${targets[@]/#/fuzz_}")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
if [ "$step" != run ]; then
  cmake --build --preset fuzz -j"$(nproc)" "${build[@]}"
  echo "fuzz.sh: built ${#targets[@]} targets in $(( $(date +%s) - t0 )) s"
  [ "$step" = build ] && exit 0
fi

mkdir -p build/fuzz/artifacts
# One target: a fresh copy of its corpus, `secs` seconds; the verdict in build/fuzz/<t>.status.
run_one() {
  local t="$1" bin work rc=0
  bin=$(find build/fuzz -type f -name "fuzz_$t" -perm -u+x | head -1)
  work=$(mktemp -d)
  [ -d "tests/fuzz/corpus/$t" ] && cp -r "tests/fuzz/corpus/$t/." "$work/"
  "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="build/fuzz/artifacts/$t-" "$work" >"build/fuzz/$t.log" 2>&1 || rc=$?
  rm -rf "$work"
  echo "$rc" >"build/fuzz/$t.status"
}

t1=$(date +%s)
running=0
for t in "${targets[@]}"; do
  echo "fuzz.sh: $t for ${secs}s"
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait || true

status=0
for t in "${targets[@]}"; do
  if [ "$(cat "build/fuzz/$t.status" 2>/dev/null || echo 1)" != 0 ]; then
    echo "fuzz.sh: $t FAILED (build/fuzz/$t.log)"
    tail -30 "build/fuzz/$t.log" | cat -v
    status=1
  else
    echo "fuzz.sh: $t: $(grep -aE "^#[0-9]+.*DONE|Done [0-9]+ runs" "build/fuzz/$t.log" | tail -1)"
  fi
done
echo "fuzz.sh: ran ${#targets[@]} targets in $(( $(date +%s) - t1 )) s, $jobs at a time"
exit $status
