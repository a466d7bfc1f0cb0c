#!/usr/bin/env bash
# Side-by-side allreduce bus bandwidth of gradwire and its peers, measured in ONE run on the same
# sizes and rank counts: gradwire over tcp and shm, PyTorch Gloo (tcp), Open MPI over tcp and over
# shared memory (vader). Each measurement is repeated R times, interleaved (gradwire, gloo, mpi,
# gradwire, ...), so a noisy neighbour hits every column alike; the table shows the medians.
#
# usage: perf/compare_peers.sh [-s "SIZE ..."] [-n "NP ..."] [-r R] [-L RUNS] [-B BUILD_DIR]
#   -s  sizes in bytes (K/M/G suffixes allowed), default 64M
#   -n  rank counts, default "2 4"
#   -r  repetitions, default 3
#   -L  small-message table: RUNS separate runs of a 4 KiB allreduce at 2 ranks, gradwire (shm,
#       tcp) alternated with Open MPI (vader, tcp); default 10, 0 skips it
#   -B  build directory holding perf/gradwire-perf, default build/release
# The peers are the project's own drivers in perf/peers/ (Gloo through Debian's python3-torch,
# Open MPI through mpicc). A peer that is not installed is reported as such in the table; it
# never fails the script.
# The machine's own ceilings, measured in the same run before and after the repetitions
# (gradwire-micro, median of 3 each; both "# machine ceilings" lines are printed and the table
# takes the higher: noise only lowers a ceiling): memcpy of 64 MiB and of 256 MiB (beyond the
# last-level cache: the memory-bound figure) and a float32 sum into a 64 MiB buffer, on one core
# each, and one loopback TCP stream of 64 MiB. "shm_ceil" is the memory-bound busbw of a 2-rank
# allreduce, 0.8 x the 256 MiB memcpy (each rank moves 2.5 N bytes through memory:
# docs/perf.md, "Direct allreduce within a host"), at 2 ranks only; "tcp_ceil" is the
# stream's rate (a 2-rank allreduce puts busbw x time bytes on each rank's connection; messages
# that fit in the socket buffers can pass it). "%ceil" is gradwire's share of the one before.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
sizes="64M"
nps="2 4"
reps=3
lat_runs=10
build="$root/build/release"
for a in "$@"; do [ "$a" = --help ] && set -- -h; done  # --help means -h
while getopts "s:n:r:L:B:h" opt; do
  case "$opt" in
    s) sizes="$OPTARG" ;;
    n) nps="$OPTARG" ;;
    r) reps="$OPTARG" ;;
    L) lat_runs="$OPTARG" ;;
    B) build="$(cd "$OPTARG" && pwd)" ;;
    h) sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || { echo "compare_peers: -r $reps: need a positive integer" >&2; exit 2; }
[[ "$lat_runs" =~ ^[0-9]+$ ]] || { echo "compare_peers: -L $lat_runs: need a number" >&2; exit 2; }
perf="$build/perf/gradwire-perf"
[ -x "$perf" ] || { echo "compare_peers: $perf not found; build first (scripts/build.sh release)" >&2; exit 2; }

source "$here/sizes.sh"  # to_bytes()
source "$here/peers_common.sh"  # median(), ratio(), mpi_driver(), ceiling()
micro="$build/perf/micro/gradwire-micro"
byte_sizes=""
for s in $sizes; do byte_sizes+=" $(to_bytes "$s")"; done
for n in $nps; do [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "compare_peers: bad rank count '$n'" >&2; exit 2; }; done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Which peers can run here.
missing_gloo=""
if ! /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null; then
  missing_gloo="missing: /usr/bin/python3 with torch (apt-get install python3-torch)"
fi
mpi_bin="$build/peers/mpi_allreduce"
missing_mpi=$(mpi_driver "$here/peers/mpi_allreduce.c" "$mpi_bin")

