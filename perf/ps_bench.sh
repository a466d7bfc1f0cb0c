#!/usr/bin/env bash
# BytePS's claim on the shaped namespace testbed (tests/testbed/testbed.sh): the parameter server's
# push_pull (gradwire.kv, bsp, sum) against gradwire's allreduce among the same workers, one
# worker per host, in the same run (interleaved repetitions, perf/ps_bench_rank.py).
#
# usage: perf/ps_bench.sh [--workers N] [--rate RATE] [--size 64M] [--partition 4M]
#                         [--chunks "0 256K"] [-n ITERS] [-r REPS] [--algo auto]
#                         [--layouts "servers colocated"] [-B BUILD_DIR] [-t TIMEOUT_S]
#   layouts   servers: N worker hosts + N server-only hosts (GW_ROLE=server, python3 -m gradwire.kv,
#             GW_KV_SERVERS=N); colocated: the N worker hosts only, one server thread inside each
#             worker (GW_KV_SERVERS=0). Each layout is one testbed session; its allreduce rows
#             are measured in that session on the same workers (GW_ALGO=--algo; default auto, the
#             cost model's choice: with one worker per host the hierarchical allreduce is refused,
#             "needs more than one rank per host", and its inter-host phase is the ring itself).
#   --rate    tc rate of every host's link (default 1gbit; "none" = unshaped)
#   --chunks  GW_KV_CHUNK_BYTES of each store measured (one store per value, same session, rows
#             interleaved): a partition is pushed, summed and answered in chunks of this size;
#             0 = whole partitions (the store before streaming), the default "0 256K" sets both
#             side by side
#
# Rows: allreduce; per chunk C, "push_pull chunk=C": one key of the whole buffer (the library cuts
# it into partitions of P bytes, each streamed in chunks of C); "ipushpull/part chunk=C": B/P keys
# of P bytes, all in flight at once (BytePS cuts tensors into keys on the worker this way). Printed per layout: seconds per call (median of REPS x ITERS, the slowest rank's), the speed-up
# over the allreduce of the same session, and the model's bound beside each: per worker link,
# allreduce moves 2(n-1)/n x M each way; push_pull with k server-only hosts moves
# 2n(n-1)M / (n^2 + kn - 2k) (BytePS, OSDI '20): M with k = n, 2(n-1)/n x M co-located (k = 0).
# "model_ends" adds the pipeline's ends to push_pull: a unit (a chunk, or a whole partition with
# chunk 0) is summed only once every worker pushed all of it, and its reply follows; a worker
# pushes to its R remote servers at once (R = k, or n-1 co-located), B/R each, so the first
# reply starts and the last one ends R x U / B after the pushes (U the unit's bytes): push_pull
# takes (kv_share x M + R x U) / B, and model_ends is the allreduce's time over that.
# Model times are at the nominal rate and at the machine ceiling, measured in the same run just
# before: every host of a session of H hosts (H = N for the allreduce and co-located rows, 2N for
# the servers rows) streaming M over plain TCP to the next while receiving M from the previous,
# all at once; the slowest host's time is "M each way" at what the links and this machine's CPUs
# carry together (the namespaces' links all cross one kernel's bridge).
# Needs root (network namespaces) and the library with gw_kv_* (build/release/capi).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
workers=4; rate=1gbit; size=64M; part=4M; chunks="0 256K"; iters=3; reps=2; algo=auto; timeout_s=600
layouts="servers colocated"; build="$root/build/release"
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) workers="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --size) size="$2"; shift 2 ;;
    --partition) part="$2"; shift 2 ;;
    --chunks) chunks="$2"; shift 2 ;;
    --algo) algo="$2"; shift 2 ;;
    --layouts) layouts="$2"; shift 2 ;;
    -n) iters="$2"; shift 2 ;;
    -r) reps="$2"; shift 2 ;;
    -B) build="$(cd "$2" && pwd)" || exit 2; shift 2 ;;
    -t) timeout_s="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "ps_bench: unknown argument '$1'" >&2; usage ;;
  esac
