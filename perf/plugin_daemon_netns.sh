#!/usr/bin/env bash
# The NCCL plugin's daemon mode against its direct mode between two namespace hosts (issue 28's
# performance line), with the ceilings measured in the same run. One testbed session per link
# rate (tests/testbed/testbed.sh -n 2: two network namespaces joined by a bridge over their d0,
# one gradwired per host started as its service with GW_SOCKET_IFNAME=d0, ready when gradwirectl
# answers). In every session, for each of the N runs, in this order:
#   ceiling memcpy      host 0: one memcpy of SIZE (nccl_plugin_peer ceiling-memcpy)
#   ceiling tcp         one raw TCP connection, host 1 -> host 0 over d0 (tcp-source / tcp-sink)
#   direct              the plugin in each process, GW_PLUGIN_BACKEND=tcp over d0: host 0 listens
#                       and receives (bench-listen), host 1 connects and sends (bench-connect)
#   daemon              the same two processes with GW_DAEMON=unix:<their host's gradwired>:
#                       each end through its own host's daemon, the daemons' job over tcp on d0
#                       (GW_DAEMON_TRANSPORT=tcp)
# With -x dpdk both modes cross over DPDK instead: direct mode's ends each open net_af_xdp on
# their host's d0 (GW_PLUGIN_BACKEND=dpdk), daemon mode's daemons do (GW_DAEMON_TRANSPORT=dpdk;
# each brings its port up at its start); the veths' MTU is 3498 (one frame per 4 KiB umem
# chunk). A port is one process's, so each rate gets two testbed sessions, one after the other:
# the ceilings and direct mode without daemons, then daemon mode with them.
# What bench-listen/-connect do (tests/plugin/daemon_scenarios.h): 1 + TRANSFERS messages of SIZE
# host 1 -> host 0, each timed at the receiver from its 8-byte go token to the data's arrival
# (the first a warm-up; every one pattern-checked), then ROUNDS 8-byte ping-pongs timed by the
# sender; latency = round trip / 2 (one way), median of the rounds; connect ms: the connecting
# end's first connect call to its comm (daemon mode: both daemons' job meeting through the
# store, as for each connection NCCL opens). A run's GB/s is the median of
# its transfers; the table gives the median over the N runs.
#
# usage: perf/plugin_daemon_netns.sh [-B BUILD_DIR] [-r RATE]... [-x tcp|dpdk] [-n RUNS] [-s SIZE]
#                                    [-T TRANSFERS] [-l ROUNDS] [-t TIMEOUT_S] [-k]
#   -r RATE     a link rate to run at: "none" (unshaped veth) or tc's units (10gbit, 1gbit);
#               repeatable; default: none and 10gbit (two sessions)
#   -x XPORT    what crosses the link in both modes: tcp (default) or dpdk (AF_XDP on d0)
#   -n RUNS     runs of each row per rate (default 3)
#   -s SIZE     message size (default 64M; K, M, G)     -T TRANSFERS  timed messages (default 8)
#   -l ROUNDS   8-byte round trips (default 2000)       -t TIMEOUT_S  per session (default 600)
#   -k          keep the work directory (every process's output) and say where
# The lead's one command (needs root; 2 hosts as namespaces; build first:
# cmake --build build/release --target nccl_plugin_peer nccl-net-gradwire gradwired gradwirectl):
#   perf/plugin_daemon_netns.sh                  # unshaped and 10gbit, 3 runs each
#   perf/plugin_daemon_netns.sh -r 1gbit -n 3    # another rate
#   perf/plugin_daemon_netns.sh -x dpdk -r none  # both modes over DPDK (AF_XDP)
# Environment passed through: GW_SOCKET_NSOCKS (both modes' tcp sockets per connection; unset:
# the test harness's 2 for the plugin, auto for the daemons), GW_DAEMON_* of gradwired.
# Exit status: 0 when every run of every row completed with its data checked; 77 when the
# testbed cannot be built here (not root, no namespaces); 1 otherwise (the failing lines shown).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="$root/build/release"; rates=(); runs=3; size=64M; transfers=8; rounds=2000; timeout_s=600
keep=0; xport=tcp
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while getopts "B:r:x:n:s:T:l:t:kh" o; do
  case $o in
    B) build="$(cd "$OPTARG" && pwd)" || exit 2 ;;
    r) rates+=("$OPTARG") ;; x) xport=$OPTARG ;; n) runs=$OPTARG ;; s) size=$OPTARG ;; T) transfers=$OPTARG ;;
    l) rounds=$OPTARG ;; t) timeout_s=$OPTARG ;; k) keep=1 ;; h) usage 0 ;; *) usage ;;
  esac
