#!/usr/bin/env bash
# perf/p2p_peers.sh as on a fresh clone, at a tiny size: the Open MPI driver is the project's own
# (perf/peers/mpi_pingpong.c, tracked) and is built into the build directory; one repetition
# fills the table: a latency and a bandwidth number for gradwire over tcp and shm and for Open MPI
# over tcp and vader, UCX's two rows numbers or "missing" (ucx-utils not installed), never
# "fail"; the ceilings' and the ratios' lines are there. Skipped (77) without mpicc/mpirun.
# usage: p2p_peers_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src="$1"; build="$2"
fail() { echo "p2p_peers_test: FAIL: $*" >&2; exit 1; }

if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
  echo "p2p_peers_test: skipped: mpicc/mpirun not installed (apt-get install openmpi-bin libopenmpi-dev)"
  exit 77
fi
git -C "$src" ls-files --error-unmatch perf/peers/mpi_pingpong.c >/dev/null 2>&1 ||
  fail "perf/peers/mpi_pingpong.c is not tracked"
if grep -nE '(\.\./shared|/work/|\$HOME|~/)' "$src/perf/p2p_peers.sh"; then
  fail "p2p_peers.sh uses files outside the repository"
fi

out=$(timeout 500 bash "$src/perf/p2p_peers.sh" -s 64K -l 8 -i 200 -r 1 -B "$build" 2>&1)
rc=$?
[ $rc -eq 0 ] || { echo "$out" >&2; fail "p2p_peers.sh exited $rc"; }
num='^[0-9]+(\.[0-9]+)?$'
for impl in gw-tcp gw-shm mpi-tcp mpi-shm ucx-tcp ucx-shm; do
  row=$(grep -E "^$impl " <<<"$out") || { echo "$out" >&2; fail "no row for $impl"; }
  read -r _ lat bw _ <<<"$row"
  case "$impl" in
    ucx-*)
      if command -v ucx_perftest >/dev/null; then
        [[ "$lat" =~ $num && "$bw" =~ $num ]] || { echo "$out" >&2; fail "$impl: '$lat' '$bw' (ucx_perftest installed)"; }
      else
        [[ "$lat" == missing && "$bw" == missing ]] || { echo "$out" >&2; fail "$impl: '$lat' '$bw'"; }
      fi ;;
    *) [[ "$lat" =~ $num && "$bw" =~ $num ]] || { echo "$out" >&2; fail "$impl: '$lat' '$bw'"; } ;;
  esac
done
[ -x "$build/peers/mpi_pingpong" ] || fail "the Open MPI driver was not built into $build/peers"
grep -qE '^# machine ceilings, same run: memcpy 64 MiB [0-9.]+ GB/s' <<<"$out" ||
  { echo "$out" >&2; fail "no memcpy ceiling"; }
grep -qE '^# load average' <<<"$out" || { echo "$out" >&2; fail "no load average line"; }
grep -qE '^# gw-shm vs mpi-shm: latency [0-9.]+x, bandwidth [0-9.]+x' <<<"$out" ||
  { echo "$out" >&2; fail "no gradwire/Open MPI ratio line"; }
echo "p2p_peers_test: ok"
