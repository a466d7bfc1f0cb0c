# shellcheck shell=bash
# Sourced by the scripts that measure the machine's plain TCP ceiling over the testbed's links
# (perf/cluster_bench.sh, ps_bench.sh, hvd_bench.sh): each runs perf/link_ceiling.py (itself or
# through ps_bench_rank.py --ceiling-only) twice with 1 and twice with 4 connections per link,
# every host printing "CEILING seconds", and keeps the best try by its slowest host.

# ceiling_best OUTPUT HOSTS BEST: the try's seconds (its slowest host's "[hN] CEILING s" line in
# OUTPUT) when all HOSTS reported and it beats BEST (empty: no try yet); else BEST again.
ceiling_best() {
  local secs
  if [ "$(grep -c '\] CEILING ' <<<"$1")" -ne "$2" ]; then echo "$3"; return; fi
  secs=$(sed -n 's/^\[h[0-9]*\] CEILING //p' <<<"$1" | sort -g | tail -1)
  if [ -z "$3" ] || awk -v a="$secs" -v b="$3" 'BEGIN { exit !(a < b) }'; then
    echo "$secs"
  else
    echo "$3"
  fi
}
