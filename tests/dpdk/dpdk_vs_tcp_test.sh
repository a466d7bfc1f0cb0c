#!/usr/bin/env bash
# perf/dpdk_vs_tcp.sh in a tiny configuration (2 namespace hosts, small sizes, 1 repetition):
# the side-by-side table must hold figures for both transports, the DPDK runs must have run on
# the PMD (net_af_xdp0) and the TCP runs on d0, and every allreduce --check must have passed.
# Bad arguments are refused before anything starts. Exit 77 (skipped) where the testbed cannot
# run (not root, no network namespaces).
#   dpdk_vs_tcp_test.sh SCRIPT GRADWIRE_PERF
set -uo pipefail
script=$1 perf=$2
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$(bash "$script" -b "$perf" -p carrier-pigeon 2>&1)
[ $? = 2 ] || fail "-p carrier-pigeon was not refused with status 2: $out"
grep -q "use af_xdp or af_packet" <<<"$out" || fail "no reason for -p carrier-pigeon: $out"
out=$(bash "$script" -b /nonexistent/gradwire-perf 2>&1)
[ $? = 2 ] || fail "a missing binary was not refused with status 2: $out"

err=$(mktemp)
trap 'rm -f "$err"' EXIT
# Few iterations: seconds on a quiet machine; the limit leaves room for a heavily loaded one.
table=$(bash "$script" -b "$perf" -r 1 -n 2 -s "4K 64K 4" -q "64K 64K 2" -i 20 -L 100 -l "0 0.01" \
  -t 120 2>"$err")
rc=$?
if [ $rc = 77 ]; then cat "$err" >&2; exit 77; fi
echo "$table"
[ $rc = 0 ] || { cat "$err" >&2; fail "dpdk_vs_tcp.sh exited with $rc"; }
num='[0-9]+(\.[0-9]+)?'
grep -Eq "^ +lat 8B us +af_xdp +0 +1 +$num +$num" <<<"$table" || fail "no p2p latency row with both transports"
grep -Eq "^ +bw 64K MB/s +af_xdp +1% +1 +$num +$num" <<<"$table" || fail "no p2p bandwidth row under 1% loss"
for size in 4096 16384 65536; do
  grep -Eq "^ +$size +af_xdp +0 +1 +$num +$num" <<<"$table" || fail "no allreduce row of $size B"
done
grep -q "^# tcp interfaces: d0:10.77.0.1" <<<"$table" || fail "tcp did not run on d0"
grep -q "interfaces: net_af_xdp0" <<<"$table" || fail "p2p dpdk did not run on net_af_xdp0"
grep -q "^#   tcp ran: tcp$" <<<"$table" || fail "allreduce --transport tcp did not run tcp"
grep -q "^#   dpdk-af_xdp-0 ran: dpdk on net_af_xdp0$" <<<"$table" ||
  fail "allreduce --transport dpdk did not reach the DPDK backend on net_af_xdp0"
grep -Eq "^# check: [1-9][0-9]* allreduce rows verified with --check, 0 wrong elements" <<<"$table" ||
  fail "allreduce --check did not pass"
! grep -q INCOMPLETE <<<"$table" || fail "the table says it is incomplete"
echo "OK"
