#!/usr/bin/env bash
# One collective across the shaped namespace testbed (tests/testbed/testbed.sh): gradwire's
# algorithms and codecs side by side with PyTorch Gloo and Open MPI (coll tuned and coll han), in
# ONE run, same sizes, same layout, interleaved repetitions (rep 1 of every system, then rep 2,
# ...), so a noisy neighbour hits every column alike. Reports medians over the repetitions.
#
# usage: perf/cluster_bench.sh --hosts H --ranks-per-host R --rate RATE --sizes "64M 256M" -r N
#                              [--op OP] [--codec SPEC ...] [--systems "LIST"] [--json FILE]
#                              [--png FILE] [-B BUILD_DIR] [-n ITERS] [-t TIMEOUT_S]
#   --ranks-per-host  one count for every host, or one per host, comma-separated ("3,1": an
#               uneven layout; JSON ranks_per_host is then that string)
#   --rate      tc rate of every host's link (1gbit, 10gbit, 100mbit; "none" = unshaped)
#   --op        the collective, float32: allreduce (sum; the default), broadcast (from rank 0),
#               allgather, reduce_scatter (sum). Every system runs it, checked
#   --codec     adds system gradwire-<SPEC> (gw_allreduce_compressed), repeatable; allreduce only
#   --systems   subset of: gradwire-flat gradwire-auto gradwire-hier gradwire-daemon
#               gradwire-daemon-copy gloo mpi-tuned mpi-han (default: all of them; codec systems
#               come from --codec), plus gradwire-algo:NAME for any algorithm name of the op
#               (allreduce, GW_ALGO: ring, rhd, host_ring, hier, hier_leader, tree, bblocks;
#               the others, GW_ALGO_BROADCAST / _ALLGATHER / _REDUCE_SCATTER: ring, hier) to see
#               what auto chose against each algorithm forced. gradwire-flat forces ring,
#               gradwire-hier hier (--algo for allreduce, else the op's GW_ALGO_* knob; on
#               uneven hosts the allreduce's hier_leader, and no hier for the other ops),
#               gradwire-auto leaves the choice to the cost model. gradwire-daemon: one gradwired
#               per host (in its namespace, --foreground, a socket in a temporary directory,
#               GW_DAEMON_TRANSPORT as set, default auto: tcp here, over d0), the ranks in daemon mode
#               (GW_DAEMON=unix:SOCKET) with gradwire-perf --mem-alloc buffers (zero-copy through
#               the arena); gradwire-daemon-copy: the same with heap buffers (copied into the
#               arena). gloo: perf/peers/gloo_allreduce.py --op OP; mpi-*: perf/peers/
#               mpi_allreduce.c -o OP (MPI_Allreduce, MPI_Bcast, MPI_Allgather,
#               MPI_Reduce_scatter_block)
#   -n          timed iterations per run (default: each tool's own rule, clamp(2e9/size/ranks,3,50))
# Sizes follow nccl-tests: "bytes" is the whole buffer, for allgather the gathered output (each
# rank gives bytes/n) and for reduce_scatter the input (each rank keeps bytes/n), rounded down to
# a multiple of 4n (else of 4) so that every system runs exactly the same size; busbw = algbw x
# 2(n-1)/n (allreduce), (n-1)/n (allgather, reduce_scatter), 1 (broadcast), n = H x R ranks.
# Beside the link bound, the machine's own ceiling over the same links, measured first in the same
# run: plain TCP, every host sending and receiving at once (perf/link_ceiling.py), the best of four
# tries, as a "# machine ceiling" line and "(tcp ceiling)" rows (the link bound's bytes at it).
# Needs root (network namespaces). A system that cannot run here (peer not installed, algorithm
# not built, the op not in this torch's Gloo) is reported as missing with the reason, and never
# fails the script; a run that fails or reports a wrong element is reported and counted as a
# failure (exit 1 at the end).
# CPU: gradwire-perf runs with --cpu; the column cpu_s/GB is the median of rank 0's "# cpu:"
# machine figure (the machine's busy CPU time, /proc/stat, during its timed iterations, per GB of
# the buffer: every rank and the kernel's TCP work over veth; the run's own only on an otherwise
# idle machine); the peers' drivers (perf/peers/) measure the same over their timed loops (which
# also hold a barrier and a time reduction per iteration); "-" for the codec systems.
# JSON: a list of rows {"system", "op", "hosts", "ranks_per_host", "rate", "bytes", "time_us",
# "busbw_gbps", "runs", "machine_cpu_s_per_gb"}, medians over the repetitions; busbw is the
# nccl-tests busbw of the uncompressed size. --png draws busbw against size per system (python3-matplotlib).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
hosts=2; rph=2; rate=1gbit; sizes="64M"; reps=3; codecs=(); json=""; png=""; iters=0; op=allreduce
build="$root/build/release"; timeout_s=900
systems="gradwire-flat gradwire-auto gradwire-hier gradwire-daemon gradwire-daemon-copy gloo mpi-tuned mpi-han"
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts="$2"; shift 2 ;;
    --ranks-per-host) rph="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --op) op="$2"; shift 2 ;;
    --sizes) sizes="$2"; shift 2 ;;
    -r) reps="$2"; shift 2 ;;
    --codec) codecs+=("$2"); shift 2 ;;
    --systems) systems="$2"; shift 2 ;;
    --json) json="$2"; shift 2 ;;
    --png) png="$2"; shift 2 ;;
    -B) build="$(cd "$2" && pwd)" || exit 2; shift 2 ;;
    -n) iters="$2"; shift 2 ;;
    -t) timeout_s="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "cluster_bench: unknown argument '$1'" >&2; usage ;;
  esac