declare -A results  # "impl np size" -> list of busbw values
run_one() {  # impl np size [field] -> prints busbw (GB/s), or time (us) with field "time"
  local impl="$1" n="$2" s="$3" out
  # gradwire-perf's table has nccl-tests' columns: size count type redop root time algbw busbw ...
  local gwcol=8 peerkey=busbw_GBps
  [ "${4:-}" = time ] && { gwcol=6; peerkey=time_us; }
  case "$impl" in
    gw-tcp|gw-shm)
      out=$(timeout 900 "$perf" allreduce --np "$n" --transport "${impl#gw-}" -b "$s" -e "$s" 2>"$work/err") \
        && awk -v c="$gwcol" '!/^#/ && NF >= 13 { print $c; exit }' <<<"$out" ;;
    gloo)
      out=$(cd "$work" && timeout 900 /usr/bin/python3 "$here/peers/gloo_allreduce.py" --np "$n" "$s" 2>"$work/err") \
        && sed -n "s/.*$peerkey=\([0-9.]*\).*/\1/p" <<<"$out" | head -1 ;;
    mpi-tcp)
      out=$(timeout 900 mpirun --allow-run-as-root --oversubscribe -np "$n" --mca btl tcp,self \
              --mca btl_tcp_if_include lo "$mpi_bin" "$s" 2>"$work/err") \
        && sed -n "s/.*$peerkey=\([0-9.]*\).*/\1/p" <<<"$out" | head -1 ;;
    mpi-shm)
      out=$(timeout 900 mpirun --allow-run-as-root --oversubscribe -np "$n" --mca btl vader,self \
              "$mpi_bin" "$s" 2>"$work/err") \
        && sed -n "s/.*$peerkey=\([0-9.]*\).*/\1/p" <<<"$out" | head -1 ;;
  esac
}

impls="gw-tcp gw-shm"
[ -z "$missing_gloo" ] && impls+=" gloo"
[ -z "$missing_mpi" ] && impls+=" mpi-tcp mpi-shm"

echo "# compare_peers: allreduce float32 sum, sizes:$byte_sizes B, ranks: $nps, $reps repetitions (interleaved), medians"
echo "# gradwire: $perf ($("$perf" --dump-config >/dev/null 2>&1 && echo ok))"
[ -n "$missing_gloo" ] && echo "# gloo: $missing_gloo"
[ -n "$missing_mpi" ] && echo "# Open MPI: $missing_mpi"
ceilings() {  # -> "memcpy mem sum tcp" GB/s (n/a where gradwire-micro is missing)
  echo "$(ceiling '^memcpy/16777216$') $(ceiling '^memcpy/67108864$') $(ceiling '^reduce_sum_into/float32/16777216$') $(ceiling '^ceiling/loopback_tcp_64MiB')"
}
say_ceilings() {  # when memcpy mem sum tcp
  echo "# machine ceilings, same run ($1): memcpy 64 MiB $2 GB/s, 256 MiB $3 GB/s, float32 sum-into 64 MiB $4 GB/s (one core each); loopback TCP stream $5 GB/s"
}
higher() { awk -v a="$1" -v b="$2" 'BEGIN { if (a !~ /^[0-9.]+$/) print b; else if (b !~ /^[0-9.]+$/ || a + 0 >= b + 0) print a; else print b }'; }
read -r memcpy0 mem0 sum0 tcp0 <<<"$(ceilings)"
say_ceilings before "$memcpy0" "$mem0" "$sum0" "$tcp0"
for ((rep = 1; rep <= reps; rep++)); do
  for n in $nps; do
    for s in $byte_sizes; do
      for impl in $impls; do
        v=$(run_one "$impl" "$n" "$s")
        if [ -z "$v" ]; then
          echo "# rep $rep: $impl np=$n size=$s failed: $(tail -c 300 "$work/err" 2>/dev/null | tr '\n' ' ')" >&2
          v="fail"
        fi
        results["$impl $n $s"]+="$v "
        echo "# rep $rep/$reps: $impl np=$n size=$s busbw=$v GB/s" >&2
      done
    done
  done
done

cell() {  # impl n s
  local impl="$1"
  if [[ "$impl" == gloo && -n "$missing_gloo" ]] || [[ "$impl" == mpi-* && -n "$missing_mpi" ]]; then
    echo "missing"
    return
  fi
  # shellcheck disable=SC2086
  median ${results["$impl $2 $3"]}
}