done
source "$here/sizes.sh"  # to_bytes()
source "$here/link_ceiling.sh"  # ceiling_best()
bytes=$(to_bytes "$size"); pbytes=$(to_bytes "$part")
cbytes=(); for c in $chunks; do cbytes+=("$(to_bytes "$c")") || exit 2; done
[ ${#cbytes[@]} -ge 1 ] || { echo "ps_bench: --chunks needs at least one size" >&2; exit 2; }
clist=$(IFS=,; echo "${cbytes[*]}")
for v in "$workers" "$iters" "$reps" "$timeout_s"; do
  if ! [[ "$v" =~ ^[0-9]+$ ]] || [ "$v" -lt 1 ]; then echo "ps_bench: '$v' is not a count >= 1" >&2; exit 2; fi
done
[ "$workers" -ge 2 ] || { echo "ps_bench: --workers must be >= 2" >&2; exit 2; }
[ $((bytes % 4)) -eq 0 ] || { echo "ps_bench: --size must be whole float32s" >&2; exit 2; }
for l in $layouts; do
  case "$l" in servers|colocated) ;; *) echo "ps_bench: unknown layout '$l'" >&2; exit 2 ;; esac
done
rate_bps=""
case "$rate" in
  *gbit) rate_bps=$(( ${rate%gbit} * 1000000000 )) ;; *mbit) rate_bps=$(( ${rate%mbit} * 1000000 )) ;;
  none) ;; *) echo "ps_bench: --rate '$rate': <n>gbit, <n>mbit or none" >&2; exit 2 ;;
esac
lib="$build/capi/libgradwire.so"
[ -f "$lib" ] || { echo "ps_bench: $lib not found; build the gradwire target first" >&2; exit 2; }
py=/usr/bin/python3; [ -x "$py" ] || py=python3
if ! GRADWIRE_LIBRARY="$lib" PYTHONPATH="$root/python" "$py" -c \
    'import sys, gradwire._lib as l; sys.exit(0 if l.has("gw_kv_create") else 1)' 2>/dev/null; then
  echo "ps_bench: $lib has no gw_kv_* (the parameter server, issue 30)" >&2; exit 2
fi
[ "$(id -u)" = 0 ] || { echo "ps_bench: needs root (network namespaces)" >&2; exit 77; }
rate_arg=(-r "$rate"); [ "$rate" = none ] && rate_arg=()
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
export GW_JOB_TOKEN="${GW_JOB_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}"

echo "# ps_bench: $workers workers (one per host), links $rate, $bytes B float32, partitions" \
  "$pbytes B in chunks of [$clist] B, push_pull bsp sum vs allreduce (GW_ALGO=$algo), $reps x $iters timed calls" \
  "(interleaved), medians of the slowest rank; load average $(cut -d' ' -f1 /proc/loadavg) at the" \
  "start (a shared machine: every figure is under load)"
declare -A res ceil
failed=0
# The machine ceiling for each session size the layouts use: twice with 1 and twice with 4
# connections per link (one carries more than four on a 2-core VM, four more on a fast host), the
# best try by its slowest host, as perf/cluster_bench.sh measures it.
sizes="$workers"; [[ " $layouts " == *" servers "* ]] && sizes+=" $((2 * workers))"
for h in $sizes; do
  ceil[$h]=""
  for streams in 1 4 1 4; do
    bash "$root/tests/testbed/testbed.sh" -n "$h" "${rate_arg[@]}" -t "$timeout_s" -- \
      "PYTHONPATH=$root/python GRADWIRE_LIBRARY=$lib exec $py $here/ps_bench_rank.py --ceiling-only \
      --hosts $h --bytes $bytes --ceiling-port \$((TB_PORT + 7)) --ceiling-streams $streams" \
      >"$work/ceil$h.out" 2>&1
    ceil[$h]=$(ceiling_best "$(cat "$work/ceil$h.out")" "$h" "${ceil[$h]}")
  done
  if [ -z "${ceil[$h]}" ]; then
    echo "# ceiling on $h hosts: FAILED (no try had all $h hosts report):" >&2
    tail -20 "$work/ceil$h.out" >&2; exit 1
  fi
