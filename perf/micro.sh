#!/usr/bin/env bash
# Runs the microbenchmarks (gradwire-micro, perf/micro/: codecs against memcpy, reduction kernels,
# schedule building, the daemon ring, the store codec, the shm ring) and keeps their JSON.
#
# usage: perf/micro.sh [-b BINARY] [-r REPS] [-f FILTER] [-t MIN_TIME] [-o DIR]
#   -b  gradwire-micro binary (default: build/release/perf/micro/gradwire-micro)
#   -r  repetitions of every benchmark; the console shows their mean/median/stddev (default 5)
#   -f  regular expression of the benchmarks to run (default: all)
#   -t  minimum seconds per repetition (default 0.5)
#   -o  directory of the JSON output, micro-<UTC time>.json (default build/release/micro-results)
# The codec rows and memcpy run in the same process, their repetitions interleaved in random order
# (a change of load on a shared machine hits all of them alike), so their ratio is measured on the
# same machine state; CPU time (per core) is what bytes_per_second divides by. After the run, a table of
# every codec's median encode and decode GB/s against memcpy's median at the same size.
# Exit status: 0 every benchmark ran; 1 a benchmark reported an error; 2 bad arguments or no binary.
set -uo pipefail

bin=build/release/perf/micro/gradwire-micro
reps=5
filter=.
min_time=0.5
outdir=build/release/micro-results
for a in "$@"; do [ "$a" = --help ] && set -- -h; done  # --help means -h
while getopts "b:r:f:t:o:h" opt; do
  case $opt in
    b) bin=$OPTARG ;;
    r) reps=$OPTARG ;;
    f) filter=$OPTARG ;;
    t) min_time=$OPTARG ;;
    o) outdir=$OPTARG ;;
    h) sed -n '2,13p' "$0"; exit 0 ;;
    *) sed -n '5,10p' "$0" >&2; exit 2 ;;
  esac
done
if [ ! -x "$bin" ]; then
  echo "micro.sh: no binary at $bin (build the gradwire-micro target; needs libbenchmark-dev)" >&2
  exit 2
fi
mkdir -p "$outdir" || exit 2
out="$outdir/micro-$(date -u +%Y%m%dT%H%M%SZ).json"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$bin" --benchmark_filter="$filter" --benchmark_repetitions="$reps" \
  --benchmark_min_time="$min_time" --benchmark_report_aggregates_only=true \
  --benchmark_enable_random_interleaving=true \
  --benchmark_out="$out" --benchmark_out_format=json 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
echo "micro.sh: JSON in $out"
python3 - "$out" <<'PY' || true
import json, re, sys
rows = {}
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    if b.get("aggregate_name", "median") != "median" or "bytes_per_second" not in b:
        continue
    m = re.match(r"(memcpy|encode/(.*)|decode/(.*))/(\d+)(_median)?$", b["run_name"])
    if m:
        rows[(m.group(1).split("/")[0], m.group(2) or m.group(3) or "", int(m.group(4)))] = \
            b["bytes_per_second"] / 1e9
sizes = sorted({k[2] for k in rows})
codecs = sorted({k[1] for k in rows if k[0] == "encode"})
if codecs:
    print("%-14s %10s %10s %10s %10s %8s" % ("codec", "elements", "enc GB/s", "dec GB/s",
                                             "memcpy", "enc/mcp"))
for n in sizes:
    mc = rows.get(("memcpy", "", n))
    for c in codecs:
        e, d = rows.get(("encode", c, n)), rows.get(("decode", c, n))
        if e is None or mc is None:
            continue
        print("%-14s %10d %10.2f %10.2f %10.2f %7.0f%%" % (c, n, e, d or 0, mc, 100 * e / mc))
PY
if [ "$rc" -ne 0 ] || grep -q "ERROR OCCURRED" "$log"; then
  echo "micro.sh: a benchmark failed" >&2
  exit 1
fi
exit 0