read -r memcpy1 mem1 sum1 tcp1 <<<"$(ceilings)"
say_ceilings after "$memcpy1" "$mem1" "$sum1" "$tcp1"
mem_gbs=$(higher "$mem0" "$mem1"); tcp_gbs=$(higher "$tcp0" "$tcp1")
pct() {  # a b -> a/b in percent ("-" where either is not a number)
  if [[ "$1" =~ ^[0-9.]+$ && "$2" =~ ^[0-9.]+$ ]] && awk -v b="$2" 'BEGIN { exit !(b > 0) }'; then
    awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f%%", 100 * a / b }'
  else
    echo "-"
  fi
}
echo "#"
echo "# busbw in GB/s (nccl-tests definition: bytes * 2(n-1)/n / time); ratios > 1 mean gradwire is faster"
echo "# ceilings (the higher of the two measurements): shm ceil = 0.8 x memcpy 256 MiB ($mem_gbs GB/s), 2 ranks only; tcp ceil = the 64 MiB loopback stream (smaller messages can pass it: they fit in the socket buffers)"
printf "%-4s %-12s %10s %10s %12s %10s %10s %12s %10s %10s %8s %10s %8s\n" "#np" "size(B)" "gw-tcp" "gloo" \
  "gw/gloo" "gw-shm" "mpi-shm" "gw/mpi-shm" "mpi-tcp" "shm_ceil" "%ceil" "tcp_ceil" "%ceil"
for n in $nps; do
  for s in $byte_sizes; do
    gt=$(cell gw-tcp "$n" "$s"); gs=$(cell gw-shm "$n" "$s"); gl=$(cell gloo "$n" "$s")
    ms=$(cell mpi-shm "$n" "$s"); mt=$(cell mpi-tcp "$n" "$s")
    sc="-"
    [[ "$n" = 2 && "$mem_gbs" =~ ^[0-9.]+$ ]] && sc=$(awk -v m="$mem_gbs" 'BEGIN { printf "%.2f", 0.8 * m }')
    tc="-"; [[ "$n" = 2 && "$tcp_gbs" =~ ^[0-9.]+$ ]] && tc=$tcp_gbs
    printf "%-4s %-12s %10s %10s %12s %10s %10s %12s %10s %10s %8s %10s %8s\n" "$n" "$s" "$gt" "$gl" \
      "$(ratio "$gt" "$gl")" "$gs" "$ms" "$(ratio "$gs" "$ms")" "$mt" "$sc" "$(pct "$gs" "$sc")" "$tc" \
      "$(pct "$gt" "$tc")"
  done
done

# Small messages: separate runs (each a new set of processes, so each gets its own placement on
# the cores) of a 4 KiB float32 allreduce at 2 ranks, gradwire alternated with Open MPI. A
# steady median is not enough: the slowest run shows the bimodal cases a median hides.
if [ "$lat_runs" -gt 0 ]; then
  lat_impls="gw-shm gw-tcp"
  [ -z "$missing_mpi" ] && lat_impls="gw-shm mpi-shm gw-tcp mpi-tcp"
  declare -A lat
  for ((run = 1; run <= lat_runs; run++)); do
    for impl in $lat_impls; do
      v=$(run_one "$impl" 2 4096 time)
      [ -z "$v" ] && { echo "# latency run $run: $impl failed: $(tail -c 300 "$work/err" | tr '\n' ' ')" >&2; v=fail; }
      lat["$impl"]+="$v "
    done
  done
  slowest() { printf '%s\n' "$@" | grep -E '^[0-9.]+$' | sort -g | tail -1; }
  echo "#"
  echo "# 4 KiB float32 sum allreduce, 2 ranks, $lat_runs separate runs alternated; time in us (each run: median over its iterations)"
  printf "%-10s %10s %10s %14s   %s\n" "#impl" "median" "slowest" "slowest/med" "runs"
  for impl in $lat_impls; do
    # shellcheck disable=SC2086
    m=$(median ${lat[$impl]}); w=$(slowest ${lat[$impl]}); w=${w:-fail}
    printf "%-10s %10s %10s %14s   %s\n" "$impl" "$m" "$w" "$(ratio "$w" "$m")" "${lat[$impl]}"
  done
  if [ -z "$missing_mpi" ]; then
    # The same way as the busbw table's ratios: > 1 means gradwire is faster (peer's time / ours).
    echo "# gradwire's speed-up (Open MPI's median time / gradwire's; > 1 means gradwire is faster): gw-shm vs mpi-shm (vader): $(ratio "$(median ${lat[mpi-shm]})" "$(median ${lat[gw-shm]})")   gw-tcp vs mpi-tcp: $(ratio "$(median ${lat[mpi-tcp]})" "$(median ${lat[gw-tcp]})")"
  fi
fi