done
# --ranks-per-host: one count for every host, or one per host ("3,1": an uneven layout).
IFS=, read -r -a rph_list <<<"$rph"
for v in "$hosts" "${rph_list[@]}" "$reps" "$iters" "$timeout_s"; do
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "cluster_bench: '$v' is not a number" >&2; exit 2; }
done
[ "$hosts" -ge 1 ] && [ "$reps" -ge 1 ] ||
  { echo "cluster_bench: --hosts, --ranks-per-host and -r must be >= 1" >&2; exit 2; }
if [ "${#rph_list[@]}" -eq 1 ]; then
  for ((h = 1; h < hosts; h++)); do rph_list+=("${rph_list[0]}"); done
elif [ "${#rph_list[@]}" -ne "$hosts" ]; then
  echo "cluster_bench: --ranks-per-host '$rph' lists ${#rph_list[@]} counts for $hosts hosts" >&2; exit 2
fi
uneven=0
for v in "${rph_list[@]}"; do
  [ "$v" -ge 1 ] || { echo "cluster_bench: --ranks-per-host must be >= 1 on every host" >&2; exit 2; }
  [ "$v" -ne "${rph_list[0]}" ] && uneven=1
done
# JSON: the count, or the list as a string for an uneven layout.
if [ $uneven = 1 ]; then rph_json="\"$rph\""; else rph=${rph_list[0]}; rph_json=$rph; fi
# The op's gradwire-perf subcommand is its name; its algorithm knob, its busbw factor (nccl-tests)
# and the link bound's share of the buffer that crosses each host's link in a hierarchical
# schedule: allreduce 2(H-1)/H, allgather and reduce_scatter (H-1)/H, broadcast the whole of it.
case "$op" in
  allreduce) algo_knob=GW_ALGO; busbw_formula="2(n-1)/n"; redop=" sum" ;;
  broadcast) algo_knob=GW_ALGO_BROADCAST; busbw_formula="1"; redop=", root 0" ;;
  allgather) algo_knob=GW_ALGO_ALLGATHER; busbw_formula="(n-1)/n"; redop="" ;;
  reduce_scatter) algo_knob=GW_ALGO_REDUCE_SCATTER; busbw_formula="(n-1)/n"; redop=" sum" ;;
  *) echo "cluster_bench: --op '$op': one of allreduce, broadcast, allgather, reduce_scatter" >&2
     exit 2 ;;
esac
if [ "$op" != allreduce ] && [ ${#codecs[@]} -gt 0 ]; then
  echo "cluster_bench: --codec measures the compressed allreduce (gw_allreduce_compressed);" \
    "there is none for --op $op: drop --codec ${codecs[*]}" >&2
  exit 2
fi
for s in $systems; do
  case "$s" in
    gradwire-flat|gradwire-auto|gradwire-hier|gradwire-daemon|gradwire-daemon-copy) ;;
    gradwire-algo:?*|gloo|mpi-tuned|mpi-han) ;;
    *) echo "cluster_bench: unknown system '$s'" >&2; exit 2 ;; esac
