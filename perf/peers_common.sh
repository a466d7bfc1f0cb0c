# Shared by the peer-comparison scripts (perf/p2p_peers.sh, perf/alltoallv_peers.sh) and
# perf/zero_copy.sh, sourced after they set $micro (the gradwire-micro binary).

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
