#!/usr/bin/env bash
# All-to-all with uneven splits (alltoallv) of gradwire against Open MPI's MPI_Alltoallv, measured
# in ONE run on the same sizes, N ranks on this machine (default 4): gradwire (`gradwire-perf
# alltoallv --np N -c 1`, gw_alltoallv through the C ABI) over tcp and shm; Open MPI
# (perf/peers/mpi_alltoallv.c, built here with mpicc) over its tcp BTL on lo and its
# shared-memory BTL (vader). Both use the same split rule (perf/coll_alltoallv.h: weights 1..8
# per destination from splitmix64, seed 29; the script checks that both print the same weights),
# the same size convention (SIZE = the whole send buffer of one rank), iteration rule
# (clamp(2e9 / size / ranks, 3, 50), 2 warm-ups) and busbw = algbw * (n-1)/n, and both check
# every received element. Each repetition runs every column once per size, interleaved, so a
# noisy neighbour hits every column alike; the table shows the medians of busbw (GB/s, 1e9 B/s)
# and gradwire's ratio to Open MPI on the same kind of link. The machine's ceilings (memcpy of
# 64 MiB on one core, a loopback TCP stream, from gradwire-micro when it is built) and its load
# average are measured in the same run. docs/perf.md, "All-to-all-v against Open MPI".
#
# usage: perf/alltoallv_peers.sh [-s "SIZE ..."] [-n NP] [-r R] [-B BUILD_DIR]
#   -s  sizes per rank (K/M/G suffixes), default "64K 4M 64M"
#   -n  ranks, default 4
#   -r  repetitions, default 5
#   -B  build directory holding perf/gradwire-perf, default build/release
# Open MPI not installed (or mpicc failing) shows "missing" with the reason; it never fails the
# script. Exit status: 0; 1 when a gradwire run failed or any run (either side) got a wrong
# element or the two sides' weights differ; 2 on bad arguments.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
sizes="64K 4M 64M"
np=4
reps=5
build="$root/build/release"
usage() { sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
for a in "$@"; do [ "$a" = --help ] && { usage; exit 0; }; done
while getopts "s:n:r:B:h" opt; do
  case "$opt" in
    s) sizes="$OPTARG" ;;
    n) np="$OPTARG" ;;
    r) reps="$OPTARG" ;;
    B) build="$(cd "$OPTARG" && pwd)" ;;
    h) usage; exit 0 ;;
    *) usage; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -eq 0 ] || { echo "alltoallv_peers: unexpected argument '$1' (--help)" >&2; exit 2; }
source "$here/sizes.sh"  # to_bytes()
byte_sizes=""
for s in $sizes; do byte_sizes+=" $(to_bytes "$s")" || exit 2; done
for v in "$np" "$reps" $byte_sizes; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "alltoallv_peers: '$v': need a positive integer" >&2; exit 2; }
done
(( np >= 2 )) || { echo "alltoallv_peers: -n $np: need at least 2 ranks" >&2; exit 2; }
perf="$build/perf/gradwire-perf"
micro="$build/perf/micro/gradwire-micro"
# ceiling(), ratio(), median(), mpi_driver()
source "$here/peers_common.sh"
[ -x "$perf" ] || { echo "alltoallv_peers: $perf not found; build gradwire-perf first" >&2; exit 2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

mpi_bin="$work/mpi_alltoallv"
missing_mpi=$(mpi_driver "$here/peers/mpi_alltoallv.c" "$mpi_bin")

mpirun_np() { timeout 600 mpirun --allow-run-as-root --oversubscribe -np "$np" "$@"; }

# One run -> "BUSBW WRONG" (WRONG: wrong elements of the checked calls) or nothing on failure.
# The weights lines go to $work/weights.IMPL for the comparison.
run_one() {  # impl size
  local impl="$1" s="$2" out
  case "$impl" in
    gw-tcp|gw-shm)
      out=$(timeout 600 "$perf" alltoallv --np "$np" --transport "${impl#gw-}" -b "$s" -e "$s" \
              -c 1 2>"$work/err")  # exit 1 (a wrong element) still prints the row
      grep '^# alltoallv weights' <<<"$out" | sed 's/^# alltoallv //' >"$work/weights.gw"
      # nccl-tests' columns: size count type redop root time algbw busbw #wrong (out of place),
      # then time algbw busbw #wrong in place.
      awk -v s="$s" '!/^#/ && $1 == s { print $8, $9 + $13 }' <<<"$out" ;;
    mpi-tcp|mpi-shm)
      local btl="tcp,self" extra=(--mca btl_tcp_if_include lo)
      [ "$impl" = mpi-shm ] && { btl="vader,self"; extra=(); }
      out=$(mpirun_np --mca btl "$btl" "${extra[@]}" "$mpi_bin" "$s" 2>"$work/err")
      grep '^mpi-alltoallv weights' <<<"$out" | sed 's/^mpi-alltoallv //' >"$work/weights.mpi"
      sed -n 's/^mpi-alltoallv .*busbw_GBps=\([0-9.]*\) wrong=\([0-9]*\).*/\1 \2/p' <<<"$out" ;;
  esac
}