done
source "$here/sizes.sh"  # to_bytes()
source "$here/link_ceiling.sh"  # ceiling_best()
world=0
for v in "${rph_list[@]}"; do world=$((world + v)); done
# Whole elements, and for allgather / reduce_scatter whole blocks of n elements, so that every
# system (each would round on its own) runs exactly the size of the row.
unit=4
[ "$op" = allgather ] || [ "$op" = reduce_scatter ] && unit=$((4 * world))
byte_sizes=""
for s in $sizes; do
  b=$(to_bytes "$s"); r=$((b / unit * unit))
  [ "$r" -gt 0 ] || { echo "cluster_bench: size '$s': $op on $world ranks needs at least $unit bytes" >&2; exit 2; }
  [ "$r" -ne "$b" ] && echo "# cluster_bench: size $s ($b B) rounded down to $r B (a multiple of $unit)"
  byte_sizes+=" $r "
done
testbed="$root/tests/testbed/testbed.sh"
perf="$build/perf/gradwire-perf"
[ -x "$perf" ] || { echo "cluster_bench: $perf not found; build first (scripts/build.sh release)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "cluster_bench: needs root (network namespaces)" >&2; exit 77; }
rate_arg=(-r "$rate"); [ "$rate" = none ] && rate_arg=()
# The shaped rate in bits per second (none: unshaped, no link bound).
rate_bps=""
case "$rate" in *gbit) rate_bps=$(( ${rate%gbit} * 1000000000 )) ;; *mbit) rate_bps=$(( ${rate%mbit} * 1000000 )) ;; esac

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Ctrl-C or SIGTERM: the run in progress (a background subshell, so the signal is not held until
# it ends) gets SIGTERM and stops its testbed session, daemons and namespaces included.
run_pid=""
on_signal() {
  trap - INT TERM
  if [ -n "$run_pid" ]; then kill -TERM "$run_pid" 2>/dev/null; wait "$run_pid"; fi
  echo "# cluster_bench: interrupted" >&2
  exit 130
}
trap on_signal INT TERM

# Which systems can run here, and why not.
declare -A missing
if ! /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null; then
  missing[gloo]="/usr/bin/python3 with torch missing (apt-get install python3-torch)"
elif [[ " $systems " == *" gloo "* ]] && [ "$op" != allreduce ] &&
     ! why=$(cd "$work" && /usr/bin/python3 "$here/peers/gloo_allreduce.py" --probe "$op" 2>"$work/probe.log"); then
  # Debian's torch 1.13: Gloo has all_gather but no reduce_scatter in any form.
  missing[gloo]="${why:-gloo_allreduce.py --probe $op failed: $(tail -c 200 "$work/probe.log")}"
fi
mpi_bin="$work/mpi_allreduce"
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
  missing[mpi-tuned]="mpicc/mpirun missing (apt-get install openmpi-bin libopenmpi-dev)"
elif ! mpicc -O2 -o "$mpi_bin" "$here/peers/mpi_allreduce.c" 2>"$work/mpicc.log"; then
  missing[mpi-tuned]="mpicc failed: $(head -c 200 "$work/mpicc.log")"
fi
[ -n "${missing[mpi-tuned]:-}" ] && missing[mpi-han]="${missing[mpi-tuned]}"
# hier applies only across hosts, so a one-host run cannot probe it: ask the build's help of the
# op's algorithm knob.
# On uneven hosts the allreduce's hierarchical form is the leader one (hier needs equal hosts);
# the other collectives have none there.
hier_algo=hier
if [ $uneven = 1 ]; then
  if [ "$op" = allreduce ]; then
    hier_algo=hier_leader
  else
    missing[gradwire-hier]="$op has no hierarchical form on uneven hosts ($rph)"
  fi
fi
if ! "$perf" --dump-config 2>/dev/null | grep "^$algo_knob " | grep -qw "$hier_algo"; then
  missing[gradwire-hier]="this build's $algo_knob has no $hier_algo (gradwire-perf --dump-config)"
fi
gwd="$build/daemon/gradwired"; gwctl="$build/daemon/gradwirectl"
if [ ! -x "$gwd" ] || [ ! -x "$gwctl" ]; then
  missing[gradwire-daemon]="$gwd or $gwctl not built"
  missing[gradwire-daemon-copy]="${missing[gradwire-daemon]}"
fi
for c in "${codecs[@]}"; do systems+=" gradwire-$c"; done

iters_gw=(); iters_peer=()
[ "$iters" -gt 0 ] && { iters_gw=(-n "$iters"); iters_peer=(-n "$iters"); }

# run_testbed ARGS... : tests/testbed/testbed.sh ARGS, its output in $out; returns its status. It
# runs in the background and is waited for, so that a signal reaches it (run_one's trap): the
# testbed then stops its services (the daemons) and removes its namespaces.
tb_pid=""
run_testbed() {
  bash "$testbed" "$@" >"$work/tb.out" 2>&1 &
  tb_pid=$!
  wait "$tb_pid"
  local rc=$?
  tb_pid=""
  out=$(cat "$work/tb.out")
  return $rc
}

# run_one SYSTEM BYTES -> "time_us busbw" on stdout, or nothing (reason in $work/err). Runs in a
# background subshell (see the main loop): SIGTERM stops its testbed session first.
run_one() {
  # INT too: Ctrl-C reaches this subshell as well as the script (where it may not be ignored).
  trap 'trap - INT TERM; [ -n "$tb_pid" ] && { kill -TERM "$tb_pid" 2>/dev/null; wait "$tb_pid"; }; exit 143' INT TERM
  local sys="$1" s="$2" cmd line
  case "$sys" in
    gradwire-flat|gradwire-auto|gradwire-hier|gradwire-algo:*)
      local algo=auto env="" force=""
      [ "$sys" = gradwire-flat ] && algo=ring
      [ "$sys" = gradwire-hier ] && algo=$hier_algo
      [[ "$sys" == gradwire-algo:* ]] && algo=${sys#gradwire-algo:}
      # --algo sets GW_ALGO, the allreduce's; the other collectives have knobs of their own.
      if [ "$op" = allreduce ]; then force="--algo $algo"; else env="$algo_knob=$algo"; fi
      cmd="$env $perf $op -b $s -e $s ${iters_gw[*]} --check --cpu $force"
      run_testbed -n "$hosts" -R "$rph" "${rate_arg[@]}" -t "$timeout_s" -- "$cmd" ||
        { echo "$out" | tail -20 >"$work/err"; return; }
      perf_row "$s" ;;
    gradwire-daemon|gradwire-daemon-copy)
      # One gradwired per testbed host (a testbed service: ready when gradwirectl gets an answer,
      # stopped with SIGTERM after the ranks, also when they fail); the host identity is the one
      # its ranks report (GW_HOSTID). The arena holds both buffers of the size (--mem-alloc) or
      # their copies, plus room for the tool's own small calls. Sizes are whole buffers, so 2 x size
      # covers every op: allreduce and broadcast have two of it, allgather and reduce_scatter one
      # of it (the gathered output / the scattered input) and one of size/n.
      local mem=--mem-alloc sockdir arena rc
      [ "$sys" = gradwire-daemon-copy ] && mem=""
      sockdir=$(mktemp -d "$work/daemons.XXXXXX")
      arena=$(( 2 * s + (64 << 20) ))
      local sock="$sockdir/h\$TB_HOST.sock" hostid="gwtb\${TB_ID}h\$TB_HOST"
      cmd="GW_DAEMON=unix:$sock GW_HOSTID=$hostid GW_DAEMON_ARENA=$arena \
        $perf $op -b $s -e $s ${iters_gw[*]} --check --cpu $mem"
      run_testbed -n "$hosts" -R "$rph" "${rate_arg[@]}" -t "$timeout_s" \
        -S "GW_DAEMON_MAX_ARENA=$arena exec $gwd --foreground --socket $sock --host-id $hostid" \
        -W "$gwctl status --socket $sock --timeout-ms 2000" -- "$cmd"
      rc=$?
      rm -rf "$sockdir"
      [ $rc -eq 0 ] || { echo "$out" | tail -20 >"$work/err"; return; }
      perf_row "$s" ;;
    gradwire-*)
      local spec="${sys#gradwire-}"
      cmd="$perf allreduce --codec $spec -b $s -e $s ${iters_gw[*]}"
      run_testbed -n "$hosts" -R "$rph" "${rate_arg[@]}" -t "$timeout_s" -- "$cmd" ||
        { echo "$out" | tail -20 >"$work/err"; return; }
      # Only rank 0 of the launcher's job prints a table; a table from another rank means each
      # process ran a job of its own instead of joining the launcher's.
      if grep -q '^\[h[0-9]*r[1-9][0-9]*\] # gradwire-perf allreduce --codec' <<<"$out" ||
         ! grep -q "^\[h0r0\] # gradwire-perf allreduce --codec: $world ranks" <<<"$out"; then
        echo "gradwire-perf --codec did not run as the launcher's $world ranks" >"$work/err"
        return
      fi
      # [h0r0]   codec size count iters time_us algbw busbw bytes_sent speedup
      sed -n 's/^\[h0r0\] *//p' <<<"$out" | awk -v c="$spec" -v s="$s" '$1 == c && $2 == s { print $5, $7; exit }' ;;
    gloo)
      cmd="GLOO_SOCKET_IFNAME=d0 /usr/bin/python3 $here/peers/gloo_allreduce.py --op $op ${iters_peer[*]} $s"
      run_testbed -n "$hosts" -R "$rph" "${rate_arg[@]}" -t "$timeout_s" -- "$cmd" ||
        { echo "$out" | tail -20 >"$work/err"; return; }
      parse_peer "$out" ;;
    mpi-tuned|mpi-han)
      local coll=(--mca coll_han_priority 0)
      [ "$sys" = mpi-han ] && coll=(--mca coll_han_priority 100)
      local hostlist="" h
      for ((h = 0; h < hosts; h++)); do hostlist+="gwtb\${TB_ID}h$h:${rph_list[$h]},"; done
      cmd="if [ \$TB_HOST = 0 ]; then mpirun --allow-run-as-root --oversubscribe -np $world \
        --host ${hostlist%,} --mca plm_rsh_agent $here/peers/netns_rsh.sh --mca plm_rsh_no_tree_spawn 1 \
        --mca oob_tcp_if_include c0 --mca btl tcp,vader,self --mca btl_tcp_if_include d0 ${coll[*]} \
        $mpi_bin -o $op ${iters_peer[*]} $s; fi"
      run_testbed -n "$hosts" "${rate_arg[@]}" -t "$timeout_s" -- "$cmd" ||
        { echo "$out" | tail -20 >"$work/err"; return; }
      parse_peer "$out" ;;
  esac
}
# perf_row BYTES: gradwire-perf's row of BYTES in $out -> "time_us busbw cpu_s_per_GB" (cpu: the
# "# cpu:" line's machine figure, "-" without one), or nothing (reason in $work/err).
perf_row() {
  local line cpu
  # [h0r0]  size count type redop root time_us algbw busbw wrong (nccl-tests' columns)
  line=$(sed -n 's/^\[h0r0\] *//p' <<<"$out" | awk -v s="$1" '$1 == s && NF >= 13 { print; exit }')
  [ -n "$line" ] || { echo "$out" | tail -20 >"$work/err"; return; }
  cpu=$(sed -n "s/^\[h0r0\] *# cpu: bytes=$1 machine_cpu_s_per_gb=\([0-9.]*\) .*/\1/p" <<<"$out" | head -1)
  awk -v c="${cpu:--}" '$9 != 0 { exit 1 } { print $6, $8, c }' <<<"$line" ||
    echo "wrong elements: $line" >"$work/err"
}
parse_peer() {  # "... time_us=T busbw_GBps=B wrong=W [machine_cpu_s_per_gb=C]" -> "T B C|-"
  local line cpu
  line=$(grep -m1 -o 'time_us=[0-9.]* busbw_GBps=[0-9.]* wrong=[0-9]*' <<<"$1") ||
    { echo "$1" | tail -20 >"$work/err"; return; }
  if [ "${line##*wrong=}" != 0 ]; then echo "wrong elements: $line" >"$work/err"; return; fi
  cpu=$(grep -m1 -o 'machine_cpu_s_per_gb=[0-9.]*' <<<"$1" | cut -d= -f2)
  sed "s/time_us=\([0-9.]*\) busbw_GBps=\([0-9.]*\).*/\1 \2 ${cpu:--}/" <<<"$line"
}

