#!/usr/bin/env bash
# Training throughput (images/sec) of one torchvision model on synthetic data through gradwire's
# Horovod API (with fusion, without fusion, fp16, a gradwire codec) against DDP over Gloo and DDP
# over the gradwire backend, on the shaped namespace testbed (tests/testbed/testbed.sh): HOSTS
# hosts x RANKS ranks, every host's link shaped to RATE. One run of each system, one after the
# other, same model, batch, image size and step counts (perf/hvd_synthetic_bench.py). The same run
# first measures the machine's ceilings:
#   compute  the same model trained by the same number of ranks with no communication at all
#            (hvd_synthetic_bench.py --mode local, in the testbed), the sum of the ranks'
#            images/sec: what this machine's CPUs allow;
#   link     plain TCP streaming --ceiling-bytes from every host to the next at once over the
#            shaped links (perf/ps_bench_rank.py --ceiling-only), the best of two tries with 1 and
#            two with 4 connections per link (by each try's slowest host), in Gbit/s,
#            and from it the time to move one gradient (each host sends and receives it once in a
#            two-level ring: 2(H-1)/H x gradient bytes) at that rate.
#
# usage: perf/hvd_bench.sh [--hosts H] [--ranks-per-host R] [--rate RATE] [--model NAME]
#                          [--batch-size B] [--image-size S] [--warmup W] [--steps N]
#                          [--codec SPEC] [--systems "LIST"] [--ceiling-bytes BYTES]
#                          [-B BUILD_DIR] [-t TIMEOUT_S]
#   defaults: 2 hosts x 2 ranks, 1gbit, resnet18, batch 4 per rank, 224 x 224, 2 warm-up and 6
#   timed steps, codec topk:0.01, ceiling 64 MiB, build/release, 600 s per run
#   --systems  subset of: hvd hvd-nofusion hvd-fp16 hvd-codec ddp-gloo ddp-gradwire (default: all)
#              hvd-nofusion is hvd with GRADWIRE_FUSION_THRESHOLD=0 (one reduction per parameter;
#              docs/horovod.md); hvd-codec runs Compression.codec(SPEC)
# Prints a table (images/sec, ms per step, ratio to ddp-gradwire) and the line
# "ratio hvd / ddp-gradwire = X" (the goal of issue 31: >= 0.95). Needs root (network
# namespaces; exit 77 otherwise), Debian's /usr/bin/python3 with python3-torch and
# python3-torchvision, and libgradwire.so in BUILD_DIR/capi. A system that fails is reported
# with its last lines and makes the exit status 1; the others still run.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/link_ceiling.sh"  # ceiling_best()
root="$(cd "$here/.." && pwd)"
hosts=2; rph=2; rate=1gbit; model=resnet18; batch=4; image=224; warmup=2; steps=6
codec="topk:0.01"; systems="hvd hvd-nofusion hvd-fp16 hvd-codec ddp-gloo ddp-gradwire"
ceil_bytes=$((64 << 20)); build="$root/build/release"; timeout_s=600
py=/usr/bin/python3
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || case "$1" in -h|--help) ;; *) echo "hvd_bench: $1 needs a value" >&2; usage ;; esac
  case "$1" in
    --hosts) hosts="$2"; shift 2 ;;
    --ranks-per-host) rph="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --batch-size) batch="$2"; shift 2 ;;
    --image-size) image="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --codec) codec="$2"; shift 2 ;;
    --systems) systems="$2"; shift 2 ;;
    --ceiling-bytes) ceil_bytes="$2"; shift 2 ;;
    -B) build="$(cd "$2" && pwd)" || exit 2; shift 2 ;;
    -t) timeout_s="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "hvd_bench: unknown argument '$1'" >&2; usage ;;
  esac
done
for v in "$hosts" "$rph" "$batch" "$image" "$warmup" "$steps" "$ceil_bytes" "$timeout_s"; do
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "hvd_bench: '$v' is not a number" >&2; exit 2; }
done
[ "$hosts" -ge 2 ] && [ "$rph" -ge 1 ] && [ "$steps" -ge 1 ] ||
  { echo "hvd_bench: need --hosts >= 2, --ranks-per-host >= 1, --steps >= 1" >&2; exit 2; }
for s in $systems; do
  case "$s" in hvd|hvd-nofusion|hvd-fp16|hvd-codec|ddp-gloo|ddp-gradwire) ;;
    *) echo "hvd_bench: unknown system '$s'" >&2; exit 2 ;; esac
