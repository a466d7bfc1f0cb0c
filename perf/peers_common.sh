# Shared by the peer-comparison scripts (perf/compare_peers.sh, p2p_peers.sh, alltoallv_peers.sh)
# and perf/zero_copy.sh; ceiling() reads $micro (the gradwire-micro binary), mpi_driver() $work.

ceiling() {  # benchmark regex -> GB/s (median of 3 repetitions of a gradwire-micro benchmark)
  [ -x "$micro" ] || { echo "n/a (no $micro)"; return; }
  "$micro" --benchmark_filter="$1" --benchmark_repetitions=3 --benchmark_min_time=0.3 \
    --benchmark_report_aggregates_only=true --benchmark_format=json 2>/dev/null |
    /usr/bin/python3 -c 'import json,sys
d=json.load(sys.stdin)["benchmarks"]
m=[b for b in d if b.get("aggregate_name")=="median"]
print("%.2f" % (m[0]["bytes_per_second"]/1e9) if m else "n/a")' 2>/dev/null || echo "n/a"
}

ratio() {  # a b -> a/b as "N.NNx", or "-" where either is not a number or b is 0
  if [[ "$1" =~ ^[0-9.]+$ && "$2" =~ ^[0-9.]+$ ]] && awk -v b="$2" 'BEGIN { exit !(b > 0) }'; then
    awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'
  else
    echo "-"
  fi
}

median() {  # values... ("fail" ignored) -> median with $median_decimals (default 3), or "fail"
  local vals count
  vals=$(printf '%s\n' "$@" | grep -E '^[0-9.]+$' | sort -g)
  [ -z "$vals" ] && { echo "fail"; return; }
  count=$(wc -l <<<"$vals")
  awk -v c="$count" -v f="%.${median_decimals:-3}f" \
    '{ v[NR] = $1 } END { if (c % 2) printf f, v[(c + 1) / 2]; else printf f, (v[c / 2] + v[c / 2 + 1]) / 2 }' <<<"$vals"
}

mpi_driver() {  # driver.c binary -> builds the Open MPI driver; prints why it cannot run, or nothing
  if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
    echo "missing: mpicc/mpirun (apt-get install openmpi-bin libopenmpi-dev)"
  elif ! mkdir -p "$(dirname "$2")" || ! mpicc -O2 -o "$2" "$1" 2>"$work/mpicc.log"; then
    echo "mpicc failed: $(head -c 200 "$work/mpicc.log" | tr '\n' ' ')"
  fi
}
