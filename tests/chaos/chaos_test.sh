#!/bin/bash
# Chaos on the namespace testbed (tests/testbed/testbed.sh): 2 hosts x 2 ranks at 1 Gbit/s, each
# rank running 64 MiB allreduces with their results checked (gradwire-perf --check), while one
# fault is injected from inside a host. Every case must end, on every rank, in the right result
# or in an error naming the problem, within GW_TIMEOUT_MS of the fault (plus slack for start-up
# and exit on a 2-core machine), never a hang; and nothing may be left behind (processes, shm).
#   link-blip     host 1's data link down for 1 s (< GW_TIMEOUT_MS) once data flows over it:
#                 every rank completes. This case runs with a deadline of 15 s, not 5: kernel
#                 TCP resends what the blip lost on its exponential backoff (the RTO doubles at
#                 every try), so the first resend after the link is back can come seconds later,
#                 and a step's "no progress" clock started before the blip. With RTTs stretched by
#                 a loaded 2-core machine that passed 5 s (ci24 and ci26, 2026-12-01: rank 0 "no
#                 progress within 5000 ms" after a 1 s blip, passed on the retry).
#   link-down     host 1's data link down for good (> GW_TIMEOUT_MS): every rank fails in time
#   sigstop       rank 3 stopped past the deadline, then continued: every rank fails in time
#   throttle      host 1's link shaped to 1 Mbit/s mid-collective: every rank fails in time
#   store-killed  rank 0 (the store's host) killed mid-job: every other rank fails in time
#   setup-killed  rank 3 killed while the ranks connect: every other rank fails in time
# Not here: 1% loss on the DPDK path while a host dies. This kernel has neither netem nor tc's
# gact action (`tc filter add dev X egress protocol all u32 match u32 0 0 action gact ok random
# netrand drop 100` fails with "Failed to load TC action module"), so that case drops 1% of every
# host's frames in the DPDK engine itself (GW_DPDK_INJECT_LOSS) and lives in
# tests/dpdk/dpdk_netns_test.cc (HostKilledMidRunUnderOnePercentLoss...).
# Exit 77 (skipped) where the testbed cannot be built (not root).
# usage: chaos_test.sh TESTBED_SH GRADWIRE_PERF [CASE...]
set -u
tb=$1
perf=$2
shift 2
cases=${*:-link-blip link-down sigstop throttle store-killed setup-killed}
fail() { echo "chaos_test: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "chaos_test: needs root (network namespaces)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
TIMEOUT_MS=5000
BLIP_TIMEOUT_MS=15000

# Every rank: one gradwire-perf job (10 x 64 MiB, checked: at 1 Gbit/s about 6 s, so a fault at
# 2 s finds it mid-transfer; the blip waits for data to flow), its fault started in the
# background by the rank that owns it; writes "status elapsed_ms fault_ms" (fault_ms: when the
# fault began, relative to the start, -1 when this rank injected nothing) for the checker. The
# stopped rank is continued once every other rank has ended (each after waiting out its
# deadline), at the latest 4 s after its deadline.
cat >"$work/rank.sh" <<'EOS'
perf=$1 case=$2
t0=$(date +%s%N)
ms() { echo $(( ($(date +%s%N) - t0) / 1000000 )); }
tx_bytes() { awk -F'[: ]+' '$2 == "d0" { print $11 }' /proc/net/dev; }  # this namespace's d0
"$perf" allreduce -b 64M -e 64M -n 10 -w 1 --check >"$OUTDIR/out.$GW_RANK" 2>&1 &
pid=$!
fault=-1
case "$case:$GW_RANK" in
  # Once 32 MiB have left d0 (at most 10 s): the connections are up and a transfer under way.
  # At a fixed 2 s a slow start-up (a loaded machine) put the blip into the connections' setup,
  # where a lost SYN is sent again only 1 s and then 3 s later: a step then waited out the
  # deadline (ci12, 2026-11-30: rank 0 "no progress within 5000 ms" in its warm-up).
  link-blip:2)   b0=$(tx_bytes)
                 for _ in $(seq 200); do
                   [ $(( $(tx_bytes) - b0 )) -ge 33554432 ] && break
                   sleep 0.05
                 done
                 fault=$(ms); ip link set d0 down; sleep 1; ip link set d0 up ;;
  link-down:2)   sleep 2; fault=$(ms); ip link set d0 down ;;
  sigstop:3)     sleep 2; fault=$(ms); kill -STOP $pid
                 for _ in $(seq $(( (TIMEOUT_MS / 1000 + 4) * 10 ))); do
                   [ -f "$OUTDIR/rc.0" ] && [ -f "$OUTDIR/rc.1" ] && [ -f "$OUTDIR/rc.2" ] && break
                   sleep 0.1
                 done
                 kill -CONT $pid ;;
  throttle:2)    sleep 2; fault=$(ms); tc qdisc replace dev d0 root tbf rate 1mbit burst 16kb latency 400ms ;;
  store-killed:0) sleep 2; fault=$(ms); kill -KILL $pid ;;
  setup-killed:3) sleep 0.3; fault=$(ms); kill -KILL $pid ;;