impls="gw-tcp gw-shm"
[ -z "$missing_mpi" ] && impls+=" mpi-tcp mpi-shm"

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
memcpy_gbs=$(ceiling '^memcpy/16777216$')
tcp_gbs=$(ceiling '^ceiling/loopback_tcp_64MiB')
echo "# alltoallv_peers: $np ranks on this machine, float32, sizes per rank:$byte_sizes B;" \
  "busbw = size/time * (n-1)/n (GB/s, 1e9 B/s), slowest rank; $reps repetitions interleaved, medians"
echo "# gradwire: $perf alltoallv --np $np --transport tcp|shm -b S -e S -c 1 (out-of-place column)"
if [ -n "$missing_mpi" ]; then
  echo "# Open MPI: $missing_mpi"
else
  echo "# Open MPI: $(mpirun --version 2>/dev/null | head -1); perf/peers/mpi_alltoallv.c, btl tcp,self on lo / vader,self"
fi
declare -A runs wrongs
failed=0
for ((rep = 1; rep <= reps; rep++)); do
  for s in $byte_sizes; do
    for impl in $impls; do
      v=$(run_one "$impl" "$s")
      if [ -z "$v" ]; then
        echo "# rep $rep: $impl $s B failed: $(tail -c 300 "$work/err" 2>/dev/null | tr '\n' ' ')" >&2
        [[ "$impl" == gw-* ]] && failed=1
        v="fail 0"
      fi
      read -r b w <<<"$v"
      runs["$impl $s"]+="$b "
      wrongs["$impl"]=$(( ${wrongs[$impl]:-0} + w ))
      echo "# rep $rep/$reps: $impl $s B busbw=$b GB/s wrong=$w" >&2
    done
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

cell() {  # impl size
  if [[ "$1" == mpi-* && -n "$missing_mpi" ]]; then echo "missing"; return; fi
  # shellcheck disable=SC2086
  median ${runs[$1 $2]:-}
}

echo "# machine ceilings, same run: memcpy 64 MiB ${memcpy_gbs} GB/s (one core); loopback TCP stream ${tcp_gbs} GB/s"
echo "# load average (1 5 15 min): $load_before before, $load_after after ($(nproc) cores)"
printf "%-8s %10s %10s   %s\n" "#impl" "size_B" "busbw" "runs"
for s in $byte_sizes; do
  for impl in gw-tcp gw-shm mpi-tcp mpi-shm; do
    printf "%-8s %10s %10s   %s\n" "$impl" "$s" "$(cell "$impl" "$s")" "${runs[$impl $s]:-}"
  done
done
echo "# gradwire against Open MPI, busbw gradwire / Open MPI (> 1: gradwire is faster)"
for s in $byte_sizes; do
  echo "# $s B: tcp $(ratio "$(cell gw-tcp "$s")" "$(cell mpi-tcp "$s")")," \
    "shm $(ratio "$(cell gw-shm "$s")" "$(cell mpi-shm "$s")")"
done
bad=""
for impl in $impls; do
  [ "${wrongs[$impl]:-0}" = 0 ] || bad+=" $impl: ${wrongs[$impl]} wrong elements;"
done
if [ -n "$bad" ]; then
  echo "# checks: FAILED:$bad"
  failed=1
else
  echo "# checks: every element of every checked call right ($impls)"
fi
if [ -z "$missing_mpi" ] && [ -s "$work/weights.gw" ]; then
  if diff -q "$work/weights.gw" "$work/weights.mpi" >/dev/null; then
    echo "# splits: gradwire and Open MPI use the same weights ($(tr '\n' ';' <"$work/weights.gw" | sed 's/weights (seed 29) //g'))"
  else
    echo "# splits: FAILED: the weights differ"
    paste "$work/weights.gw" "$work/weights.mpi" | sed 's/^/#   /'
    failed=1
  fi
fi
exit "$failed"
