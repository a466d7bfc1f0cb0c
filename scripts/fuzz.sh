#!/usr/bin/env bash
# Runs each libFuzzer target for a bounded time on a copy of its checked-in corpus
# (tests/fuzz/corpus/<target>/), GW_FUZZ_JOBS targets at a time (default 2). The targets are built
# by the debug preset (clang 14, ASan + UBSan, GW_FUZZ: every fuzz_* binary beside the ASan tests
# in build/debug; `cmake --build --preset debug` builds them with the rest, this script's build
# step only them and what they link), and are those it lists in build/debug/libfuzzers.txt (one
# per row of tests/fuzz/fuzz_targets.cc's table, plus daemon_proto and dpdk_decoder).
# usage: scripts/fuzz.sh [seconds per target, default 20] [target ...]
# A crash leaves its input in build/debug/fuzz/artifacts/; make it a regression seed and a fix.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

secs="${1:-20}"
shift || true
jobs="${GW_FUZZ_JOBS:-2}"

# GW_FUZZ_STEP=build only builds, =run only runs (scripts/test.sh builds ahead in the
# background); default both.
step="${GW_FUZZ_STEP:-all}"
t0=$(date +%s)
[ "$step" = run ] || cmake --preset debug >/dev/null
mapfile -t all <build/debug/libfuzzers.txt
targets=("$@")
build=(--target gw_libfuzzers)  # every fuzz_* binary, or only the targets named
[ ${#targets[@]} -gt 0 ] && build=(--target "${targets[@]/#/fuzz_}")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
if [ "$step" != run ]; then
  cmake --build --preset debug -j"$(nproc)" "${build[@]}"
  echo "fuzz.sh: built ${#targets[@]} targets in $(( $(date +%s) - t0 )) s"
  [ "$step" = build ] && exit 0
fi

out=build/debug/fuzz
mkdir -p "$out/artifacts"
# One target: a fresh copy of its corpus, `secs` seconds; the verdict in $out/<t>.status.
run_one() {
  local t="$1" bin work rc=0
  bin=$(find build/debug -type f -name "fuzz_$t" -perm -u+x | head -1)
  work=$(mktemp -d)
  [ -d "tests/fuzz/corpus/$t" ] && cp -r "tests/fuzz/corpus/$t/." "$work/"
  "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$out/artifacts/$t-" "$work" >"$out/$t.log" 2>&1 || rc=$?
  rm -rf "$work"
  echo "$rc" >"$out/$t.status"
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
  if [ "$(cat "$out/$t.status" 2>/dev/null || echo 1)" != 0 ]; then
    echo "fuzz.sh: $t FAILED ($out/$t.log)"
    tail -30 "$out/$t.log" | cat -v
    status=1
  else
    echo "fuzz.sh: $t: $(grep -aE "^#[0-9]+.*DONE|Done [0-9]+ runs" "$out/$t.log" | tail -1)"
  fi
done
echo "fuzz.sh: ran ${#targets[@]} targets in $(( $(date +%s) - t1 )) s, $jobs at a time"
exit $status
