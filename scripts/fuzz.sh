#!/usr/bin/env bash
# Builds the libFuzzer targets (the fuzz preset: clang 14, ASan + UBSan) and runs each for a
# bounded time on a copy of its checked-in corpus (tests/fuzz/corpus/<target>/).
# usage: scripts/fuzz.sh [seconds per target, default 20] [target ...]
# A crash leaves its input in build/fuzz/artifacts/; make it a regression seed and a fix.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

secs="${1:-20}"
shift || true
all=(store_server_frames store_client_frames tcp_wire shm_handshake plugin_handle codec_spec
     codec_payload config_toml dpdk_decoder)
targets=("${@:-${all[@]}}")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

cmake --preset fuzz
cmake --build --preset fuzz -j"$(nproc)" --target "${targets[@]/#/fuzz_}"

mkdir -p build/fuzz/artifacts
status=0
for t in "${targets[@]}"; do
  bin=$(find build/fuzz -type f -name "fuzz_$t" -perm -u+x | head -1)
  work=$(mktemp -d)
  [ -d "tests/fuzz/corpus/$t" ] && cp -r "tests/fuzz/corpus/$t/." "$work/"
  echo "fuzz.sh: $t for ${secs}s"
  if ! "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
       -artifact_prefix="build/fuzz/artifacts/$t-" "$work" >"build/fuzz/$t.log" 2>&1; then
    echo "fuzz.sh: $t FAILED (build/fuzz/$t.log)"
    tail -30 "build/fuzz/$t.log"
    status=1
  else
    grep -E "^#[0-9]+.*DONE|Done [0-9]+ runs" "build/fuzz/$t.log" | tail -1 || true
  fi
  rm -rf "$work"
done
exit $status
