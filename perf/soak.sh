#!/bin/bash
# Soak run on the namespace testbed: for DURATION seconds every rank of an H x R job runs one
# random case after another, each a new communicator (a new gradwire-perf job on a store port of
# its own): a random collective (allreduce with a random algorithm, allgather, reduce_scatter,
# broadcast, alltoall), size, dtype and op, every element checked (--check); or a compressed
# allreduce with a random codec; and every FAULT_EVERY-th case a fault: one rank's job killed at a
# random moment, after which every other rank must fail with an error within GW_TIMEOUT_MS.
# Ranks agree on each case through a shared seed (case k uses SEED+k), and after a fault case
# they meet again (a file per rank in the run's folder, or at the latest the deadline of the
# kill). Stops at the first unexpected outcome (a wrong element, a failure without a fault, a
# rank that outlives the deadline) and prints a summary either way.
#
# usage: perf/soak.sh [-d DURATION_S] [-n HOSTS] [-R RANKS_PER_HOST] [-r RATE] [-f FAULT_EVERY]
#                     [-s SEED] [-p GRADWIRE_PERF] [-t TESTBED_SH]
# Needs root (network namespaces); exit 77 where the testbed cannot be built.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
DURATION=120; HOSTS=2; RPH=2; RATE=1gbit; FAULT_EVERY=8; SEED=$(date +%s)
PERF=$root/build/release/perf/gradwire-perf; TB=$root/tests/testbed/testbed.sh
for a in "$@"; do [ "$a" = --help ] && set -- -h; done  # --help means -h
while getopts "d:n:R:r:f:s:p:t:h" o; do
  case $o in
    d) DURATION=$OPTARG ;; n) HOSTS=$OPTARG ;; R) RPH=$OPTARG ;; r) RATE=$OPTARG ;;
    f) FAULT_EVERY=$OPTARG ;; s) SEED=$OPTARG ;; p) PERF=$OPTARG ;; t) TB=$OPTARG ;;
    h) sed -n '2,14p' "$0"; exit 0 ;;
    *) sed -n '2,14p' "$0" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "soak: needs root (network namespaces)"; exit 77; }
