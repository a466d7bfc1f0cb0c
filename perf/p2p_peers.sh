#!/usr/bin/env bash
# Point-to-point latency and bandwidth of gradwire's C ABI against Open MPI and UCX, measured in
# ONE run, 2 ranks on loopback: gradwire (`gradwire-perf p2p --capi`: gw_send/gw_recv ping-pong,
# gw_isend/gw_irecv window) over tcp and shm; Open MPI (perf/peers/mpi_pingpong.c: MPI_Send/
# MPI_Recv, MPI_Isend window) over its tcp BTL and its shared-memory BTL (vader); UCX's
# ucx_perftest (tag_lat, tag_bw) over UCX_TLS=tcp and UCX_TLS=sm, when Debian's ucx-utils is
# installed. Each repetition runs every column once, interleaved (gw-tcp, gw-shm, mpi-tcp, ...),
# so a noisy neighbour hits every column alike; the table shows the medians over the
# repetitions. Latency: the half round trip's median within a run (us); bandwidth: one way, MB/s
# (10^6 bytes; ucx_perftest's MB/s are 2^20 bytes and are converted). The machine's ceilings
# (memcpy of 64 MiB on one core, a loopback TCP stream, from gradwire-micro) and its load average
# are measured in the same run. docs/perf.md, "Point to point against Open MPI and UCX".
#
# usage: perf/p2p_peers.sh [-s BW_SIZE] [-l LAT_SIZE] [-i LAT_ITERS] [-w WINDOW] [-r R] [-B BUILD_DIR]
#                          [-b BASE_BUILD_DIR]
#   -s  bandwidth message size (K/M/G suffixes), default 4M
#   -l  latency message size, default 8
#   -i  ping-pong round trips per run, default 2000
#   -w  sends in flight while streaming (gradwire and Open MPI), default 4
#   -r  repetitions, default 5
#   -B  build directory holding perf/gradwire-perf, default build/release
#   -b  a second build (another commit: "before"), run as the columns base-tcp and base-shm in the
#       same interleaved repetitions; its perf/gradwire-perf runs with its capi/ first on
#       LD_LIBRARY_PATH, so a copy of the two files (BASE/perf/, BASE/capi/) will do
# A peer that is not installed shows "missing" (and why, in a comment line); it never fails the
# script. Exit status: 0, 1 when a gradwire run failed, 2 on bad arguments.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
bw_size=4M
lat_size=8
lat_iters=2000
window=4
reps=5
build="$root/build/release"
base=""
for a in "$@"; do [ "$a" = --help ] && set -- -h; done  # --help means -h
while getopts "s:l:i:w:r:B:b:h" opt; do
  case "$opt" in
    s) bw_size="$OPTARG" ;;
    l) lat_size="$OPTARG" ;;
    i) lat_iters="$OPTARG" ;;
    w) window="$OPTARG" ;;
    r) reps="$OPTARG" ;;
    B) build="$(cd "$OPTARG" && pwd)" ;;
    b) base="$(cd "$OPTARG" && pwd)" ;;
    h) sed -n '2,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) sed -n '2,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
source "$here/sizes.sh"  # to_bytes()
bw_bytes=$(to_bytes "$bw_size")
lat_bytes=$(to_bytes "$lat_size")
for v in "$lat_iters" "$window" "$reps" "$bw_bytes" "$lat_bytes"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "p2p_peers: '$v': need a positive integer" >&2; exit 2; }
done
perf="$build/perf/gradwire-perf"
micro="$build/perf/micro/gradwire-micro"
# ceiling(), ratio(), median() (2 decimals here), mpi_driver()
source "$here/peers_common.sh"
median_decimals=2
[ -x "$perf" ] || { echo "p2p_peers: $perf not found; build gradwire-perf first" >&2; exit 2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Which peers can run here.
mpi_bin="$build/peers/mpi_pingpong"
missing_mpi=$(mpi_driver "$here/peers/mpi_pingpong.c" "$mpi_bin")
missing_ucx=""
command -v ucx_perftest >/dev/null || missing_ucx="missing: ucx_perftest (apt-get install ucx-utils)"

# The ceilings: memcpy of 64 MiB (one core) and a plain loopback TCP stream, median of 3 each.

# Reads the perftest-like output of gradwire-perf p2p --capi and mpi_pingpong: "LAT BW".
parse_pt() {
  awk -v b="$bw_bytes" -v l="$lat_bytes" '
    /^#/ { next }
    NF == 3 && $1 == b { bw = $3 }
    NF == 6 && $1 == l { lat = $4 }
    END { if (lat != "" && bw != "") print lat, bw }'
}

ucx_port=$(( 20000 + RANDOM % 20000 ))
ucx_one() {  # TLS TEST SIZE ITERS -> ucx_perftest's "Final:" line
  local tls="$1" test="$2" size="$3" iters="$4" spid out
  ucx_port=$(( ucx_port + 1 ))
  UCX_TLS="$tls" timeout 120 ucx_perftest -p "$ucx_port" >"$work/ucx_server" 2>&1 &
  spid=$!
  sleep 0.5
  out=$(UCX_TLS="$tls" timeout 120 ucx_perftest 127.0.0.1 -p "$ucx_port" -t "$test" -s "$size" \
          -n "$iters" 2>"$work/err")
  wait "$spid" 2>/dev/null
  grep '^Final:' <<<"$out"
}

run_one() {  # impl -> "LAT BW" or nothing
  local impl="$1" out lat bw iters
  case "$impl" in
    gw-tcp|gw-shm)
      timeout 300 "$perf" p2p --capi --transport "${impl#gw-}" -s "$bw_bytes" --window "$window" \
        --lat-size "$lat_bytes" --lat-iters "$lat_iters" 2>"$work/err" | parse_pt ;;
    base-tcp|base-shm)
      LD_LIBRARY_PATH="$base/capi${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 300 \
        "$base/perf/gradwire-perf" p2p --capi --transport "${impl#base-}" -s "$bw_bytes" \
        --window "$window" --lat-size "$lat_bytes" --lat-iters "$lat_iters" 2>"$work/err" |
        parse_pt ;;
    mpi-tcp)
      timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 --mca btl tcp,self \
        --mca btl_tcp_if_include lo "$mpi_bin" -s "$bw_bytes" -w "$window" -l "$lat_iters" \
        -L "$lat_bytes" 2>"$work/err" | parse_pt ;;
    mpi-shm)
      timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 --mca btl vader,self \
        "$mpi_bin" -s "$bw_bytes" -w "$window" -l "$lat_iters" -L "$lat_bytes" 2>"$work/err" |
        parse_pt ;;
    ucx-tcp|ucx-shm)
      local tls=tcp
      [ "$impl" = ucx-shm ] && tls=sm
      # Final: iterations, latency 50%ile / average / overall (us, one way), bandwidth average /
      # overall (MB/s of 2^20 bytes), message rate.
      lat=$(ucx_one "$tls" tag_lat "$lat_bytes" "$lat_iters" | awk '{ print $3 }')
      iters=$(( (2 << 30) / bw_bytes )); (( iters < 8 )) && iters=8; (( iters > 1000 )) && iters=1000
      bw=$(ucx_one "$tls" tag_bw "$bw_bytes" "$iters" | awk '{ printf "%.2f", $6 * 1.048576 }')
      [ -n "$lat" ] && [ -n "$bw" ] && echo "$lat $bw" ;;
  esac
}

