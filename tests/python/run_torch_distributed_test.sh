#!/usr/bin/env bash
# PyTorch's own distributed test suite (torch/testing/_internal/distributed/distributed_test.py,
# shipped by Debian's python3-torch) against the "gradwire" torch.distributed backend, through the
# suite's plugin feature (tests/python/torch_suite/gradwire_distributed_suite.py says how).
#
#   tests/python/run_torch_distributed_test.sh [-n WORLD_SIZE] [-b BACKEND] [-l] [-- pytest args]
#
#   -n WORLD_SIZE  ranks per test (default 2); torch's MultiProcessTestCase spawns them per test
#   -b BACKEND     gradwire (default) or gloo, to see which failures are the environment's
#   -l             list each test's outcome, not only the failures
#   pytest args    e.g. -k "all_reduce or broadcast" for a subset; test names (test_broadcast
#                  ...) run exactly those tests
#
# Prints "passed P skipped S failed F (U unsupported)": failed counts errors too, and U of them
# failed only because a rank raised gradwire.Unsupported (send/recv and other ops the backend
# refuses by design; each test's failure is listed with its reason). Exits 0 when every failure
# is such a refusal, 1 otherwise. The full suite takes about an hour on 2 busy cores; tests/python/test_torch_suite.py runs
# a bounded subset in the ordinary pytest run.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
world=2 backend=gradwire list=""
while getopts "n:b:l" o; do
  case $o in
    n) world=$OPTARG ;; b) backend=$OPTARG ;; l) list=1 ;;
    *) sed -n '2,15p' "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift
py=${GW_PYTHON:-/usr/bin/python3}
suite="$root/tests/python/torch_suite/gradwire_distributed_suite.py"
args=() named=0
for a in "$@"; do
  if [[ $a == test_* ]]; then args+=("$suite::TestDistBackendWithSpawn::$a"); named=1
  else args+=("$a"); fi
done
[ "$named" = 1 ] || args+=("$suite")
xml=$(mktemp --suffix=.xml); trap 'rm -f "$xml"' EXIT
set +e
# SUITE_TIMEOUT=S (seconds, 0 = none) interrupts pytest after S seconds as Ctrl-C would: it
# still writes the results so far, and the counts below are of the tests that ran.
stop=()
[ "${SUITE_TIMEOUT:-0}" -gt 0 ] && stop=(timeout -s INT -k 30 "$SUITE_TIMEOUT")
# PYTHONHASHSEED: a skip reason that prints a set reads the same in every xdist worker.
BACKEND=$backend WORLD_SIZE=$world GW_TIMEOUT_MS=${GW_TIMEOUT_MS:-10000} PYTHONWARNINGS=ignore \
  PYTHONHASHSEED=${PYTHONHASHSEED:-0} \
  "${stop[@]}" "$py" -m pytest -q -p no:cacheprovider --tb=short ${list:+-rA} --junitxml="$xml" \
  "${args[@]}"
prc=$?
[ "$prc" = 124 ] && echo "stopped after SUITE_TIMEOUT=$SUITE_TIMEOUT s: the counts are of the tests that ran"
set -e
"$py" - "$xml" "$backend" "$world" <<'PY'
import sys, xml.etree.ElementTree as ET
xml, backend, world = sys.argv[1:]
s = ET.parse(xml).getroot()
s = s.find("testsuite") if s.tag == "testsuites" else s
n, f, e, k = (int(s.get(a, 0)) for a in ("tests", "failures", "errors", "skipped"))
unsupported = 0
for case in s.iter("testcase"):
    for bad in list(case.iter("failure")) + list(case.iter("error")):
        text = (bad.get("message") or "") + "\n" + (bad.text or "")
        why = "other"
        if "gradwire.errors.Unsupported" in text:
            unsupported += 1
            why = "unsupported: " + text.split("gradwire.errors.Unsupported: ")[1].split("\n")[0]
        print(f"failed {case.get('name')}: {why}")
reasons = {}
for case in s.iter("testcase"):
    for sk in case.iter("skipped"):
        why = (sk.get("message") or "?").strip().splitlines()[0][:120]
        reasons[why] = reasons.get(why, 0) + 1
for why, count in sorted(reasons.items(), key=lambda kv: -kv[1])[:8]:
    print(f"skipped {count}: {why}")
print(f"torch distributed_test.py on {backend}, world size {world}: "
      f"passed {n - f - e - k} skipped {k} failed {f + e} ({unsupported} unsupported)")
sys.exit(0 if n > 0 and f + e == unsupported else 1)
PY