declare -A times busbws cpus
failures=0
echo "# cluster_bench: $op, $hosts hosts x $rph ranks, links $rate, float32$redop, sizes:$byte_sizes B, $reps repetitions (interleaved), medians"
echo "# gradwire: $perf"
for sys in $systems; do [ -n "${missing[$sys]:-}" ] && echo "# $sys: missing: ${missing[$sys]}"; done
# The machine's own ceiling over the same links, before the systems: plain TCP, every host sending
# to the next while receiving, all at once (perf/link_ceiling.py), twice with 1 and twice with 4
# connections per link; the fastest of the four (a ceiling: the best plain TCP did), by its
# slowest host, gives the rate. A quarter of a second of the link's rate (16-256 MiB; 256 MiB
# unshaped). Its rows below: the link bound's bytes at that rate.
ceil_bps=""
if [ "$hosts" -gt 1 ]; then
  ceil_bytes=$((256 << 20))
  if [ -n "$rate_bps" ]; then
    ceil_bytes=$(( rate_bps / 32 ))
    [ "$ceil_bytes" -le $((256 << 20)) ] || ceil_bytes=$((256 << 20))
    [ "$ceil_bytes" -ge $((16 << 20)) ] || ceil_bytes=$((16 << 20))
  fi
  best="" best_streams=""
  for streams in 1 4 1 4; do
    run_testbed -n "$hosts" "${rate_arg[@]}" -t "$timeout_s" -- "exec /usr/bin/python3 \
$here/link_ceiling.py --hosts $hosts --bytes $ceil_bytes --streams $streams --port \$((TB_PORT + 7))" ||
      continue
    secs=$(ceiling_best "$out" "$hosts" "$best")
    [ "$secs" = "$best" ] || best=$secs best_streams=$streams
  done
  if [ -n "$best" ]; then
    ceil_bps=$(awk -v b="$ceil_bytes" -v s="$best" 'BEGIN { printf "%.0f", b * 8 / s }')
    echo "# machine ceiling, same run: plain TCP over the links, every host sending and receiving" \
      "$ceil_bytes B at once, $best_streams connection(s) per link (the best of 2 tries with 1 and 2 with 4):" \
      "$(awk -v r="$ceil_bps" 'BEGIN { printf "%.3f", r / 1e9 }') Gbit/s per host (tc rate $rate)"
  else
    echo "# machine ceiling: the plain TCP runs failed: $(tail -3 <<<"$out" | tr '\n' ' ')" >&2
  fi