impls="gw-tcp gw-shm"
if [ -n "$base" ]; then
  [ -x "$base/perf/gradwire-perf" ] || { echo "p2p_peers: $base/perf/gradwire-perf not found" >&2; exit 2; }
  impls+=" base-tcp base-shm"
fi
[ -z "$missing_mpi" ] && impls+=" mpi-tcp mpi-shm"
[ -z "$missing_ucx" ] && impls+=" ucx-tcp ucx-shm"

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
memcpy_gbs=$(ceiling '^memcpy/16777216$')
tcp_gbs=$(ceiling '^ceiling/loopback_tcp_64MiB')
echo "# p2p_peers: 2 ranks on loopback; latency: ${lat_bytes} B half round trip (us, each run's median);" \
  "bandwidth: ${bw_bytes} B messages, window $window (MB/s, 10^6 B); $reps repetitions interleaved, medians"
echo "# gradwire: $perf"
[ -n "$base" ] && echo "# base (before): $base/perf/gradwire-perf"
[ -n "$missing_mpi" ] && echo "# Open MPI: $missing_mpi"
[ -n "$missing_ucx" ] && echo "# UCX: $missing_ucx"
declare -A lats bws
failed=0
for ((rep = 1; rep <= reps; rep++)); do
  for impl in $impls; do
    v=$(run_one "$impl")
    if [ -z "$v" ]; then
      echo "# rep $rep: $impl failed: $(tail -c 300 "$work/err" 2>/dev/null | tr '\n' ' ')" >&2
      [[ "$impl" == gw-* || "$impl" == base-* ]] && failed=1
      v="fail fail"
    fi
    read -r l b <<<"$v"
    lats["$impl"]+="$l "
    bws["$impl"]+="$b "
    echo "# rep $rep/$reps: $impl lat=$l us bw=$b MB/s" >&2
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

cell() {  # lat|bw impl
  local impl="$2"
  if [[ "$impl" == mpi-* && -n "$missing_mpi" ]] || [[ "$impl" == ucx-* && -n "$missing_ucx" ]]; then
    echo "missing"
    return
  fi
  # shellcheck disable=SC2086
  if [ "$1" = lat ]; then median ${lats[$impl]:-}; else median ${bws[$impl]:-}; fi
}

echo "# machine ceilings, same run: memcpy 64 MiB ${memcpy_gbs} GB/s (one core); loopback TCP stream ${tcp_gbs} GB/s"
echo "# load average (1 5 15 min): $load_before before, $load_after after ($(nproc) cores)"
printf "%-8s %10s %12s   %-40s %s\n" "#impl" "lat_us" "bw_MBps" "lat runs" "bw runs"
for impl in gw-tcp gw-shm mpi-tcp mpi-shm ucx-tcp ucx-shm base-tcp base-shm; do
  [[ "$impl" == base-* && -z "$base" ]] && continue
  printf "%-8s %10s %12s   %-40s %s\n" "$impl" "$(cell lat "$impl")" "$(cell bw "$impl")" \
    "${lats[$impl]:-}" "${bws[$impl]:-}"
done
echo "# gradwire against each peer, > 1 means gradwire is better (latency: peer's / gradwire's; bandwidth: gradwire's / peer's)"
for t in tcp shm; do
  for peer in mpi ucx; do
    echo "# gw-$t vs $peer-$t: latency $(ratio "$(cell lat "$peer-$t")" "$(cell lat "gw-$t")")," \
      "bandwidth $(ratio "$(cell bw "gw-$t")" "$(cell bw "$peer-$t")")"
  done
  if [ -n "$base" ]; then
    echo "# gw-$t vs base-$t: latency $(ratio "$(cell lat "base-$t")" "$(cell lat "gw-$t")")," \
      "bandwidth $(ratio "$(cell bw "gw-$t")" "$(cell bw "base-$t")")"
  fi
done
exit "$failed"