done
for layout in $layouts; do
  if [ "$layout" = servers ]; then hosts=$((2 * workers)); servers=$workers; else hosts=$workers; servers=0; fi
  # The store on host 0's data address (10.77.0.1), not the control network's: a kv server
  # advertises its address on the route to the store (kv/io.cc advertised_address), and the kv's
  # traffic must cross the shaped links as the allreduce's does (GW_SOCKET_IFNAME=d0).
  common="export PYTHONPATH=$root/python GRADWIRE_LIBRARY=$lib GW_SOCKET_IFNAME=d0 \
    GW_STORE=10.77.0.1:\$TB_PORT MASTER_ADDR=10.77.0.1 MASTER_PORT=\$TB_PORT GW_KV_SERVERS=$servers \
    GW_ALGO=$algo GW_TIMEOUT_MS=120000;"
  cmd="$common if [ \$TB_HOST -lt $workers ]; then GW_RANK=\$TB_HOST GW_WORLD_SIZE=$workers \
    exec $py $here/ps_bench_rank.py --bytes $bytes --partition $pbytes --chunks $clist -n $iters -r $reps; \
    else GW_ROLE=server \
    GW_KV_SERVER_RANK=\$((TB_HOST - $workers)) exec $py -m gradwire.kv; fi"
  bash "$root/tests/testbed/testbed.sh" -n "$hosts" "${rate_arg[@]}" -t "$timeout_s" -- "$cmd" \
    >"$work/$layout.out" 2>&1
  rc=$?
  line=$(grep -m1 -o 'RESULT .*' "$work/$layout.out")
  if [ -z "$line" ]; then
    echo "# $layout: FAILED (testbed status $rc):" >&2; tail -20 "$work/$layout.out" >&2
    failed=$((failed + 1)); continue
  fi
  [ $rc -eq 0 ] || echo "# $layout: testbed status $rc after the result (servers' exit?)" >&2
  res[$layout]="${line#RESULT }"
done

field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"; }  # field "a=1 b=2" b -> 2
printf "%-10s %-24s %9s %8s %11s %10s %13s %13s %5s\n" "#layout" "system" "time_s" "speedup" \
  "model_bound" "model_ends" "model_s@rate" "model_s@ceil" "runs"
for layout in $layouts; do
  [ -n "${res[$layout]:-}" ] || continue
  line="${res[$layout]}"
  k=0; hosts=$workers; [ "$layout" = servers ] && { k=$workers; hosts=$((2 * workers)); }
  kvrows=""
  for c in "${cbytes[@]}"; do
    kvrows+="$c:$(field "$line" "kv_c${c}_s"):$(field "$line" "kv_c${c}_runs"):"
    kvrows+="$(field "$line" "kv_keys_c${c}_s"):$(field "$line" "kv_keys_c${c}_runs") "
  done
  awk -v n="$workers" -v k="$k" -v M="$bytes" -v P="$pbytes" -v rb="${rate_bps:-0}" \
      -v cn="${ceil[$workers]}" -v ch="${ceil[$hosts]}" -v hosts="$hosts" \
      -v ar="$(field "$line" allreduce_s)" -v arn="$(field "$line" allreduce_runs)" \
      -v lay="$layout" -v rows="$kvrows" 'BEGIN {
    cn_bps = M * 8 / cn; ch_bps = M * 8 / ch
    ar_share = 2 * (n - 1) / n; kv_share = 2 * n * (n - 1) / (n * n + k * n - 2 * k)
    R = k > 0 ? k : n - 1
    ar_m = rb > 0 ? sprintf("%.3f", ar_share * M * 8 / rb) : "-"
    printf "%-10s %-24s %9.3f %8s %11s %10s %13s %13.3f %5d\n", lay, "allreduce", ar, "1.00x", \
      "1.00x", "1.00x", ar_m, ar_share * M * 8 / cn_bps, arn
    nr = split(rows, rr, " ")
    for (i = 1; i <= nr; i++) {
      split(rr[i], f, ":")
      u = (f[1] > 0 && f[1] < P) ? f[1] : P
      ends = ar_share * M / (kv_share * M + R * u)
      kv_m = rb > 0 ? sprintf("%.3f", (kv_share * M + R * u) * 8 / rb) : "-"
      kv_c = (kv_share * M + R * u) * 8 / ch_bps
      printf "%-10s %-24s %9.3f %7.2fx %10.2fx %9.2fx %13s %13.3f %5d\n", lay, \
        sprintf("push_pull chunk=%s", f[1] > 0 ? f[1] : "0"), f[2], ar / f[2], \
        ar_share / kv_share, ends, kv_m, kv_c, f[3]
      printf "%-10s %-24s %9.3f %7.2fx %10.2fx %9.2fx %13s %13.3f %5d\n", lay, \
        sprintf("ipushpull/part chunk=%s", f[1] > 0 ? f[1] : "0"), f[4], ar / f[4], \
        ar_share / kv_share, ends, kv_m, kv_c, f[5]
    }
    printf "# %s ceiling: %.3f s to stream %d B each way on all %d hosts at once = %.3f Gbit/s per" \
      " link, %.2f Gbit/s in all (nominal %s per link)\n", lay, ch, M, hosts, ch_bps / 1e9, \
      ch_bps * hosts / 1e9, (rb > 0 ? sprintf("%.3f Gbit/s", rb / 1e9) : "unshaped")
  }'
done
[ "$failed" -eq 0 ] || { echo "# $failed layout(s) failed" >&2; exit 1; }
