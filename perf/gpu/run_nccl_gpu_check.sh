#!/bin/bash
# Side-by-side check of NCCL's own Socket transport and the gradwire plugin on a GPU machine:
# torch.distributed allreduce (NCCL 2.28) with 2 and 4 ranks on one GPU posing as separate hosts
# (NCCL_HOSTID), under CUDA MPS, for 64 MiB and 256 MiB, printing one table. Columns: Socket at
# its defaults and tuned 4x4 (NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4); the plugin at its
# defaults (auto thread policy: 1 I/O thread per comm on 8+ CPU hosts) and at 4 I/O threads x 4
# sockets (GW_SOCKET_NTHREADS=4 GW_SOCKET_NSOCKS=4).
#
# usage: perf/gpu/run_nccl_gpu_check.sh [PLUGIN_SO]
#   PLUGIN_SO  an already built libnccl-net-gradwire.so; without it the plugin is built
#              standalone (cmake -S plugin) into build/plugin-gpu, which needs only a C++20
#              compiler, cmake, and the fmt + spdlog headers (installed, or a directory holding
#              fmt/ and spdlog/ given as GW_THIRD_PARTY_INCLUDE=<dir>).
# environment: PYTHON (default: the first python3 that imports torch), PEERS (the directory of
#              nccl_torch_allreduce.py and with_mps.sh, default .gpu/peers, which
#              scripts/gpu_prepare.sh copies from ../shared/peers beside the checkout),
#              NPS ("2 4"), SIZES ("67108864 268435456"), RUN_TIMEOUT seconds per run (600),
#              BUDGET seconds for all runs (330; runs that would start later are skipped, so
#              the whole check fits one 10-minute device call with the build), DAEMON_BIN (the
#              gradwired of the daemon-mode columns, default build/gpu-check/gradwired).
# Daemon mode (docs/nccl-plugin.md): a column whose label starts with "gradwire daemon" runs each
# rank through a gradwired of its own "host" (GW_HOSTID gwhost<r>, as NCCL_HOSTID; the ranks'
# connections are jobs of two daemons, over tcp on lo: nccl_daemon_allreduce.py), one whose
# label starts with "gradwire one daemon" runs every rank through one gradwired (one host's
# ranks, arena to arena); the script starts and stops those daemons around the run and checks
# in their logs that the connections went through them.
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
peers=${PEERS:-$root/.gpu/peers}
nps=${NPS:-2 4}
sizes=${SIZES:-67108864 268435456}
run_timeout=${RUN_TIMEOUT:-600}
budget=${BUDGET:-330}

die() { echo "run_nccl_gpu_check.sh: $*" >&2; exit 2; }

[ -f "$peers/nccl_torch_allreduce.py" ] || die "no $peers/nccl_torch_allreduce.py (set PEERS=)"
[ -x "$peers/with_mps.sh" ] || [ -f "$peers/with_mps.sh" ] || die "no $peers/with_mps.sh"
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this script needs a GPU machine"

if [ -z "${PYTHON:-}" ]; then
  for p in python3 /usr/bin/python3 python; do
    if command -v "$p" >/dev/null && "$p" -c 'import torch' 2>/dev/null; then PYTHON=$p; break; fi
  done
fi
[ -n "${PYTHON:-}" ] || die "no python with torch found (set PYTHON=)"

# ---- the plugin ---------------------------------------------------------------------------
plugin=${1:-}
if [ -z "$plugin" ]; then
  bash "$here/build_plugin.sh" || die "the plugin did not build"
  plugin="$root/build/plugin-gpu/libnccl-net-gradwire.so"
fi
plugin=$(cd "$(dirname "$plugin")" && pwd)/$(basename "$plugin")  # NCCL wants an absolute path
[ -f "$plugin" ] || die "no plugin at $plugin"
echo "== plugin: $plugin"

# ---- runs ---------------------------------------------------------------------------------
logdir=$(mktemp -d /tmp/gw-nccl-check.XXXXXX)
declare -A result