fi
for ((rep = 1; rep <= reps; rep++)); do
  for s in $byte_sizes; do
    for sys in $systems; do
      [ -n "${missing[$sys]:-}" ] && continue
      : >"$work/err"
      run_one "$sys" "$s" >"$work/v" &
      run_pid=$!
      wait "$run_pid"
      run_pid=""
      v=$(cat "$work/v")
      if [ -z "$v" ]; then
        echo "# rep $rep: $sys bytes=$s FAILED: $(tr '\n' ' ' <"$work/err" | tail -c 400)" >&2
        failures=$((failures + 1))
        continue
      fi
      read -r vt vb vc <<<"$v"
      times["$sys $s"]+="$vt "; busbws["$sys $s"]+="$vb "; cpus["$sys $s"]+="${vc:--} "
      echo "# rep $rep/$reps: $sys bytes=$s time_us=$vt busbw=$vb GB/s cpu=${vc:--} s/GB" >&2
    done
  done
done

median() {  # values... -> median, or "-" when none
  printf '%s\n' "$@" | grep -E '^[0-9.]+$' | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) printf "%.4f\n", v[(NR + 1) / 2]; else printf "%.4f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# Link bound of a hierarchical schedule: each host sends and receives 2(H-1)/H x bytes
# (allreduce), (H-1)/H x bytes (allgather, reduce_scatter), or bytes (broadcast, a chain of hosts).
echo "#"
case "$op" in
  allreduce) link_share="2(H-1)/H x bytes"; bytes_are="the buffer" ;;
  broadcast) link_share="bytes"; bytes_are="the buffer" ;;
  allgather) link_share="(H-1)/H x bytes"; bytes_are="the whole gathered output, bytes/n from each rank" ;;
  reduce_scatter) link_share="(H-1)/H x bytes"; bytes_are="the whole input, bytes/n kept by each rank" ;;
