#!/usr/bin/env bash
# scripts/ctest_failures.sh against a real ctest run of three failing tests (an abort after a
# sanitizer-style report, a failed expectation, a script that says why in its own words) and a
# passing one: each failed test's cause is in the output (the last one's last lines), the
# passing test is not named, and a directory without failures says so.
# usage: tests/ctest_failures_test.sh SOURCE_DIR
set -euo pipefail
src="${1:?usage: $0 SOURCE_DIR}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(t NONE)
enable_testing()
add_test(NAME "Suite/T.Aborts/\"shm\""
         COMMAND sh -c "echo noise; echo '==7==ERROR: AddressSanitizer: heap-use-after-free'; echo '    #0 0x4f1 in reduce x.cc:3'; kill -ABRT $$")
add_test(NAME Suite.Expects COMMAND sh -c "echo 'x.cc:9: Failure'; echo 'Expected equality'; exit 1")
add_test(NAME Suite.Passes COMMAND sh -c "echo 'ERROR: printed by a passing test'")
add_test(NAME Suite.Quiet COMMAND sh -c "echo 'line one'; echo 'the script said no'; exit 3")
CM
cmake -S "$work" -B "$work/b" >/dev/null
(cd "$work/b" && ctest -j2 >/dev/null 2>&1) && { echo "FAIL: the failing tests passed"; exit 1; }
out=$(bash "$src/scripts/ctest_failures.sh" "$work/b")
echo "$out"
fail() { echo "FAIL: $*"; exit 1; }
grep -q '^--- Suite/T.Aborts/"shm"$' <<<"$out" || fail "the aborted test is not named"
grep -q 'heap-use-after-free' <<<"$out" || fail "the sanitizer report is missing"
grep -q '#0 0x4f1 in reduce' <<<"$out" || fail "the first stack frame is missing"
grep -q '^--- Suite.Expects$' <<<"$out" || fail "the failed expectation's test is not named"
grep -q 'x.cc:9: Failure' <<<"$out" || fail "the failed expectation is missing"
grep -q 'Passes\|passing test' <<<"$out" && fail "a passing test's output is shown"
grep -q '^--- Suite.Quiet$' <<<"$out" || fail "the test with no recognised cause is not named"
grep -q '^the script said no$' <<<"$out" || fail "a test with no recognised cause: no output lines"
grep -q '^Command: ' <<<"$out" && fail "the command line is shown as a cause"
mkdir -p "$work/none/Testing/Temporary"
grep -q 'no failed tests' <<<"$(bash "$src/scripts/ctest_failures.sh" "$work/none")" ||
  fail "an empty directory is not reported as such"
echo "ctest_failures_test: passed"