daemon_bin=${DAEMON_BIN:-$root/build/gpu-check/gradwired}
daemon_pids=()
# start_daemons DIR COUNT: gradwired i (0 .. COUNT-1) on DIR/gwd<i>.sock, its log DIR/gwd<i>.log;
# with COUNT > 1 each is a host of its own (GW_HOSTID gwhost<i>). Returns 1 when one does not
# answer within 10 s.
start_daemons() {
  local dir=$1 count=$2 i hid
  daemon_pids=()
  for i in $(seq 0 $((count - 1))); do
    hid=""
    [ "$count" -gt 1 ] && hid="GW_HOSTID=gwhost$i"
    # shellcheck disable=SC2086
    env $hid GW_DAEMON_TRANSPORT=tcp GW_SOCKET_IFNAME=lo GW_LOG_LEVEL=info \
      "$daemon_bin" --foreground --socket "$dir/gwd$i.sock" >"$dir/gwd$i.log" 2>&1 &
    daemon_pids+=($!)
  done
  for i in $(seq 0 $((count - 1))); do
    for _ in $(seq 100); do [ -S "$dir/gwd$i.sock" ] && break; sleep 0.1; done
    [ -S "$dir/gwd$i.sock" ] || { echo "   gradwired $i did not start:" >&2; tail -5 "$dir/gwd$i.log" >&2; return 1; }
  done
}
stop_daemons() {
  local p
  for p in "${daemon_pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${daemon_pids[@]}"; do wait "$p" 2>/dev/null; done
  daemon_pids=()
}
trap stop_daemons EXIT

# run LABEL NP ENV...: one nccl_torch_allreduce.py run over every size; fills result[LABEL,NP,SIZE]
run() {
  local label=$1 np=$2
  shift 2
  if [ $((SECONDS - runs_start)) -ge "$budget" ]; then
    echo "== $label, $np ranks: skipped (BUDGET=$budget s spent)" >&2
    for s in $sizes; do result[$label,$np,$s]="skipped"; done
    return
  fi
  local log="$logdir/${label// /_}-np$np.log"
  echo "== $label, $np ranks" >&2
  # shellcheck disable=SC2206
  local cmd=("$PYTHON" "$peers/nccl_torch_allreduce.py" "$np" $sizes) daemons=0 ddir=""
  case $label in
    "gradwire daemon"*) daemons=$np ;;
    "gradwire one daemon"*) daemons=1 ;;
  esac
  if [ "$daemons" -gt 0 ]; then
    [ -x "$daemon_bin" ] || die "no gradwired at $daemon_bin (set DAEMON_BIN=)"
    ddir=$(mktemp -d /tmp/gw-nccl-daemons.XXXXXX)
    if ! start_daemons "$ddir" "$daemons"; then
      stop_daemons
      for s in $sizes; do result[$label,$np,$s]="fail(daemon)"; done
      return
    fi
    if [ "$daemons" = 1 ]; then
      cmd=(env "GW_DAEMON=unix:$ddir/gwd0.sock" GW_SOCKET_IFNAME=lo "${cmd[@]}")
    else
      # shellcheck disable=SC2206
      cmd=(env GW_SOCKET_IFNAME=lo "$PYTHON" "$here/nccl_daemon_allreduce.py"
           "$peers/nccl_torch_allreduce.py" "$ddir" "$np" $sizes)
    fi
  fi
  timeout "$run_timeout" env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,TUNING "$@" \
    bash "$peers/with_mps.sh" "${cmd[@]}" >"$log" 2>&1
  local rc=$? bypassed=0
  if [ "$daemons" -gt 0 ]; then
    stop_daemons
    # The connections must have been jobs of the daemons: a trainer joining a job of 2 ranks
    # (both ends on one daemon; across hosts, one end each), and across hosts the daemons'
    # "job of 2 ranks (host h of 2)".
    local jobs
    jobs=$(cat "$ddir"/gwd*.log | grep -cE "joined a job of 2 ranks|: job of 2 ranks \(host")
    echo "   daemons: $jobs connection job(s) in their logs" >&2
    grep -m1 "NET/gradwire: daemon mode" "$log" | sed 's/^.*INFO /   /' >&2 ||
      echo "   (no daemon-mode INFO line in $log)" >&2
    for f in "$ddir"/gwd*.log; do cp "$f" "$logdir/${label// /_}-np$np.$(basename "$f")"; done
    rm -rf "$ddir"
    [ "$jobs" = 0 ] && bypassed=1  # the plugin did not go through them: not daemon mode
  fi
  for s in $sizes; do
    local line
    line=$(grep -E "^nccl net=.* np=$np bytes=$s " "$log" | tail -1)
    if [ -n "$line" ]; then
      local bw ok
      bw=$(sed -E 's/.*busbw_GBps=([0-9.]+).*/\1/' <<<"$line")
      ok=$(sed -E 's/.* ok=([01]).*/\1/' <<<"$line")
      [ "$ok" = 1 ] && [ "$bypassed" = 0 ] && result[$label,$np,$s]=$bw ||
        result[$label,$np,$s]="$bw(BAD)"
    else
      result[$label,$np,$s]="fail(rc=$rc)"
    fi
  done
  grep -m1 "coll channels" "$log" | sed 's/^.*INFO /   /' >&2
  # The plugin must really have been used: its INFO line and NCCL's channel lines.
  if [[ $label == gradwire* ]]; then
    grep -m1 "NET/gradwire: backend" "$log" >&2 || echo "   (no gradwire INFO line in $log)" >&2
    grep -m1 -E "NET/gradwire: (set|could not|NCCL)" "$log" >&2
    grep -m1 -E "via NET/gradwire|Using network gradwire|Assigned NET plugin gradwire" "$log" >&2 ||
      echo "   (NCCL did not report using gradwire; see $log)" >&2
    # The tuner NCCL found in the plugin's library, and what it decided for the communicator.
    grep -m1 -E "TUNER/Plugin: Using" "$log" >&2 || echo "   (NCCL loaded no tuner)" >&2
    grep -m1 -E "TUNER/gradwire" "$log" | sed 's/^.*INFO /   /' >&2
  fi
}