esac
echo "# $op busbw in GB/s (nccl-tests: bytes * $busbw_formula / time, n = $world ranks; bytes = $bytes_are); time in us"
[ -n "$rate_bps" ] && [ "$hosts" -gt 1 ] && echo "# link bound ($link_share / rate) given per size"
[ -n "$ceil_bps" ] && echo "# tcp ceiling: the same bytes at the plain TCP rate measured above"
echo "# cpu_s/GB: the whole machine's CPU time (/proc/stat: every rank, the kernel's network work)" \
  "per GB of the buffer in rank 0's timed iterations (gradwire-perf --cpu; the peers' drivers alike);" \
  "x $(awk -F: '/^cpu MHz/ { printf "%.2f", $2 / 1000; exit }' /proc/cpuinfo) GHz (nominal) =" \
  "cycles per byte; a figure of the run alone only on an otherwise idle machine"
printf "%-26s %12s %14s %10s %6s %10s\n" "#system" "bytes" "time_us" "busbw" "runs" "cpu_s/GB"
bound_row() {  # LABEL BITS_PER_S BYTES: the row of the op's link share of BYTES at that rate
  awk -v label="$1" -v r="$2" -v s="$3" -v h="$hosts" -v n="$world" -v op="$op" 'BEGIN {
    share = op == "allreduce" ? 2 * (h - 1) / h : op == "broadcast" ? 1 : (h - 1) / h
    f = op == "allreduce" ? 2 * (n - 1) / n : op == "broadcast" ? 1 : (n - 1) / n
    t = share * s * 8 / r; printf "%-26s %12d %14.1f %10.4f %6s %10s\n", label, s, t * 1e6, s * f / t / 1e9, "-", "-" }'
}
rows=()
for s in $byte_sizes; do
  [ -n "$rate_bps" ] && [ "$hosts" -gt 1 ] && bound_row "(link bound)" "$rate_bps" "$s"
  [ -n "$ceil_bps" ] && bound_row "(tcp ceiling)" "$ceil_bps" "$s"
  for sys in $systems; do
    [ -n "${missing[$sys]:-}" ] && { printf "%-26s %12s %14s %10s %6s %10s\n" "$sys" "$s" "missing" "-" 0 "-"; continue; }
    # shellcheck disable=SC2086
    t=$(median ${times["$sys $s"]:-}); b=$(median ${busbws["$sys $s"]:-}); c=$(median ${cpus["$sys $s"]:-})
    # shellcheck disable=SC2086
    n=$(wc -w <<<"${times["$sys $s"]:-}")
    [ "$t" != "-" ] && t=$(printf "%.1f" "$t")
    printf "%-26s %12s %14s %10s %6s %10s\n" "$sys" "$s" "$t" "$b" "$n" "$c"
    cj=null; [ "$c" != "-" ] && cj=$c
    [ "$t" != "-" ] && rows+=("{\"system\": \"$sys\", \"op\": \"$op\", \"hosts\": $hosts, \"ranks_per_host\": $rph_json, \"rate\": \"$rate\", \"bytes\": $s, \"time_us\": $t, \"busbw_gbps\": $b, \"runs\": $n, \"machine_cpu_s_per_gb\": $cj}")
  done
