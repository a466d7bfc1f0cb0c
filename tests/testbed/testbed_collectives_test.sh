#!/bin/bash
# Collectives across the shaped namespace testbed (tests/testbed/testbed.sh), ranks started with
# the launcher environment as a user would:
#   - on 2x2, 3+1 and 4x2 hosts: every allreduce algorithm that applies to the layout (GW_ALGO),
#     and auto with every dtype and op, each result checked element by element (--check);
#   - broadcast, allgather and reduce-scatter with every algorithm of their tables that applies
#     (GW_ALGO_BROADCAST, GW_ALGO_ALLGATHER, GW_ALGO_REDUCE_SCATTER) and auto, checked;
#   - an algorithm that does not apply (hier on 3+1 hosts) is refused with the reason, for
#     allreduce and for allgather;
#   - a rank killed on one host makes every other rank, on every host, return an error within
#     GW_TIMEOUT_MS instead of hanging.
# Exit 77 (skipped) where the testbed cannot be built (not root).
# usage: testbed_collectives_test.sh TESTBED_SH GRADWIRE_PERF
set -u
tb=$1
perf=$2
fail() { echo "testbed_collectives_test: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "testbed_collectives_test: needs root (network namespaces)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# What every rank runs: one gradwire-perf job per case, each on a store port of its own (rank 0's
# namespace has its own port space) so that a fast rank never meets the previous job's store.
# A failed case is recorded and the rank goes on, so that every rank runs the same cases.
cat >"$work/rank.sh" <<'EOF'
perf=$1; shift
k=0; bad=0
run() {  # run ALGO DTYPE OP
  k=$((k + 1))
  if ! GW_STORE="10.79.0.1:$((TB_PORT + k))" GW_ALGO=$1 GW_TIMEOUT_MS=60000 \
      "$perf" allreduce -b 4 -e 256K -f 64 -n 2 -w 1 --check -d "$2" -o "$3" >"$OUTDIR/r$GW_RANK.$k" 2>&1; then
    echo "rank $GW_RANK: case $k ($1 $2 $3) failed: $(tail -3 "$OUTDIR/r$GW_RANK.$k")"
    bad=1
  fi
}
for algo in $ALGOS; do run "$algo" float32 sum; done
for d in float32 float64 float16 bfloat16 int32 int64 uint8; do
  for o in sum prod min max avg; do run auto "$d" "$o"; done
done
# The other collectives' tables: run_coll COLL ROW ALGO DTYPE
run_coll() {
  k=$((k + 1))
  if ! env GW_STORE="10.79.0.1:$((TB_PORT + k))" "$2=$3" GW_TIMEOUT_MS=60000 \
      "$perf" "$1" -b 64 -e 1M -f 16 -n 2 -w 1 --check -d "$4" >"$OUTDIR/r$GW_RANK.$k" 2>&1; then
    echo "rank $GW_RANK: case $k ($1 $3 $4) failed: $(tail -3 "$OUTDIR/r$GW_RANK.$k")"
    bad=1
  fi
}
for algo in auto $COLL_ALGOS; do
  run_coll broadcast GW_ALGO_BROADCAST "$algo" float32
  run_coll allgather GW_ALGO_ALLGATHER "$algo" bfloat16
  run_coll reduce_scatter GW_ALGO_REDUCE_SCATTER "$algo" float32
  run_coll reduce_scatter GW_ALGO_REDUCE_SCATTER "$algo" int64
done
exit $bad
EOF

layout() {  # layout NAME HOSTS RANKS_PER_HOST ALGOS COLL_ALGOS
  local name=$1 hosts=$2 rph=$3 algos=$4 coll_algos=$5
  mkdir -p "$work/$name"
  local t0=$SECONDS
  out=$(OUTDIR="$work/$name" ALGOS="$algos" COLL_ALGOS="$coll_algos" bash "$tb" -n "$hosts" -R "$rph" -r 1gbit -t 600 -- \
        "bash $work/rank.sh $perf" 2>&1)
  rc=$?
  [ $rc -eq 77 ] && { echo "testbed_collectives_test: testbed unavailable: $out"; exit 77; }
  [ $rc -eq 0 ] || { echo "$out" | tail -40 >&2; fail "$name: a case failed (status $rc)"; }
  echo "testbed_collectives_test: $name ok ($((SECONDS - t0)) s; algorithms: $algos; broadcast," \
       "allgather, reduce_scatter: auto $coll_algos)"
}

layout 2x2 2 2 "ring rhd host_ring hier hier_leader tree bblocks" "ring hier"
layout 3+1 2 3,1 "ring rhd host_ring hier_leader tree bblocks" "ring"
layout 4x2 4 2 "ring rhd host_ring hier hier_leader tree bblocks" "ring hier"

# hier needs the same number of ranks on every host: on 3+1 it is refused, saying why.
out=$(bash "$tb" -n 2 -R 3,1 -t 120 -- \
      "GW_ALGO=hier GW_TIMEOUT_MS=20000 $perf allreduce -b 4 -e 4 -n 1 -w 0" 2>&1)
[ $? -ne 0 ] || fail "GW_ALGO=hier on 3+1 hosts was accepted"
grep -q "GW_ALGO=hier does not apply" <<<"$out" || { echo "$out" >&2; fail "hier refused without the reason"; }
echo "testbed_collectives_test: hier on 3+1 refused with the reason"
out=$(bash "$tb" -n 2 -R 3,1 -t 120 -- \
      "GW_ALGO_ALLGATHER=hier GW_TIMEOUT_MS=20000 $perf allgather -b 64 -e 64 -n 1 -w 0" 2>&1)
[ $? -ne 0 ] || fail "GW_ALGO_ALLGATHER=hier on 3+1 hosts was accepted"
grep -q "GW_ALGO_ALLGATHER=hier does not apply" <<<"$out" ||
  { echo "$out" >&2; fail "allgather hier refused without the reason"; }
echo "testbed_collectives_test: allgather hier on 3+1 refused with the reason"

# A rank killed on host 1 mid-allreduce: every other rank reports an error within GW_TIMEOUT_MS.
cat >"$work/kill.sh" <<'EOF'
perf=$1
t0=$(date +%s%N)
if [ "$GW_RANK" = 3 ]; then
  timeout -s KILL 2 "$perf" allreduce -b 64M -e 64M -n 40 -w 1 >/dev/null 2>&1
  exit 0
fi
GW_TIMEOUT_MS=8000 "$perf" allreduce -b 64M -e 64M -n 40 -w 1 >"$OUTDIR/kill.$GW_RANK" 2>&1
rc=$?
echo "$rc $(( ($(date +%s%N) - t0) / 1000000 ))" >"$OUTDIR/kill.$GW_RANK.rc"
exit 0
EOF
mkdir -p "$work/kill"
OUTDIR="$work/kill" bash "$tb" -n 2 -R 2 -r 1gbit -t 120 -- "bash $work/kill.sh $perf" >/dev/null 2>&1
for r in 0 1 2; do
  [ -f "$work/kill/kill.$r.rc" ] || fail "rank $r never finished after rank 3 was killed"
  read -r rc ms <"$work/kill/kill.$r.rc"
  [ "$rc" -ne 0 ] || fail "rank $r succeeded although rank 3 was killed"
  # Started together; rank 3 dies at 2 s; the deadline is 8 s; set-up and exit take the rest.
  [ "$ms" -lt 16000 ] || fail "rank $r took $ms ms to fail (GW_TIMEOUT_MS=8000)"
  grep -qi "error\|peer\|timeout" "$work/kill/kill.$r" || fail "rank $r failed without a message"
  echo "testbed_collectives_test: rank $r failed in $ms ms: $(grep -m1 -i 'error' "$work/kill/kill.$r" | cut -c1-160)"
done
echo "testbed_collectives_test: ok"