esac
wait $pid
rc=$?
echo "$rc $(ms) $fault" >"$OUTDIR/rc.$GW_RANK"
[ "$case" = link-down ] && [ "$GW_RANK" = 2 ] && ip link set d0 up
exit 0
EOS

leftovers() {  # processes of this perf binary (its path: another build's are not ours to judge)
  local exe p found=1
  exe=$(readlink -f "$perf")
  for p in $(pgrep -x "$(basename "$perf" | cut -c1-15)"); do
    [ "$(readlink -f "/proc/$p/exe" 2>/dev/null)" = "$exe" ] && { ps -o pid,args -p "$p" >&2; found=0; }
  done
  return $found
}

# gradwire's own files in /dev/shm, sorted: names beginning as the product names its shared
# memory (core/net/shm_transport.cc "gradwire-shm", daemon/admission.cc "gwd-arena", the tests'
# "gw-"). Both are memfds today, so none should ever appear; other processes' files (another
# test, a browser) are not this test's to judge.
our_shm() {
  ls /dev/shm | grep -E '^(gradwire|gwd|gw-)' | sort
}

for c in $cases; do
  out="$work/$c"
  mkdir -p "$out"
  before=$(our_shm)
  t0=$SECONDS
  tmo=$TIMEOUT_MS
  [ "$c" = link-blip ] && tmo=$BLIP_TIMEOUT_MS
  OUTDIR="$out" TIMEOUT_MS=$tmo GW_TIMEOUT_MS=$tmo bash "$tb" -n 2 -R 2 -r 1gbit -t 180 -- \
    "bash $work/rank.sh $perf $c" >"$out/testbed.log" 2>&1
  rc=$?
  [ $rc -eq 77 ] && { echo "chaos_test: testbed unavailable: $(tail -3 "$out/testbed.log")"; exit 77; }
  [ $rc -eq 0 ] || { tail -30 "$out/testbed.log" >&2; fail "$c: the testbed failed (status $rc)"; }
  # The fault's start, from the rank that injected it.
  fault=-1
  for r in 0 1 2 3; do
    [ -f "$out/rc.$r" ] || { tail -30 "$out/testbed.log" >&2; fail "$c: rank $r never finished"; }
    read -r _ _ f <"$out/rc.$r"
    [ "$f" -ge 0 ] && fault=$f
  done
  for r in 0 1 2 3; do
    read -r status ms _ <"$out/rc.$r"
    case "$c:$r" in
      store-killed:0|setup-killed:3) continue ;;  # the killed rank itself
    esac
    if [ "$c" = link-blip ]; then
      # gradwire-perf --check exits non-zero on any wrong element
      [ "$status" = 0 ] || { tail -5 "$out/out.$r" >&2; fail "$c: rank $r failed ($status) after a 1 s blip"; }
      continue
    fi
    [ "$status" != 0 ] || { tail -5 "$out/out.$r" >&2; fail "$c: rank $r succeeded despite the fault"; }
    # Within the deadline of the fault, plus slack for a 64 MiB step in flight and the exit.
    [ $((ms - fault)) -lt $((2 * TIMEOUT_MS + 6000)) ] ||
      fail "$c: rank $r failed $((ms - fault)) ms after the fault (GW_TIMEOUT_MS=$TIMEOUT_MS)"
    grep -qiE "error|timeout|peer|closed|abort" "$out/out.$r" || fail "$c: rank $r failed without a message"
  done
  # A second for the last processes to be reaped, no longer.
  for _ in $(seq 10); do leftovers 2>/dev/null || break; sleep 0.1; done
  leftovers && fail "$c: gradwire-perf processes left behind"
  left=$(comm -13 <(echo "$before") <(our_shm) | tr '\n' ' ')
  [ -z "${left// /}" ] || fail "$c: files left in /dev/shm: $left"
  msgs=""
  for r in 0 1 2 3; do
    read -r status ms _ <"$out/rc.$r"
    msgs+=" r$r=$status/${ms}ms"
  done
  echo "chaos_test: $c ok ($((SECONDS - t0)) s; fault at ${fault} ms; status/elapsed:$msgs)"
  [ "$c" = link-blip ] || grep -m1 -hiE "error" "$out/out.1" | cut -c1-200 | sed 's/^/    rank 1: /'
done
echo "chaos_test: ok"
