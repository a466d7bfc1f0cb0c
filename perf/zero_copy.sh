#!/usr/bin/env bash
# Before/after of the copy-saving paths in one run, beside the machine's ceilings measured in
# the same run: shm 2 ranks allreduce (the ring, GW_SHM_CMA_MIN=0, against single-copy reads from
# 1M, the default, and from 64K, which takes the collectives' 128 KiB chunks) and tcp over
# loopback, 2 ranks (GW_SOCKET_ZEROCOPY off, on, auto, uring), at 64 MiB (busbw) and 4 KiB
# (time), and the CPU time (getrusage of both ranks, user + system) per allreduce call: the
# difference between runs of 12 and 2 timed iterations (2002 and 2 at 4 KiB), steadier than time
# on a loaded host, divided by the calls (gradwire-perf makes two per iteration, out of place and
# in place; Open MPI's driver one).
# Repetitions interleaved; medians. docs/perf.md, "Copies on one host".
#
# usage: perf/zero_copy.sh [-B BUILD_DIR] [-r REPS] [-s "BYTES..."] [-v "VARIANTS..."] [-o OP]
#   -B  build directory with perf/gradwire-perf and perf/micro/gradwire-micro (default build/release)
#   -o  the collective: allreduce (default), allgather, reduce_scatter or broadcast (from rank 0;
#       sizes are the whole buffer, as gradwire-perf's -b); shm:direct and shm:shared are then
#       that collective's direct path (allgather and broadcast take it only with shm:shared's
#       buffers), shm:ring and shm:cma turn it off
#   -r  repetitions (default 5)
#   -s  large sizes in bytes (default 67108864); the 4096-byte latency row always runs
#   -v  variants (default all: shm:ring shm:cma shm:cma-all tcp:copy tcp:zc-on tcp:zc-auto
#       tcp:uring); also tcp:uring-all (SEND_ZC for every message, GW_SOCKET_ZEROCOPY_MIN=0),
#       shm:direct (the direct allreduce, GW_SHM_DIRECT_MIN=1M; the shm:ring/cma variants turn it
#       off), shm:shared (the same with the buffers from gw_mem_alloc, which the ranks map into
#       each other: no kernel copy), mpi:vader (Open MPI over shared memory,
#       perf/peers/mpi_allreduce.c, via mpicc) and mpi:vader-rb (the same with its allreduce
#       forced to reduce + broadcast, which an EPYC guest ran 10x faster than Open MPI's choice)
# Exit status: 0 every run gave a figure; 1 some failed (shown as "fail"); 2 bad arguments.
set -uo pipefail

build=build/release
reps=5
sizes=67108864
variants="shm:ring shm:cma shm:cma-all tcp:copy tcp:zc-on tcp:zc-auto tcp:uring"
op=allreduce
for a in "$@"; do [ "$a" = --help ] && set -- -h; done  # --help means -h
while getopts "B:r:s:v:o:h" opt; do
  case $opt in
    B) build=$OPTARG ;;
    r) reps=$OPTARG ;;
    s) sizes=$OPTARG ;;
    v) variants=$OPTARG ;;
    o) op=$OPTARG ;;
    h) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;  # the whole header
    *) awk '/^# usage:/ { p = 1 } /^# Exit status/ { exit } p' "$0" >&2; exit 2 ;;
  esac
done
case "$op" in
  allreduce|allgather|reduce_scatter|broadcast) ;;
  *) echo "zero_copy.sh: -o $op: not allreduce, allgather, reduce_scatter or broadcast" >&2; exit 2 ;;