done
[ ${#rates[@]} -gt 0 ] || rates=(none 10gbit)
[[ "$xport" = tcp || "$xport" = dpdk ]] ||
  { echo "plugin_daemon_netns: -x '$xport': expected tcp or dpdk" >&2; exit 2; }
mtu=9000; [ "$xport" = dpdk ] && mtu=3498
for v in "$runs" "$transfers" "$rounds" "$timeout_s"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "plugin_daemon_netns: '$v' is not a positive number" >&2; exit 2; }
done
[[ "$size" =~ ^[1-9][0-9]*[KMG]?$ ]] || { echo "plugin_daemon_netns: -s '$size': expected e.g. 64M" >&2; exit 2; }
for r in "${rates[@]}"; do
  [[ "$r" = none || "$r" =~ ^[1-9][0-9]*[gmk]bit$ ]] ||
    { echo "plugin_daemon_netns: -r '$r': expected none or e.g. 10gbit" >&2; exit 2; }
done
tb="$root/tests/testbed/testbed.sh"
peer="$build/tests/plugin/nccl_plugin_peer"; gwd="$build/daemon/gradwired"; gwctl="$build/daemon/gradwirectl"
for f in "$peer" "$gwd" "$gwctl"; do
  [ -x "$f" ] || { echo "plugin_daemon_netns: $f is not built (see the usage: -h)" >&2; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "plugin_daemon_netns: SKIP: needs root (network namespaces)" >&2; exit 77; }

work=$(mktemp -d /tmp/gw-plugin-netns-XXXXXX)
tb_pid=""
if [ "$keep" = 1 ]; then trap 'echo "plugin_daemon_netns: outputs kept in $work" >&2' EXIT
else trap 'rm -rf "$work"' EXIT; fi
trap 'trap - INT TERM; [ -n "$tb_pid" ] && { kill -TERM "$tb_pid" 2>/dev/null; wait "$tb_pid"; }; exit 130' INT TERM

# What each host runs: the rows of every run in the same order on both hosts; the handle and
# port files (in the shared work directory) pair each row's two ends, and every wait for one is
# bounded (60 s) by the peer program. A row that fails is recorded and the host goes on to the
# next, so the other host is never left waiting for the rest of the session.
cat >"$work/host.sh" <<'EOF'
set -u
export GW_SOCKET_IFNAME=d0 GW_TIMEOUT_MS=20000 GW_PLUGIN_BACKEND=$XPORT GW_LOG_LEVEL=warn
unset GW_DAEMON NCCL_SOCKET_IFNAME
# Over dpdk, direct mode's end opens this host's d0 (no daemon runs in its session).
[ "$XPORT" = dpdk ] && export GW_DPDK_IP="$TB_IP" \
  GW_DPDK_EAL_ARGS="-l 0 $TB_EAL_MEM --no-pci --no-telemetry --log-level=*:error --vdev net_af_xdp0,iface=$TB_IFACE"
# Daemon mode's store (the plugin's rendezvous, which the daemons' job meets through too): over
# d0, but over the control net c0 with dpdk, whose daemons' ports take d0 from the kernel (an
# AF_XDP port's XDP program hands the XSK every frame of its queue, ARP included).
store_if=d0; [ "$XPORT" = dpdk ] && store_if=c0
me="$OUT/h$TB_HOST"
has() { [[ " $ROWS " == *" $1 "* ]]; }  # whether this session runs row kind $1
row() {  # row NAME CMD...: the row's one output line to $me.NAME, its log beside it
  local name=$1; shift
  if "$@" >"$me.$name" 2>"$me.$name.log"; then return 0; fi
  echo "host $TB_HOST: $name failed (status $?): $(tail -n 3 "$me.$name.log" | tr '\n' ' ')" >&2
  echo "FAILED" >>"$me.$name"
}
for i in $(seq 1 "$RUNS"); do
  f="$OUT/files/$i"
  if [ "$TB_HOST" = 0 ]; then
    has ceil && row "$i.memcpy" "$PEER" ceiling-memcpy "$SIZE" "$TRANSFERS"
    has ceil && row "$i.tcp" "$PEER" tcp-sink "$f.tcp" "$SIZE" "$TRANSFERS"
    has direct && row "$i.direct" "$PEER" bench-listen "$f.direct" "$SIZE" "$TRANSFERS" "$ROUNDS"
    has daemon && row "$i.daemon" env -u GW_DPDK_EAL_ARGS GW_SOCKET_IFNAME=$store_if GW_DAEMON="unix:$SOCKDIR/h0.sock" \
      "$PEER" bench-listen "$f.daemon" "$SIZE" "$TRANSFERS" "$ROUNDS"
  else
    has ceil && row "$i.tcp" "$PEER" tcp-source 10.77.0.1 "$f.tcp" "$SIZE" "$TRANSFERS"
    has direct && row "$i.direct" "$PEER" bench-connect "$f.direct" "$SIZE" "$TRANSFERS" "$ROUNDS"
    has daemon && row "$i.daemon" env -u GW_DPDK_EAL_ARGS GW_SOCKET_IFNAME=$store_if GW_DAEMON="unix:$SOCKDIR/h1.sock" \
      "$PEER" bench-connect "$f.daemon" "$SIZE" "$TRANSFERS" "$ROUNDS"
  fi
done
exit 0
EOF

# The testbed's service: this host's gradwired (over dpdk with its port on d0, up at its start).
cat >"$work/svc.sh" <<'EOF'
[ "$XPORT" = dpdk ] && export GW_DPDK_IP="$TB_IP" \
  GW_DPDK_EAL_ARGS="-l 0 $TB_EAL_MEM --no-pci --no-telemetry --log-level=*:error --vdev net_af_xdp0,iface=$TB_IFACE"
exec "$GWD" --foreground --socket "$SOCKDIR/h$TB_HOST.sock"
EOF

# field FILE KEY: KEY's value in the one line of FILE ("" when absent).
field() { sed -n "s/.* $2=\([^ ]*\).*/\1/p" "$1" 2>/dev/null | head -1; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print ""; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
bad=0
say() { echo "plugin_daemon_netns: $*"; }

tb_session() {  # tb_session RATE DIR ROWS LOG [daemons]: one testbed session running ROWS
  local rate=$1 dir=$2 rows=$3 log=$4 daemons=${5:-} rc
  local shape=(); [ "$rate" != none ] && shape=(-r "$rate")
  local svc=()
  [ -n "$daemons" ] && svc=(-S "exec bash $work/svc.sh"
    -W "$gwctl status --socket $dir/sock/h\$TB_HOST.sock --timeout-ms 2000")
  OUT="$dir" SOCKDIR="$dir/sock" PEER="$peer" GWD="$gwd" XPORT="$xport" ROWS="$rows" \
    RUNS="$runs" SIZE="$size" TRANSFERS="$transfers" ROUNDS="$rounds" \
    GW_DAEMON_TRANSPORT="$xport" GW_LOG_LEVEL=info \
    bash "$tb" -n 2 -m "$mtu" "${shape[@]}" -t "$timeout_s" "${svc[@]}" -- "bash $work/host.sh" \
      >"$log" 2>&1 &
  tb_pid=$!
  wait "$tb_pid"; rc=$?
  tb_pid=""
  if [ $rc -eq 77 ]; then
    cat "$log" >&2; say "SKIP: the testbed cannot be built here"; exit 77
  fi
  if [ $rc -ne 0 ]; then
    grep -v '^\[h[0-9]s\]' "$log" | tail -n 30 >&2
    say "the session at rate $rate ($rows) ended with status $rc"; bad=1
  fi
  grep -h 'failed (status' "$log" >&2 && bad=1
}

session() {  # session RATE: the rate's testbed session(s), its table
  local rate=$1 dir="$work/$1"
  mkdir -p "$dir/files" "$dir/sock"
  if [ "$xport" = dpdk ]; then  # a port is one process's: direct mode without the daemons
    tb_session "$rate" "$dir" "ceil direct" "$dir/log.direct"
    tb_session "$rate" "$dir" "daemon" "$dir/log" daemons
  else
    tb_session "$rate" "$dir" "ceil direct daemon" "$dir/log" daemons
  fi
  # Every daemon-mode connection (two per run: the data's and the one back) was a job of both
  # hosts' daemons, which met over tcp (their INFO lines, GW_LOG_LEVEL=info).
  local h n
  for h in 0 1; do
    n=$(grep -c "^\[h${h}s\].*gradwired: job of 2 ranks (host [01] of 2): offered $xport;" "$dir/log")
    if [ "$n" -lt $((2 * runs)) ]; then
      say "rate $rate: host $h's daemon saw $n two-host jobs over $xport, expected $((2 * runs))"; bad=1
    fi
  done

  local link="unshaped veth (MTU $mtu)"
  [ "$rate" != none ] && link="tc tbf $rate both ways on each host's d0"
  echo
  echo "## 2 namespace hosts, link: $link; $size x $transfers transfers (median of each run)," \
       "$rounds 8-byte round trips; $runs runs"
  grep -m1 -h 'INFO NET/gradwire: backend' "$dir"/h0.1.direct.log 2>/dev/null | sed 's/^ *//' 
  echo
  echo "| run | memcpy GB/s | one TCP conn. GB/s | direct GB/s | daemon GB/s | direct us (one-way) | daemon us (one-way) |"
  echo "|---|---|---|---|---|---|---|"
  local i want=$((transfers + 1)) m
  for i in $(seq 1 "$runs"); do
    for m in direct daemon; do
      # Both ends completed, and the receiver checked every message.
      if [ "$(field "$dir/h0.$i.$m" checked)" != "$want" ] || [ -z "$(field "$dir/h1.$i.$m" rtt_us_median)" ]; then
        say "run $i, $m mode at $rate: not completed with every message checked:" \
          "$(cat "$dir/h0.$i.$m" "$dir/h1.$i.$m" 2>/dev/null | tr '\n' ' ')"
        bad=1
      fi
    done
    echo "| $i | $(field "$dir/h0.$i.memcpy" gbps_median) | $(field "$dir/h0.$i.tcp" gbps_median)" \
         "| $(field "$dir/h0.$i.direct" gbps_median) | $(field "$dir/h0.$i.daemon" gbps_median)" \
         "| $(field "$dir/h1.$i.direct" oneway_us) | $(field "$dir/h1.$i.daemon" oneway_us) |"
  done
  med() {  # med HOST ROW KEY: the median over the runs
    for i in $(seq 1 "$runs"); do field "$dir/$1.$i.$2" "$3"; done | grep . | median
  }
  local mc tcp dg ag dl al dc ac rate_gbs pct added
  mc=$(med h0 memcpy gbps_median); tcp=$(med h0 tcp gbps_median)
  dg=$(med h0 direct gbps_median); ag=$(med h0 daemon gbps_median)
  dl=$(med h1 direct oneway_us); al=$(med h1 daemon oneway_us)
  dc=$(med h1 direct connect_ms); ac=$(med h1 daemon connect_ms)
  rate_gbs="no rate (veth)"
  if [ "$rate" != none ]; then
    rate_gbs=$(awk -v r="$rate" 'BEGIN { n = r + 0; u = substr(r, length(n "") + 1);
      m = u == "gbit" ? 1e9 : u == "mbit" ? 1e6 : 1e3; printf "%.3f", n * m / 8 / 1e9 }')
  fi
  pct=$(awk -v a="$ag" -v d="$dg" 'BEGIN { if (d > 0 && a != "") printf "%.0f %%", 100 * a / d }')
  added=$(awk -v a="$al" -v d="$dl" 'BEGIN { if (a != "" && d != "") printf "%+.1f", a - d }')
  echo
  echo "| mode (rate $rate) | $size GB/s (median of $runs) | % of direct | 8-byte latency us (one-way, median) | us added | connect ms (median) |"
  echo "|---|---|---|---|---|---|"
  echo "| ceiling: memcpy | $mc | | | | |"
  echo "| ceiling: one TCP connection over d0 | $tcp | | | | |"
  echo "| ceiling: link rate | $rate_gbs | | | | |"
  echo "| direct (plugin $xport over d0) | $dg | 100 % | $dl | 0 | $dc |"
  echo "| daemon (each end through its host's gradwired, $xport between them) | $ag | $pct | $al | $added | $ac |"
}

say "$(date -u +%FT%TZ), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); rates: ${rates[*]}"
for r in "${rates[@]}"; do session "$r"; done
echo
if [ $bad -ne 0 ]; then say "FAILED (lines above)"; exit 1; fi
say "ok: direct and daemon mode, $runs run(s) at each rate, every message checked"