done
lib="$build/capi/libgradwire.so"
[ -f "$lib" ] || { echo "hvd_bench: $lib missing (cmake --build $build --target gradwire)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "hvd_bench: needs root (network namespaces)" >&2; exit 77; }
"$py" -c 'import torch, torchvision' 2>/dev/null ||
  { echo "hvd_bench: $py lacks torch or torchvision (apt-get install python3-torchvision)" >&2; exit 77; }
rate_arg=(); [ "$rate" != none ] && rate_arg=(-r "$rate")

work=$(mktemp -d /tmp/hvd_bench.XXXXXX)
tb_pid=""
trap '[ -n "$tb_pid" ] && kill -TERM "$tb_pid" 2>/dev/null; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
testbed() {  # testbed ARGS... -> status; output in $work/tb.out (backgrounded so signals stop it)
  bash "$root/tests/testbed/testbed.sh" "$@" >"$work/tb.out" 2>&1 &
  tb_pid=$!
  wait "$tb_pid"
  local rc=$?
  tb_pid=""
  return $rc
}
env_common="export PYTHONPATH=$root/python GRADWIRE_LIBRARY=$lib OMP_NUM_THREADS=1;"
bench="$py $here/hvd_synthetic_bench.py --model $model --batch-size $batch --image-size $image \
--warmup $warmup --steps $steps"
world=$((hosts * rph))

commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')
echo "# hvd_bench: $(date -u '+%F %H:%M UTC'), commit $commit," \
  "$hosts hosts x $rph ranks, link $rate, $model batch $batch/rank ${image}x$image," \
  "$warmup warm-up + $steps timed steps, one run per system"
echo "# load average at the start: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs" \
  "(a shared machine: every figure is under that load)"

# Ceiling 1: compute, the same ranks with no communication.
if testbed -n "$hosts" -R "$rph" -t "$timeout_s" -- "$env_common exec $bench --mode local"; then
  pat='s/^\[h[0-9]*r[0-9]*\] hvd_bench mode=local .*images_per_sec=\([0-9.]*\) .*grad_bytes=\([0-9]*\).*/\1 \2/p'
  sum='{ s += $1; g = $2; n++ } END { if (n) printf "%.2f %d\n", s, g }'
  read -r comp_ips grad_bytes < <(sed -n "$pat" "$work/tb.out" | awk "$sum")
fi
if [ -z "${comp_ips:-}" ]; then
  echo "hvd_bench: the compute ceiling run failed:" >&2; tail -20 "$work/tb.out" >&2; exit 1
fi
# Ceiling 2: the shaped links, plain TCP: the best of 1, 4, 1 and 4 connections per link.
link_s=""
for streams in 1 4 1 4; do
  testbed -n "$hosts" "${rate_arg[@]}" -t "$timeout_s" -- \
    "$env_common exec $py $here/ps_bench_rank.py --ceiling-only --hosts $hosts --bytes $ceil_bytes \
--ceiling-port \$((TB_PORT + 7)) --ceiling-streams $streams" || continue
  link_s=$(ceiling_best "$(cat "$work/tb.out")" "$hosts" "$link_s")
done
if [ -z "$link_s" ]; then
  echo "hvd_bench: the link ceiling runs failed:" >&2; tail -20 "$work/tb.out" >&2; exit 1
fi
link_gbit=$(awk -v b="$ceil_bytes" -v s="$link_s" 'BEGIN { printf "%.3f", b * 8 / s / 1e9 }')
comm_ms=$(awk -v g="$grad_bytes" -v h="$hosts" -v r="$link_gbit" \
  'BEGIN { printf "%.0f", 2 * (h - 1) / h * g * 8 / (r * 1e9) * 1000 }')
echo "# machine ceilings, same run: compute (no communication, $world ranks) $comp_ips images/sec" \
  "= $(awk -v i="$comp_ips" -v b="$batch" -v w="$world" 'BEGIN { printf "%.0f", b * w / i * 1000 }') ms per step;" \
  "link (plain TCP, every host at once) $link_gbit Gbit/s (tc rate $rate);" \
  "one float32 gradient of $grad_bytes B over it: $comm_ms ms per step"

declare -A ips ms
failed=0
for s in $systems; do
  extra=""; mode="$s"
  case "$s" in
    hvd-nofusion) mode=hvd; extra="GRADWIRE_FUSION_THRESHOLD=0" ;;
    hvd-codec) mode="hvd-codec:$codec" ;;
    ddp-gloo) extra="GLOO_SOCKET_IFNAME=d0" ;;
  esac
  if testbed -n "$hosts" -R "$rph" "${rate_arg[@]}" -t "$timeout_s" -- \
       "$env_common $extra exec $bench --mode $mode"; then
    line=$(sed -n 's/^\[h0r0\] hvd_bench //p' "$work/tb.out" | head -1)
  else
    line=""
  fi
  if [ -z "$line" ]; then
    echo "# $s FAILED:" >&2; tail -15 "$work/tb.out" >&2; failed=1; continue
  fi
  ips[$s]=$(sed -n 's/.*images_per_sec=\([0-9.]*\).*/\1/p' <<<"$line")
  ms[$s]=$(sed -n 's/.*step_ms=\([0-9.]*\).*/\1/p' <<<"$line")
  echo "# $s: $line"
done

echo
printf "| %-22s | %12s | %10s | %16s |\n" system images/sec "ms/step" "/ ddp-gradwire"
printf "|%s|%s|%s|%s|\n" ------------------------ -------------- ------------ ------------------
ref="${ips[ddp-gradwire]:-}"
for s in $systems; do
  name="$s"; [ "$s" = hvd-codec ] && name="hvd-codec ($codec)"
  if [ -z "${ips[$s]:-}" ]; then printf "| %-22s | %12s | %10s | %16s |\n" "$name" failed - -; continue; fi
  r="-"; [ -n "$ref" ] && r=$(awk -v a="${ips[$s]}" -v b="$ref" 'BEGIN { printf "%.3f", a / b }')
  printf "| %-22s | %12s | %10s | %16s |\n" "$name" "${ips[$s]}" "${ms[$s]}" "$r"
done
printf "| %-22s | %12s | %10s | %16s |\n" "ceiling: no communication" "$comp_ips" \
  "$(awk -v i="$comp_ips" -v b="$batch" -v w="$world" 'BEGIN { printf "%.1f", b * w / i * 1000 }')" -
if [ -n "${ips[hvd]:-}" ] && [ -n "$ref" ]; then
  awk -v a="${ips[hvd]}" -v b="$ref" 'BEGIN { r = a / b;
    printf "ratio hvd / ddp-gradwire = %.3f (goal >= 0.95: %s)\n", r, (r >= 0.95 ? "met" : "missed") }'
fi
exit $failed
