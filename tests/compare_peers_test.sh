#!/usr/bin/env bash
# perf/compare_peers.sh as on a fresh clone: every peer program it runs is the project's own and
# tracked in git (perf/peers/), it builds the Open MPI driver into the build directory, and one
# small run fills the table: numbers for gradwire over tcp and shm, and for each peer a number or
# "missing" (not installed), never "fail".
# usage: compare_peers_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src="$1"; build="$2"
fail() { echo "compare_peers_test: FAIL: $*" >&2; exit 1; }

# The peers the script names are tracked files under perf/peers/.
for f in $(grep -o '\$here/peers/[A-Za-z0-9_.]*' "$src/perf/compare_peers.sh" | sort -u); do
  rel="perf/peers/${f#\$here/peers/}"
  git -C "$src" ls-files --error-unmatch "$rel" >/dev/null 2>&1 || fail "$rel is not tracked"
done
grep -q '\$here/peers/gloo_allreduce.py' "$src/perf/compare_peers.sh" || fail "no Gloo driver"
grep -q '\$here/peers/mpi_allreduce.c' "$src/perf/compare_peers.sh" || fail "no Open MPI driver"
# Nothing outside the repository: no shared/ or home-directory peers.
if grep -nE '(\.\./shared|/work/|\$HOME|~/)' "$src/perf/compare_peers.sh"; then
  fail "compare_peers.sh uses files outside the repository"
fi

out=$(timeout 600 bash "$src/perf/compare_peers.sh" -s 64K -n 2 -r 1 -L 0 -B "$build" 2>&1)
rc=$?
[ $rc -eq 0 ] || { echo "$out" >&2; fail "compare_peers.sh exited $rc"; }
row=$(grep -E '^2 +65536 ' <<<"$out") || { echo "$out" >&2; fail "no table row for np 2, 64 KiB"; }
read -r _ _ gt gl _ gs ms _ mt sc sp tc tp <<<"$row"
num='^[0-9]+(\.[0-9]+)?$'
[[ "$gt" =~ $num ]] || { echo "$out" >&2; fail "gw-tcp: $gt"; }
[[ "$gs" =~ $num ]] || { echo "$out" >&2; fail "gw-shm: $gs"; }
for v in "$gl" "$ms" "$mt"; do
  [[ "$v" =~ $num || "$v" == missing ]] || { echo "$out" >&2; fail "a peer column reads '$v'"; }
done
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
  [[ "$ms" =~ $num && "$mt" =~ $num ]] || { echo "$out" >&2; fail "Open MPI installed but not run"; }
  [ -x "$build/peers/mpi_allreduce" ] || fail "the Open MPI driver was not built into $build/peers"
fi
# The machine's ceilings, measured in the same run (before and after), and gradwire's share.
[ "$(grep -cE '^# machine ceilings, same run \((before|after)\): memcpy 64 MiB ' <<<"$out")" -eq 2 ] ||
  { echo "$out" >&2; fail "no '# machine ceilings' lines before and after"; }
if [ -x "$build/perf/micro/gradwire-micro" ]; then
  grep -qE '^# machine ceilings, same run \(before\): memcpy 64 MiB [0-9.]+ GB/s, 256 MiB [0-9.]+ GB/s, float32 sum-into 64 MiB [0-9.]+ GB/s .*loopback TCP stream [0-9.]+ GB/s$' <<<"$out" ||
    { echo "$out" >&2; fail "a ceiling is not a number"; }
  [[ "$sc" =~ $num && "$tc" =~ $num && "$sp" =~ ^[0-9]+%$ && "$tp" =~ ^[0-9]+%$ ]] ||
    { echo "$out" >&2; fail "ceiling columns read '$sc $sp $tc $tp'"; }
  awk -v c="$sc" -v g="$gs" -v p="${sp%\%}" 'BEGIN { d = 100 * g / c - p; exit !(d < 1 && d > -1) }' ||
    fail "%ceil $sp is not gw-shm $gs over shm_ceil $sc"
  # shm_ceil is 0.8 x the higher of the two memory-bound (256 MiB) memcpy figures.
  mem=$(grep -E '^# machine ceilings, same run' <<<"$out" |
    sed -E 's/.*, 256 MiB ([0-9.]+) GB\/s.*/\1/' | sort -g | tail -1)
  awk -v c="$sc" -v m="$mem" 'BEGIN { d = c - 0.8 * m; exit !(d < 0.01 && d > -0.01) }' ||
    fail "shm_ceil $sc is not 0.8 x the 256 MiB memcpy $mem"
fi
echo "compare_peers_test: ok ($row)"