esac
perf="$build/perf/gradwire-perf"
micro="$build/perf/micro/gradwire-micro"
[ -x "$perf" ] || { echo "zero_copy.sh: no $perf (build gradwire-perf)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The ceilings: memcpy of 64 MiB and of 256 MiB (one core; 256 MiB leaves the last-level cache:
# the memory-bound figure), and a plain loopback TCP stream.
source "$(dirname "${BASH_SOURCE[0]}")/peers_common.sh"  # ceiling(): median of 3, GB/s

env_of() {
  case "$1" in
    shm:ring) echo "GW_SHM_CMA_MIN=0 GW_SHM_DIRECT_MIN=0" ;;
    shm:cma) echo "GW_SHM_CMA_MIN=1M GW_SHM_DIRECT_MIN=0" ;;  # 128 KiB chunks stay on the ring
    shm:cma-all) echo "GW_SHM_CMA_MIN=64K GW_SHM_DIRECT_MIN=0" ;;  # every chunk read single-copy
    shm:direct) echo "GW_SHM_DIRECT_MIN=1M" ;;  # the default: peers' buffers read into the sum
    shm:shared) echo "GW_SHM_DIRECT_MIN=1M" ;;  # ... and gw_mem_alloc buffers (args_of): mapped
    mpi:vader) echo "OMPI_MCA_btl=vader,self" ;;  # Open MPI's shared memory, perf/peers/mpi_allreduce
    # ... with its allreduce forced to reduce + broadcast (tuned algorithm 2): on an EPYC guest
    # Open MPI's own choice (recursive doubling at 2 ranks) ran 10x slower than this.
    mpi:vader-rb) echo "OMPI_MCA_btl=vader,self OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_allreduce_algorithm=2" ;;
    tcp:copy) echo "GW_SOCKET_ZEROCOPY=off" ;;
    tcp:zc-on) echo "GW_SOCKET_ZEROCOPY=on" ;;
    tcp:zc-auto) echo "GW_SOCKET_ZEROCOPY=auto" ;;
    tcp:uring) echo "GW_SOCKET_ZEROCOPY=uring" ;;  # io_uring SEND_ZC from 256 KiB
    tcp:uring-all) echo "GW_SOCKET_ZEROCOPY=uring GW_SOCKET_ZEROCOPY_MIN=0" ;;  # every message
    *) echo "zero_copy.sh: unknown variant $1" >&2; return 1 ;;
  esac
}
args_of() { [ "$1" = shm:shared ] && echo --mem-alloc; }  # the perf tool's extra flags
for v in $variants; do env_of "$v" >/dev/null || exit 2; done
mpi_bin="$build/peers/mpi_allreduce"
if [[ " $variants " == *" mpi:"* ]]; then
  mkdir -p "$build/peers"
  mpicc -O2 -o "$mpi_bin" "$(dirname "$0")/peers/mpi_allreduce.c" 2>"$work/mpicc.log" ||
    { echo "zero_copy.sh: mpicc failed: $(head -c 200 "$work/mpicc.log")" >&2; exit 2; }
fi
tcp_gbs=$(ceiling '^ceiling/loopback_tcp_64MiB')
# memcpy swings with the neighbours' memory traffic on a shared host (an EPYC guest: 11-21 GB/s
# at 64 MiB within minutes), so it is measured before every repetition and the median printed.
memcpy_all="" mem_all=""
# Runs gradwire-perf under a parent that reports the CPU time of its children (both ranks and
# the launcher) as a "# cpu_s" line after the perf tool's output.
rusage_py='import resource, subprocess, sys
p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
sys.stdout.write(p.stdout.decode())
print("# cpu_s %.6f" % (r.ru_utime + r.ru_stime))
sys.exit(p.returncode)'
run_perf() {  # variant size iters -> the perf tool's output and its "# cpu_s" line
  local v="$1" s="$2" n="$3"
  if [ "${v%%:*}" = mpi ]; then
    # Open MPI's driver prints "time_us=T busbw_GBps=B": shaped here like the perf tool's row
    # (column 6 time, column 8 busbw). Its run is n timed calls, 2 warm-up and 1 check.
    env $(env_of "$v") /usr/bin/python3 -c "$rusage_py" timeout 600 mpirun --allow-run-as-root \
      --oversubscribe -np 2 "$mpi_bin" -o "$op" -n "$n" "$s" 2>"$work/err" |
      awk '/time_us=/ { for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
             printf "%s 0 float sum -1 %s 0 %s 0 0 0 0 0\n", f["bytes"], f["time_us"], f["busbw_GBps"]; next }
           { print }'
    return "${PIPESTATUS[0]}"
  fi
  env $(env_of "$v") GW_SOCKET_IFNAME=lo /usr/bin/python3 -c "$rusage_py" timeout 600 "$perf" \
    "$op" --np 2 --transport "${v%%:*}" -b "$s" -e "$s" -n "$n" -w 2 $(args_of "$v") \
    2>"$work/err"
}
cpu_of() { awk '/^# cpu_s/ { print $3 }' <<<"$1"; }
# One repetition of a variant at one size: the figure in column `col` of a run of `calls` + 2
# timed calls, and the CPU milliseconds per call from the difference to a 2-call run (appended
# to res and cpu).
run_one() {  # variant size col calls
  local v="$1" s="$2" col="$3" calls="$4" hi lo fig c_hi c_lo
  hi=$(run_perf "$v" "$s" $((calls + 2))) || hi=""
  lo=$(run_perf "$v" "$s" 2) || lo=""
  fig=$(awk -v c="$col" '!/^#/ && NF >= 13 { print $c; exit }' <<<"$hi")
  res["$v $s"]+="${fig:-fail} "
  c_hi=$(cpu_of "$hi")
  c_lo=$(cpu_of "$lo")
  if [ -n "$fig" ] && [ -n "$c_hi" ] && [ -n "$c_lo" ] && [ -n "$lo" ]; then
    # gradwire-perf times every iteration out of place and then in place: two calls each.
    local per=$calls
    [ "${v%%:*}" = mpi ] || per=$((2 * calls))
    cpu["$v $s"]+="$(awk -v a="$c_hi" -v b="$c_lo" -v n="$per" 'BEGIN { printf "%.6f", (a - b) / n * 1e3 }') "
  fi
}
declare -A res cpu
for ((rep = 1; rep <= reps; rep++)); do
  memcpy_all+="$(ceiling '^memcpy/16777216$') "
  mem_all+="$(ceiling '^memcpy/67108864$') "
  for v in $variants; do
    for s in $sizes; do run_one "$v" "$s" 8 10; done
    run_one "$v" 4096 6 2000
  done
  echo "# rep $rep/$reps done" >&2
