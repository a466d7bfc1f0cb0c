#!/usr/bin/env bash
# What a new user meets in the first hour with gradwire-perf and gradwired (issue 34):
#   - the collective table parses with the same parser as an nccl-tests line (columns and names);
#   - GW_TRANSPORT means what --transport means, and a bad value is refused at once;
#   - a user's mistake (bad config file, no daemon) is not labelled INTERNAL;
#   - a p2p client with no server fails at once (connection refused), as perftest's does;
#   - gradwired's --metrics on a port in use says so, not CivetWeb's "null context".
# Usage: first_hour_test.sh GRADWIRE_PERF GRADWIRED
set -u
perf=$1
gwd=$2
fail=0
bad() { echo "FAIL: $*" >&2; fail=1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Every run here is short; the deadline keeps a regression from hanging the test.
export GW_TIMEOUT_MS=20000

# One parser for both tools: nccl-tests' data rows (all_reduce_perf and the others) are
#   size count type redop root  time algbw busbw #wrong  time algbw busbw #wrong
# with nccl-tests' type and op names. It prints "busbw=<field 8>" per row, or fails.
nccl_rows() {
  awk '
    /^#/ || NF == 0 { next }
    NF != 13 { print "bad row (" NF " fields): " $0; bad = 1; next }
    $3 !~ /^(int8|uint8|int32|uint32|int64|uint64|half|float|double|bfloat16)$/ { print "bad type: " $3; bad = 1; next }
    $4 !~ /^(sum|prod|max|min|avg|none|mulsum)$/ { print "bad redop: " $4; bad = 1; next }
    $1 !~ /^[0-9]+$/ || $2 !~ /^[0-9]+$/ || $5 !~ /^-?[0-9]+$/ { print "bad size/count/root: " $0; bad = 1; next }
    $9 !~ /^([0-9]+|N\/A)$/ || $13 !~ /^([0-9]+|N\/A)$/ { print "bad #wrong: " $0; bad = 1; next }
    { print "busbw=" $8 }
    END { exit bad }'
}

# A line in nccl-tests' documented format (written here, numbers made up).
sample='     1048576        262144     float     sum      -1    85.12   12.32   21.56      0    84.90   12.35   21.61      0'
got=$(nccl_rows <<<"$sample") || bad "the parser refuses the nccl-tests sample: $got"
[ "$got" = "busbw=21.56" ] || bad "nccl-tests sample: want busbw=21.56, got '$got'"

out=$("$perf" allreduce --np 2 --transport tcp -b 1M -e 1M -n 2 -w 1 -c 2>&1) ||
  bad "gradwire-perf allreduce failed: $out"
rows=$(nccl_rows <<<"$out") || bad "an nccl-tests parser cannot read gradwire-perf's table: $rows"$'\n'"$out"
grep -q '^busbw=[0-9.]*$' <<<"$rows" || bad "no busbw read from gradwire-perf's table: $out"
grep -q ' float  *sum  *-1 ' <<<"$out" || bad "type/redop/root are not nccl-tests': $out"
out=$("$perf" broadcast --np 2 --transport tcp -b 1K -e 1K -n 2 -w 1 --root 1 -d half 2>&1) ||
  bad "gradwire-perf broadcast -d half failed: $out"
nccl_rows <<<"$out" >/dev/null || bad "broadcast table: $out"
grep -q ' half  *none  *1 ' <<<"$out" || bad "broadcast: want 'half none 1' (type redop root): $out"

# GW_TRANSPORT is --transport when the flag is absent; the flag wins; a typo is refused at once.
out=$(GW_TRANSPORT=tcp "$perf" allreduce --np 2 -b 1K -e 1K -n 2 -w 1 2>&1) ||
  bad "GW_TRANSPORT=tcp run failed: $out"
grep -q '^# transport: tcp.*(asked: tcp)' <<<"$out" || bad "GW_TRANSPORT=tcp did not run tcp: $out"
out=$(GW_TRANSPORT=tcp "$perf" allreduce --np 2 --transport shm -b 1K -e 1K -n 2 -w 1 2>&1) ||
  bad "--transport shm with GW_TRANSPORT=tcp failed: $out"
grep -q '^# transport: shm.*(asked: shm)' <<<"$out" || bad "--transport did not win: $out"
start=$(date +%s%N)
out=$(GW_TRANSPORT=tpc "$perf" allreduce --np 2 -b 1K -e 1K 2>&1)
rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ $rc -eq 2 ] || bad "GW_TRANSPORT=tpc: want exit status 2, got $rc: $out"
grep -q 'GW_TRANSPORT' <<<"$out" && grep -q 'tpc' <<<"$out" ||
  bad "GW_TRANSPORT=tpc: the error does not name the variable and its value: $out"
