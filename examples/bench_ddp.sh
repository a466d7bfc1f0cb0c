#!/usr/bin/env bash
# DDP step time of examples/train_ddp.py: gloo, the gradwire backend, gradwire's compressed hooks
# and torch's own powerSGD_hook over gloo, on loopback (gradwire-run) and on the shaped namespace
# testbed (tests/testbed/testbed.sh: 2 hosts x 2 ranks, tbf-shaped data links, root only).
#
#   examples/bench_ddp.sh [-r ROUNDS] [-s STEPS] [-n "2 4"] [-t RATE|-T] [-c CONFIGS] [-o DIR]
#                         [-- train_ddp.py options]
#
#   -r ROUNDS  runs of every configuration per setting (default 3); the runs are interleaved
#              (round 1: A B C ..., round 2: A B C ...) so a loaded machine hurts all alike
#   -s STEPS   training steps per run (default 20; the first 2 are not timed)
#   -n LIST    loopback rank counts (default "2 4"; "" for none)
#   -t RATE    testbed rate (default 1gbit); -T: no testbed run
#   -c CONFIGS train_ddp.py configurations (default gloo,gradwire,gw-powersgd:4,gw-topk:0.01,
#              gloo-torch-powersgd:4); every run is one configuration in a fresh job (torch's
#              powerSGD_hook aborts inside gloo on torch 1.13 after other DDP models in the same
#              process)
#   -o DIR     where the per-run JSON lines go (default a temporary directory, removed)
#
# Prints one table per setting: median over the runs of each run's median step time, its ratio
# to gloo's (above 1: faster than gloo), the final loss (mean of the last 5 steps, median over
# runs) and its ratio to gloo's, and gradient MB sent per step per rank. Options after -- go to
# train_ddp.py (e.g. --vocab 20000 --layers 1 for a model whose gradients outweigh its compute).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=3 steps=20 nps="2 4" rate=1gbit testbed=1 out=""
configs="gloo,gradwire,gw-powersgd:4,gw-topk:0.01,gloo-torch-powersgd:4"
while getopts "r:s:n:t:Tc:o:" o; do
  case $o in
    r) rounds=$OPTARG ;; s) steps=$OPTARG ;; n) nps=$OPTARG ;; t) rate=$OPTARG ;;
    T) testbed=0 ;; c) configs=$OPTARG ;; o) out=$OPTARG ;;
    *) sed -n '2,24p' "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift
extra=("$@")
py=${GW_PYTHON:-/usr/bin/python3}
if [ -z "$out" ]; then out=$(mktemp -d); trap 'rm -rf "$out"' EXIT; else mkdir -p "$out"; fi
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONWARNINGS=ignore
export GW_TIMEOUT_MS=${GW_TIMEOUT_MS:-60000}
IFS=, read -r -a cfgs <<<"$configs"
# One bucket for every configuration: torch's powerSGD_hook over gloo needs it (see train_ddp.py).
train=("$root/examples/train_ddp.py" --steps "$steps" --png "" --one-bucket "${extra[@]}")

run() {  # run SETTING CONFIG: one job; rank 0 appends its JSON line to $out/SETTING.jsonl
  local setting=$1 cfg=$2 log="$out/$1.log"
  local args=("${train[@]}" --configs "$cfg" --json "$out/$setting.jsonl")
  echo "== $setting $cfg $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$log"
  if [[ $setting == testbed ]]; then
    # GLOO_SOCKET_IFNAME puts gloo's traffic on the shaped data link too (the store and
    # MASTER_ADDR stay on the unshaped control network).
    local q; q=$(printf '%q ' "$py" "${args[@]}")
    bash "$root/tests/testbed/testbed.sh" -n 2 -R 2 -r "$rate" -t 900 -- \
      "cd $(printf %q "$root") && GLOO_SOCKET_IFNAME=d0 $q" >>"$log" 2>&1 ||
      echo "bench_ddp: $setting $cfg failed (see $log)" >&2
  else
    "$py" -m gradwire.run -np "${setting#np}" -- "$py" "${args[@]}" >>"$log" 2>&1 ||
      echo "bench_ddp: $setting $cfg failed (see $log)" >&2
  fi
}

settings=()
for n in $nps; do settings+=("np$n"); done
if [ "$testbed" = 1 ]; then
  if [ "$(id -u)" = 0 ]; then settings+=(testbed); else echo "bench_ddp: testbed needs root; skipped" >&2; fi
fi
for s in "${settings[@]}"; do
  for ((i = 1; i <= rounds; i++)); do
    for c in "${cfgs[@]}"; do run "$s" "$c"; done
  done
done

"$py" - "$out" "$rate" "${settings[@]}" <<'EOF'
import json, os, statistics, sys
out, rate, settings = sys.argv[1], sys.argv[2], sys.argv[3:]
print(f"load average at the end: {open('/proc/loadavg').read().split()[:3]}, "
      f"{os.cpu_count()} cpus")
for s in settings:
    path = os.path.join(out, s + ".jsonl")
    rows = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
    by = {}
    for r in rows:
        by.setdefault(r["config"], []).append(r)
    where = f"testbed 2 hosts x 2 ranks, {rate} links" if s == "testbed" else \
        f"loopback, {s[2:]} ranks"
    print(f"\n{where}: runs per config {[len(v) for v in by.values()]}")
    print(f"{'config':24} {'step ms':>8} {'x gloo':>7} {'final loss':>10} {'loss/gloo':>9} "
          f"{'MB/step':>8}")
    med = {c: statistics.median(r["step_ms"] for r in v) for c, v in by.items()}
    loss = {c: statistics.median(r["final_loss"] for r in v) for c, v in by.items()}
    for c, v in by.items():
        sent = v[0]["sent_bytes"]
        speed = f"{med['gloo'] / med[c]:.2f}" if "gloo" in med else "-"
        lr = f"{loss[c] / loss['gloo']:.3f}" if "gloo" in loss else "-"
        mb = f"{sent / 1e6:.2f}" if sent is not None else "-"
        print(f"{c:24} {med[c]:8.1f} {speed:>7} {loss[c]:10.4f} {lr:>9} {mb:>8}")
EOF
