#!/usr/bin/env bash
# perf/zero_copy.sh as on a fresh clone, small: one repetition at 1 MiB of the shm ring, the
# shared-buffer path and Open MPI's vader (its driver built from perf/peers/mpi_allreduce.c into
# the build directory); every row a number, never "fail"; the ceilings' line names the 64 and
# 256 MiB memcpy figures, the shm ceiling line is 0.8 x the 256 MiB one and each shm and mpi row
# has its busbw as a share of it; a variant the script does not know is refused (exit 2).
# Skipped (77) without mpicc/mpirun or gradwire-micro.
# usage: zero_copy_script_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src="$1"; build="$2"
fail() { echo "zero_copy_script_test: FAIL: $*" >&2; exit 1; }

if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
  echo "zero_copy_script_test: skipped: mpicc/mpirun not installed (apt-get install openmpi-bin libopenmpi-dev)"
  exit 77
fi
[ -x "$build/perf/micro/gradwire-micro" ] ||
  { echo "zero_copy_script_test: skipped: no gradwire-micro (libbenchmark-dev)"; exit 77; }

bash "$src/perf/zero_copy.sh" -B "$build" -v "shm:nope" >/dev/null 2>&1
[ $? -eq 2 ] || fail "an unknown variant was not refused with exit status 2"

out=$(timeout 500 bash "$src/perf/zero_copy.sh" -B "$build" -r 1 -s 1048576 \
  -v "shm:ring shm:shared mpi:vader" 2>&1)
rc=$?
[ $rc -eq 0 ] || { echo "$out" >&2; fail "zero_copy.sh exited $rc"; }
num='[0-9]+(\.[0-9]+)?'
line=$(grep -E "^# machine ceilings, same run: memcpy 64 MiB $num GB/s, 256 MiB $num GB/s" <<<"$out") ||
  { echo "$out" >&2; fail "no memcpy ceilings line"; }
mem=$(sed -E 's/.*256 MiB ([0-9.]+) GB\/s.*/\1/' <<<"$line")
ceil=$(grep -oE "^# shm ceiling: 0\.8 x memcpy 256 MiB = $num GB/s" <<<"$out" | grep -oE "$num GB/s" | cut -d' ' -f1) ||
  { echo "$out" >&2; fail "no shm ceiling line"; }
awk -v m="$mem" -v c="$ceil" 'BEGIN { exit !(c > 0.79 * m && c < 0.81 * m) }' ||
  fail "the shm ceiling $ceil is not 0.8 x the memcpy $mem"
for v in shm:ring shm:shared mpi:vader; do
  row=$(grep -E "^$v " <<<"$out") || { echo "$out" >&2; fail "no row for $v"; }
  read -r _ bw cpu share lat _ <<<"$row"
  [[ "$bw" =~ ^$num$ && "$lat" =~ ^$num$ ]] || { echo "$out" >&2; fail "$v: '$bw' '$lat'"; }
  want=$(awk -v b="$bw" -v c="$ceil" 'BEGIN { printf "%.0f%%", 100 * b / c }')
  [ "$share" = "$want" ] || { echo "$out" >&2; fail "$v: share '$share', $bw of $ceil is $want"; }
done
[ -x "$build/peers/mpi_allreduce" ] || fail "the Open MPI driver was not built into $build/peers"
echo "zero_copy_script_test: ok"
