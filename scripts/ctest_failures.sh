#!/usr/bin/env bash
# After a failed ctest run: the lines that say why each failed test failed, printed last, so that
# a log read from its tail (CI shows only the end of a long run) names the cause and not only the
# test. Reads BUILD_DIR/Testing/Temporary/LastTestsFailed.log and LastTest.log (every attempt's
# output, kept whether or not ctest printed it); for each failed test (at most 4) it prints its
# last attempt's sanitizer reports, gtest failures and stack frames (at most 60 lines), then the
# last lines of its output (a script says why in its own words).
# usage: scripts/ctest_failures.sh BUILD_DIR
set -uo pipefail
dir="${1:?usage: $0 BUILD_DIR}/Testing/Temporary"
failed="$dir/LastTestsFailed.log"
log="$dir/LastTest.log"
if [ ! -s "$failed" ] || [ ! -f "$log" ]; then
  echo "ctest_failures.sh: no failed tests recorded in $dir"
  exit 0
fi
echo "ctest_failures.sh: why the failed tests failed (whole output: $log)"
n=0
while IFS= read -r line; do
  name="${line#*:}"
  n=$((n + 1))
  if [ "$n" -gt 4 ]; then
    echo "  ... and $(($(wc -l <"$failed") - 4)) more"
    break
  fi
  echo "--- $name"
  # The last section of the log whose header names the test: "N/M Testing: NAME" up to the next
  # header; its output is what lies between "Output:" and "<end of output>".
  section=$(awk -v want="$name" '
    /^[0-9]+\/[0-9]+ Testing: / { t = $0; sub(/^[0-9]+\/[0-9]+ Testing: /, "", t); inside = (t == want);
                                 if (inside) { n = 0; delete keep } }
    inside { keep[++n] = $0 }
    END { for (i = 1; i <= n; i++) print keep[i] }' "$log")
  why=$(grep -E 'ERROR: |SUMMARY: |runtime error|WARNING: |Failure|Expected|Which is|Value of|  Actual|#[0-9]+ 0x|terminate|what\(\)|Assertion|Timeout|Subprocess|\[  FAILED|FAIL|error|Error' \
    <<<"$section" | grep -v '^Command: ' | head -60)
  [ -n "$why" ] && echo "$why"
  # Then the output's last lines (a script says why in its own words), fewer after a match.
  last=20
  [ -n "$why" ] && last=8
  echo "  (the output's last $last lines:)"
  awk '/^<end of output>$/ { out = 0 } out { print } /^Output:$/ { out = 1 }' <<<"$section" |
    grep -v '^-*$' | tail -"$last"
done <"$failed"