[ $ms -lt 5000 ] || bad "GW_TRANSPORT=tpc took $ms ms to be refused"
out=$(GW_TRANSPORT=tpc "$perf" p2p --np 2 -s 1K -n 5 --lat-iters 5 2>&1)
[ $? -eq 2 ] && grep -q 'GW_TRANSPORT' <<<"$out" || bad "p2p took GW_TRANSPORT=tpc: $out"

# A user's mistake is never INTERNAL, and the last line says what went wrong.
printf 'timeout_ms = [oops\n' >"$work/bad.toml"
out=$(GW_CONFIG_FILE="$work/bad.toml" "$perf" allreduce --np 2 -b 1K -e 1K 2>&1)
[ $? -ne 0 ] || bad "a bad config file was accepted: $out"
grep -q 'INTERNAL' <<<"$out" && bad "a bad config file reads as INTERNAL: $out"
grep -q 'bad.toml:1' <<<"$out" || bad "the error does not name the file and line: $out"
out=$(GW_DAEMON="unix:$work/none.sock" "$perf" allreduce --np 2 -b 1K -e 1K 2>&1)
[ $? -ne 0 ] || bad "a missing daemon was accepted: $out"
grep -q 'INTERNAL' <<<"$out" && bad "a missing daemon reads as INTERNAL: $out"
# The run's last word is the ranks' reason, not "rank N exited with status 2".
tail -1 <<<"$out" | grep -q 'run failed: .*none.sock' || bad "the run's error is not the reason: $out"

# A p2p client with no server: connection refused is known at once (perftest fails at once too).
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start=$(date +%s%N)
out=$(timeout 30 "$perf" p2p --transport tcp 127.0.0.1 --port "$port" 2>&1)
rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ $rc -ne 0 ] && [ $rc -ne 124 ] || bad "p2p client with no server: exit status $rc: $out"
grep -q 'refused' <<<"$out" && grep -q 'no p2p server' <<<"$out" ||
  bad "p2p client with no server does not say why: $out"
# It tries for 1 s (a server may be starting); the deadline it must not wait out is GW_TIMEOUT_MS
# (300 s by default). 15 s leaves room for a sanitizer build on a loaded machine (7.6 s seen).
[ $ms -lt 15000 ] || bad "p2p client with no server took $ms ms"

# gradwired --metrics on a port that another process holds.
if "$gwd" --help 2>&1 | grep -q -- --metrics; then
  exec 3< <(python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True); time.sleep(30)' 2>/dev/null)
  holder=$!
  read -r held <&3
  out=$(timeout 20 "$gwd" --foreground --socket "$work/gwd.sock" --metrics "127.0.0.1:$held" 2>&1)
  rc=$?
  if grep -q 'no Prometheus support' <<<"$out"; then
    echo "skip: gradwired built without Prometheus"
  else
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || bad "gradwired --metrics on a port in use: status $rc: $out"
    grep -q 'in use' <<<"$out" || bad "gradwired --metrics on a port in use does not say so: $out"
    grep -q 'null context' <<<"$out" && bad "gradwired --metrics shows CivetWeb's text: $out"
  fi
  kill "$holder" 2>/dev/null
  exec 3<&-
fi

[ $fail -eq 0 ] && echo "first_hour_test: all checks passed"
exit $fail