done
if [ -n "$json" ]; then
  { echo "["; for i in "${!rows[@]}"; do sep=","; [ "$i" -eq $((${#rows[@]} - 1)) ] && sep=""; echo "  ${rows[$i]}$sep"; done; echo "]"; } >"$json"
  echo "# wrote $json"
fi
if [ -n "$png" ] && [ -n "$json" ]; then
  /usr/bin/python3 - "$json" "$png" "$hosts x $rph ranks, $rate" "$op" "float32$redop" <<'PY' || echo "# --png: plotting failed (python3-matplotlib installed?)" >&2
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = json.load(open(sys.argv[1]))
fig, ax = plt.subplots(figsize=(7, 4.5))
for system in dict.fromkeys(r["system"] for r in rows):
    pts = sorted((r["bytes"], r["busbw_gbps"]) for r in rows if r["system"] == system)
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=system)
ax.set_xscale("log", base=2)
ax.set_xlabel(f"bytes ({sys.argv[5]}; nccl-tests sizes)")
ax.set_ylabel("busbw (GB/s)")
ax.set_title(f"{sys.argv[4]} on the namespace testbed: {sys.argv[3]}")
ax.grid(True, alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
PY
  [ -f "$png" ] && echo "# wrote $png"
elif [ -n "$png" ]; then
  echo "# --png needs --json FILE too" >&2
fi
[ "$failures" -eq 0 ] || { echo "# $failures run(s) failed" >&2; exit 1; }
