#!/usr/bin/env bash
# perf/alltoallv_peers.sh at tiny sizes, one repetition: gradwire's alltoallv (tcp, shm) and Open
# MPI's MPI_Alltoallv (tcp, vader, built from the tracked perf/peers/mpi_alltoallv.c) each give a
# number per size, never "fail"; every checked element was right on both sides; both sides split
# with the same weights; the ceilings', load and ratio lines are there. 77 = skipped without
# mpicc/mpirun.
# usage: alltoallv_peers_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src="$1"; build="$2"
fail() { echo "alltoallv_peers_test: FAIL: $*" >&2; exit 1; }

if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
  echo "alltoallv_peers_test: skipped: mpicc/mpirun not installed (apt-get install openmpi-bin libopenmpi-dev)"
  exit 77
fi
git -C "$src" ls-files --error-unmatch perf/peers/mpi_alltoallv.c >/dev/null 2>&1 ||
  fail "perf/peers/mpi_alltoallv.c is not tracked"

out=$(timeout 500 bash "$src/perf/alltoallv_peers.sh" -s "4K 100K" -r 1 -B "$build" 2>&1)
rc=$?
[ $rc -eq 0 ] || { echo "$out" >&2; fail "alltoallv_peers.sh exited $rc"; }
num='^[0-9]+(\.[0-9]+)?$'
for s in 4096 102400; do
  for impl in gw-tcp gw-shm mpi-tcp mpi-shm; do
    row=$(grep -E "^$impl +$s " <<<"$out") || { echo "$out" >&2; fail "no row for $impl $s"; }
    read -r _ _ bw _ <<<"$row"
    [[ "$bw" =~ $num ]] || { echo "$out" >&2; fail "$impl $s: busbw '$bw'"; }
  done
done
grep -qE '^# checks: every element of every checked call right \(gw-tcp gw-shm mpi-tcp mpi-shm\)' \
  <<<"$out" || { echo "$out" >&2; fail "the checks did not all pass"; }
grep -qE '^# splits: gradwire and Open MPI use the same weights \(rank 0: [1-8]' <<<"$out" ||
  { echo "$out" >&2; fail "no matching weights line"; }
grep -qE '^# machine ceilings, same run: memcpy 64 MiB' <<<"$out" || { echo "$out" >&2; fail "no ceilings line"; }
grep -qE '^# load average' <<<"$out" || { echo "$out" >&2; fail "no load average line"; }
grep -qE '^# 102400 B: tcp [0-9.]+x, shm [0-9.]+x' <<<"$out" || { echo "$out" >&2; fail "no ratio line"; }
echo "alltoallv_peers_test: ok"