done
median() {
  local vals count
  vals=$(printf '%s\n' "$@" | grep -E '^-?[0-9.]+$' | sort -g)
  [ -z "$vals" ] && { echo fail; return; }
  count=$(wc -l <<<"$vals")
  awk -v c="$count" '{ v[NR] = $1 } END { if (c % 2) printf "%.3f", v[(c + 1) / 2]; else printf "%.3f", (v[c / 2] + v[c / 2 + 1]) / 2 }' <<<"$vals"
}
memcpy_gbs=$(median $memcpy_all)
mem_gbs=$(median $mem_all)
status=0
echo "# zero_copy: $op float32$([ "$op" = allreduce ] || [ "$op" = reduce_scatter ] && echo " sum"), 2 ranks, $reps repetitions interleaved, medians"
echo "# machine ceilings, same run: memcpy 64 MiB ${memcpy_gbs} GB/s, 256 MiB ${mem_gbs} GB/s (one core each, medians of one measurement per repetition: ${memcpy_all% } / ${mem_all% }); loopback TCP stream ${tcp_gbs} GB/s"
# The memory-bound ceiling of a 2-rank allreduce: each rank moves 2.5 N bytes through memory
# (docs/perf.md, "Direct allreduce within a host"), so 0.8 x the memory-bound memcpy in busbw.
ceil=""
if [ "$op" = allreduce ] && [[ "$mem_gbs" =~ ^[0-9.]+$ ]]; then
  ceil=$(awk -v m="$mem_gbs" 'BEGIN { printf "%.2f", 0.8 * m }')
  echo "# shm ceiling: 0.8 x memcpy 256 MiB = $ceil GB/s busbw; \"of ceil\" is busbw / that"
fi
echo "# cpu ms/call: user + system time of both ranks per $op call (getrusage)"
printf '%-14s' variant
for s in $sizes; do
  printf ' %18s %16s' "busbw@${s}B GB/s" "cpu@${s}B ms"
  [ -n "$ceil" ] && printf ' %8s' "of ceil"
done
printf ' %16s %16s\n' "time@4096B us" "cpu@4096B ms"
for v in $variants; do
  printf '%-14s' "$v"
  for s in $sizes; do
    m=$(median ${res["$v $s"]}); [ "$m" = fail ] && status=1
    printf ' %18s %16s' "$m" "$(median ${cpu["$v $s"]:-})"
    if [ -n "$ceil" ]; then
      f="-"
      [ "${v%%:*}" != tcp ] && [[ "$m" =~ ^[0-9.]+$ ]] &&
        f=$(awk -v b="$m" -v c="$ceil" 'BEGIN { printf "%.0f%%", 100 * b / c }')
      printf ' %8s' "$f"
    fi
  done
  m=$(median ${res["$v 4096"]}); [ "$m" = fail ] && status=1
  printf ' %16s %16s\n' "$m" "$(median ${cpu["$v 4096"]:-})"
done
exit $status