[ -x "$PERF" ] || { echo "soak: no gradwire-perf at $PERF (build first or pass -p)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
TIMEOUT_MS=5000
echo "soak: $HOSTS hosts x $RPH ranks at ${RATE:-full rate}, $DURATION s, a fault every $FAULT_EVERY cases, seed $SEED"

cat >"$work/rank.sh" <<'EOS'
perf=$1
# Rank 0 alone decides whether case k runs (SOAK_END, set once by soak.sh) and leaves its word in
# OUTDIR (every host sees it); the others follow. Each rank reading the clock itself could
# disagree about the last case across a second boundary, and a rank then started a case the
# others never ran.
end=$SOAK_END
world=$GW_WORLD_SIZE
k=0
log() { echo "$*" >>"$OUTDIR/log.$GW_RANK"; }
runs() {
  if [ "$GW_RANK" = 0 ]; then
    if [ "$(date +%s)" -lt "$end" ]; then touch "$OUTDIR/go.$1"; return 0; fi
    touch "$OUTDIR/stop.$1"
    return 1
  fi
  # Rank 0 ends case k-1 at most a fault case's meeting (2 deadlines + 9 s) after this rank.
  local by=$(( $(date +%s) + 2 * TIMEOUT_MS / 1000 + 30 ))
  while :; do
    [ -e "$OUTDIR/go.$1" ] && return 0
    [ -e "$OUTDIR/stop.$1" ] && return 1
    if [ "$(date +%s)" -ge "$by" ]; then log "FAIL $1: no word from rank 0 whether to run it"; exit 1; fi
    sleep 0.05
  done
}
while runs $((k + 1)); do
  k=$((k + 1))
  RANDOM=$((SEED + k))
  colls=(allreduce allreduce allgather reduce_scatter broadcast alltoall)
  algos=(auto ring rhd host_ring hier hier_leader tree bblocks)
  dtypes=(float32 float64 float16 bfloat16 int32 int64 uint8)
  ops=(sum prod min max avg)
  codecs=(fp16 bf16 topk:0.01 randomk:0.05 sign qsgd:8 powersgd:2)
  coll=${colls[RANDOM % ${#colls[@]}]}
  algo=${algos[RANDOM % ${#algos[@]}]}
  dtype=${dtypes[RANDOM % ${#dtypes[@]}]}
  op=${ops[RANDOM % ${#ops[@]}]}
  size=$(( (1 << (RANDOM % 24)) * (1 + RANDOM % 3) ))   # 1 B .. 48 MiB
  [ "$dtype" = uint8 ] && [ "$op" = prod ] && op=max   # products of bytes overflow at once
  kind=coll
  [ $((RANDOM % 5)) = 0 ] && kind=codec
  [ $((k % FAULT_EVERY)) = 0 ] && kind=fault
  victim=$((RANDOM % world))
  delay_ms=$((100 + RANDOM % 1500))
  codec=${codecs[RANDOM % ${#codecs[@]}]}
  port=$((TB_PORT + 1000 + k))
  t0=$(date +%s%N)
  case $kind in
    coll)
      args=("$coll" -b "$size" -e "$size" -n 2 -w 0 --check -d "$dtype")
      [ "$coll" = allreduce ] || [ "$coll" = reduce_scatter ] && args+=(-o "$op")
      [ "$coll" = allreduce ] && args+=(--algo "$algo")
      desc="${args[*]}"
      GW_STORE="$TB_STORE:$port" "$perf" "${args[@]}" >"$OUTDIR/out.$GW_RANK" 2>&1
      rc=$?
      # An algorithm that does not apply to this layout is refused on every rank: not a failure.
      if [ $rc -ne 0 ] && grep -q "does not apply" "$OUTDIR/out.$GW_RANK"; then rc=0; desc+=" (refused)"; fi
      ;;
    codec)
      size=$(( (size + 3) / 4 * 4 + 4096 ))
      desc="allreduce --codec $codec -b $size"
      GW_STORE="$TB_STORE:$port" "$perf" allreduce -b "$size" -e "$size" -n 3 -w 0 --codec "$codec" \
        >"$OUTDIR/out.$GW_RANK" 2>&1
      rc=$?
      ;;
    fault)
      desc="allreduce 16M, rank $victim killed at $delay_ms ms"
      GW_STORE="$TB_STORE:$port" GW_TIMEOUT_MS=$TIMEOUT_MS "$perf" allreduce -b 16M -e 16M -n 200 -w 0 \
        --check >"$OUTDIR/out.$GW_RANK" 2>&1 &
      pid=$!
      if [ "$GW_RANK" = "$victim" ]; then
        sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
        kill -KILL $pid 2>/dev/null
      fi
      wait $pid
      rc=$?
      ;;
  esac
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  if [ $kind = fault ]; then
    if [ "$GW_RANK" != "$victim" ]; then
      if [ $rc = 0 ]; then log "FAIL $k $desc: succeeded although rank $victim was killed"; exit 1; fi
      if [ $ms -gt $((delay_ms + 2 * TIMEOUT_MS + 8000)) ]; then
        log "FAIL $k $desc: failed only after $ms ms"; exit 1
      fi
    fi
    log "ok $k fault $desc: status $rc after $ms ms"
    # Meet again: each rank marks case k done in OUTDIR (every host sees it) and waits for the
    # others' marks, at most until every rank's job has ended within the deadline of the kill.
    touch "$OUTDIR/met.$k.$GW_RANK"
    meet_by=$(( $(date +%s) + (delay_ms + 2 * TIMEOUT_MS + 9000 - ms) / 1000 + 1 ))
    while [ "$(find "$OUTDIR" -maxdepth 1 -name "met.$k.*" | wc -l)" -lt "$world" ] &&
          [ "$(date +%s)" -lt "$meet_by" ]; do
      sleep 0.1
    done
  else
    if [ $rc != 0 ]; then
      log "FAIL $k $desc: status $rc: $(grep -m3 -iE 'error|wrong' "$OUTDIR/out.$GW_RANK" | tr '\n' ' ' | cut -c1-300)"
      exit 1
    fi
    log "ok $k $kind $desc ($ms ms)"
  fi
done
log "done $k cases"
EOS

SOAK_END=$(( $(date +%s) + DURATION + 10 ))  # + the testbed's set-up before the ranks start
OUTDIR=$work DURATION=$DURATION SOAK_END=$SOAK_END SEED=$SEED FAULT_EVERY=$FAULT_EVERY TIMEOUT_MS=$TIMEOUT_MS \
GW_TIMEOUT_MS=30000 bash "$TB" -n "$HOSTS" -R "$RPH" ${RATE:+-r "$RATE"} -t $((DURATION + 300)) -- \
  "bash $work/rank.sh $PERF" >"$work/testbed.log" 2>&1
rc=$?
[ $rc -eq 77 ] && { echo "soak: testbed unavailable"; exit 77; }
cases=$(grep -h "^ok" "$work"/log.0 2>/dev/null | wc -l)
faults=$(grep -h "^ok .* fault" "$work"/log.0 2>/dev/null | wc -l)
codecs=$(grep -h "^ok .* codec" "$work"/log.0 2>/dev/null | wc -l)
echo "soak: rank 0 ran $cases cases ($codecs compressed, $faults with a fault); its log:"
sed "s/^/    /" "$work/log.0" | tail -n "${SOAK_LOG_LINES:-12}"
if grep -h "^FAIL" "$work"/log.* >/dev/null 2>&1; then
  grep -h "^FAIL" "$work"/log.* | head -5
  echo "soak: FAILED (seed $SEED)"
  exit 1
fi
[ $rc -eq 0 ] || { tail -20 "$work/testbed.log"; echo "soak: FAILED: testbed status $rc (seed $SEED)"; exit 1; }
# The perf binary's own processes: by executable name (the command lines of this script and of
# ctest name the binary too), then by executable path (another build's are not this run's).
exe=$(readlink -f "$PERF"); leftover=0
for p in $(pgrep -x "$(basename "$PERF" | cut -c1-15)"); do
  [ "$(readlink -f "/proc/$p/exe" 2>/dev/null)" = "$exe" ] && leftover=$((leftover + 1))
done
[ "$leftover" = 0 ] || { echo "soak: FAILED: $leftover gradwire-perf processes left"; exit 1; }
echo "soak: ok"