# Columns: "LABEL=ENV ENV ...", one per line; labels starting with gradwire load the plugin.
# CONFIGS overrides the default four (e.g. to sweep GW_SOCKET_NTHREADS/GW_SOCKET_NSOCKS).
configs=${CONFIGS:-"Socket defaults=NCCL_NET=Socket
Socket 4x4=NCCL_NET=Socket NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4
gradwire=
gradwire 4x4=GW_SOCKET_NTHREADS=4 GW_SOCKET_NSOCKS=4"}
labels=()
declare -A envs
while IFS= read -r line; do
  [ -z "$line" ] && continue
  labels+=("${line%%=*}")
  envs[${line%%=*}]=${line#*=}
done <<<"$configs"

runs_start=$SECONDS
for np in $nps; do
  for l in "${labels[@]}"; do
    # shellcheck disable=SC2206
    e=(${envs[$l]})
    if [[ $l == gradwire* ]]; then
      run "$l" "$np" NCCL_NET_PLUGIN="$plugin" NCCL_NET=gradwire "${e[@]}"
    else
      run "$l" "$np" "${e[@]}"
    fi
  done
done

# ---- table --------------------------------------------------------------------------------
echo
echo "allreduce busbw GB/s (float32 sum, ranks on one GPU under MPS, NCCL_HOSTID per rank)"
for l in "${labels[@]}"; do echo "  $l: ${envs[$l]:-(defaults)}"; done
printf "%-4s %-12s" np bytes
for l in "${labels[@]}"; do printf " %-16s" "$l"; done
echo
bad=0
for np in $nps; do
  for s in $sizes; do
    printf "%-4s %-12s" "$np" "$s"
    for l in "${labels[@]}"; do
      [[ ${result[$l,$np,$s]} =~ ^[0-9.]+$ ]] || [ "${result[$l,$np,$s]}" = skipped ] || bad=1
      printf " %-16s" "${result[$l,$np,$s]}"
    done
    echo
  done
done
echo "runs took $((SECONDS - runs_start)) s"
echo "logs: $logdir"
# The device tool brings back what is under $OUT: the per-run NCCL logs, as one file.
[ -n "${OUT:-}" ] && tar czf "$OUT/nccl-logs.tgz" -C "$logdir" . && echo "logs also in $OUT/nccl-logs.tgz"
exit $bad  # 1 when a run failed or gave a wrong result
