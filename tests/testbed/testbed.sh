#!/bin/bash
# Network-namespace testbed: N "hosts" (network namespaces), each with a data interface d0
# (veth to the bridge gwbd<id>, MTU 9000, 10.77.0.<i+1>/24) for DPDK or kernel TCP, and a control
# interface c0 (veth to bridge gwbc<id>, 10.79.0.<i+1>/24) for the rendezvous store, so binding
# DPDK (AF_XDP takes every frame of d0) never cuts the store off. The bridges live in a "switch"
# namespace of their own, where bridged frames skip the host firewall (bridge-nf-call-*tables
# = 0 there only; the machine's settings are untouched): a switch, not a filtering host.
#
#   testbed.sh [-n HOSTS] [-R RANKS_PER_HOST] [-r RATE] [-m MTU] [-q QUEUES] [-t TIMEOUT_S]
#              [-H HUGEPAGES] [-c PCAP] [-S SERVICE -W READY] -- COMMAND...
#
# COMMAND runs in every host at once (bash -c), with TB_HOST (0..N-1), TB_HOSTS, TB_IFACE (d0),
# TB_IP, TB_CTL_IP, TB_STORE (10.79.0.1), TB_ID and TB_EAL_MEM (the EAL memory flags: hugepages
# when -H reserved them, else --no-huge) in its environment; host i's output goes to stderr
# prefixed with [h<i>]. -c writes a capture of the bridge's data traffic (tshark/dumpcap) to PCAP.
#
# -R R starts COMMAND R times in every host instead, as the ranks of one job of HOSTS*R ranks
# (host-major: host i holds ranks i*R .. i*R+R-1), each with the launcher environment gradwire
# and torchrun programs read: GW_RANK, GW_WORLD_SIZE, GW_STORE (rank 0's host, on the control
# network, port TB_PORT), RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
# MASTER_PORT, plus GW_SOCKET_IFNAME=d0 so that tcp between hosts crosses the data link; the
# ranks of one host share its namespace (shm works among them). Rank r's output is prefixed
# [h<i>r<r>]. -R also takes one count per host, comma-separated, for uneven layouts: -n 2 -R 3,1
# puts ranks 0-2 on host 0 and rank 3 on host 1. -r RATE shapes every host's data link to RATE (tc's units: 1gbit, 100mbit, ...)
# in both directions with a token bucket (tc tbf on the host's d0 and on its port of the
# bridge); the control network is never shaped. TB_RATE holds RATE ("" when unshaped).
# -q QUEUES gives every data link QUEUES receive and transmit queues at both ends (default 1): the
# bridge then spreads a host's incoming frames over d0's queues by its hash of each flow, as a
# multi-queue NIC's RSS does (what an AF_XDP port on one queue meets on a real host).
# -S SERVICE starts SERVICE (bash -c) once in every host before COMMAND, a per-host daemon such as
# gradwired, with the host's TB_* environment and GW_SOCKET_IFNAME=d0; its output is prefixed
# [h<i>s]. COMMAND starts only once READY (-W, bash -c, in the host with the same environment)
# has succeeded in every host, retried every 0.1 s within -t's deadline while the service runs.
# When COMMAND has ended (or failed, or the session is interrupted) every service gets SIGTERM on
# its process group, then SIGKILL after TB_SERVICE_STOP_S (10) seconds. A service that exits
# before it is stopped, exits with a status other than 0 or 143 when stopped, or needs the
# SIGKILL fails the session (status 1 when COMMAND succeeded), saying which host's.
# Exit status: 0 when every host exits 0; 77 when the testbed cannot be built here (not root,
# no ip/netns support); else the first failing host's status. Everything created (namespaces,
# links, bridges, hugepage reservation and files) is removed on exit, whatever happened short of
# SIGKILL; the namespaces of a session that was killed with SIGKILL are removed by the next one.
set -u
N=2; MTU=9000; QUEUES=1; TIMEOUT=120; HUGE=0; PCAP=""; RPH=0; RPH_LIST=0; RATE=""; SERVICE=""; READY=""
usage="usage: $0 [-n hosts] [-R ranks_per_host] [-r rate] [-m mtu] [-q queues] [-t timeout_s] [-H hugepages] [-c pcap] [-S service -W ready] -- cmd"
while getopts "n:R:r:m:q:t:H:c:S:W:" o; do
  case $o in
    n) N=$OPTARG ;; m) MTU=$OPTARG ;; q) QUEUES=$OPTARG ;; t) TIMEOUT=$OPTARG ;; H) HUGE=$OPTARG ;; c) PCAP=$OPTARG ;;
    R) RPH_LIST=$OPTARG ;; r) RATE=$OPTARG ;; S) SERVICE=$OPTARG ;; W) READY=$OPTARG ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
if { [ -n "$SERVICE" ] && [ -z "$READY" ]; } || { [ -z "$SERVICE" ] && [ -n "$READY" ]; }; then
  echo "testbed: -S and -W go together (a service and its readiness check); $usage" >&2; exit 2
fi
SVC_STOP_S=${TB_SERVICE_STOP_S:-10}
[[ "$SVC_STOP_S" =~ ^[0-9]+$ ]] || { echo "testbed: TB_SERVICE_STOP_S '$SVC_STOP_S' is not a number" >&2; exit 2; }
for v in "$N" "$MTU" "$QUEUES" "$TIMEOUT" "$HUGE"; do
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "testbed: '$v' is not a number; $usage" >&2; exit 2; }
done
[ "$N" -ge 1 ] && [ "$N" -le 200 ] || { echo "testbed: -n $N: need 1..200 hosts" >&2; exit 2; }
[ "$QUEUES" -ge 1 ] && [ "$QUEUES" -le 64 ] || { echo "testbed: -q $QUEUES: need 1..64 queues" >&2; exit 2; }
# Ranks per host: RPHS[i] for host i (all equal unless -R listed them), RANK0[i] its first rank.
IFS=, read -r -a RPHS <<<"$RPH_LIST"
for v in "${RPHS[@]}"; do
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "testbed: -R '$RPH_LIST' is not a count or a list; $usage" >&2; exit 2; }
  [ "$v" -le 64 ] || { echo "testbed: -R $v: at most 64 ranks per host" >&2; exit 2; }
done
if [ "${#RPHS[@]}" -eq 1 ]; then
  RPHS=(); for _ in $(seq 1 "$N"); do RPHS+=("$RPH_LIST"); done
elif [ "${#RPHS[@]}" -ne "$N" ]; then
  echo "testbed: -R $RPH_LIST lists ${#RPHS[@]} hosts, -n says $N" >&2; exit 2
fi
WORLD=0; RANK0=()
for v in "${RPHS[@]}"; do RANK0+=("$WORLD"); WORLD=$((WORLD + v)); done
RPH=$WORLD  # non-zero: launch ranks
if [ "$RPH" -gt 0 ]; then
  for v in "${RPHS[@]}"; do
    [ "$v" -ge 1 ] || { echo "testbed: -R $RPH_LIST: every host needs a rank" >&2; exit 2; }
  done
fi
# tbf wants a rate tc understands; refuse a typo before building anything.
rate_bits=""
if [ -n "$RATE" ]; then
  case "$RATE" in
    *[0-9]gbit) rate_bits=$(( ${RATE%gbit} * 1000000000 )) ;;
    *[0-9]mbit) rate_bits=$(( ${RATE%mbit} * 1000000 )) ;;
    *[0-9]kbit) rate_bits=$(( ${RATE%kbit} * 1000 )) ;;
    *) echo "testbed: -r $RATE: expected <integer>gbit, mbit or kbit (e.g. 1gbit)" >&2; exit 2 ;;
  esac
  [[ "${RATE%?bit}" =~ ^[1-9][0-9]*$ ]] || { echo "testbed: -r $RATE: expected an integer rate" >&2; exit 2; }
fi
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift
[ $# -ge 1 ] || { echo "testbed: no command" >&2; exit 2; }
CMD="$*"

if [ "$(id -u)" != 0 ]; then echo "testbed: SKIP: needs root (network namespaces)" >&2; exit 77; fi
command -v ip >/dev/null || { echo "testbed: SKIP: iproute2 missing" >&2; exit 77; }

# Six digits of the PID name this session's namespaces and links (${ID: -6} was empty for a PID
# of fewer than six digits, so concurrent sessions collided on the same names).
ID=$(printf '%06d' $(($$ % 1000000)))
NS=(); PIDS=(); SVC_PIDS=(); CAP_PID=""; HUGE_OLD=""; SW=""
# stop_services: SIGTERM to every running service's process group, SIGKILL to those still there
# after SVC_STOP_S; prints one line per service that did not stop cleanly; status 1 if any.
stop_services() {
  local p i s killed bad=0 deadline=$((SECONDS + SVC_STOP_S))
  for p in "${SVC_PIDS[@]}"; do
    [ -n "$p" ] && { kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null; }
  done
  for i in "${!SVC_PIDS[@]}"; do
    p=${SVC_PIDS[$i]}; killed=0
    [ -n "$p" ] || continue  # already reaped (and reported)
    while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt "$deadline" ]; do sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then
      echo "testbed: the service on host $i did not stop within ${SVC_STOP_S}s of SIGTERM: killed" >&2
      kill -KILL -- "-$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; killed=1; bad=1
    fi
    wait "$p" 2>/dev/null; s=$?
    if [ "$s" -ne 0 ] && [ "$s" -ne 143 ] && [ "$killed" -eq 0 ]; then
      echo "testbed: the service on host $i exited with status $s when stopped" >&2; bad=1
    fi
  done
  SVC_PIDS=()
  return $bad
}
cleanup() {
  trap - EXIT INT TERM
  for p in "${PIDS[@]}"; do kill -KILL -- "-$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
  [ "${#SVC_PIDS[@]}" -gt 0 ] && stop_services
  [ -n "$CAP_PID" ] && { kill -INT "$CAP_PID" 2>/dev/null; sleep 0.5; kill -KILL "$CAP_PID" 2>/dev/null; }
  for ns in "${NS[@]}" "$SW"; do
    # Processes left inside the namespace (a host's own children) go with it.
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  for i in $(seq 0 $((N - 1))); do
    ip link del "gd${ID}h$i" 2>/dev/null; ip link del "gc${ID}h$i" 2>/dev/null
  done
  ip link del "gwbd$ID" 2>/dev/null; ip link del "gwbc$ID" 2>/dev/null
  rm -f /dev/hugepages/gwtb${ID}* 2>/dev/null
  [ -n "$HUGE_OLD" ] && echo "$HUGE_OLD" > /proc/sys/vm/nr_hugepages
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail_setup() { echo "testbed: SKIP: $1" >&2; exit 77; }
# A session killed with SIGKILL (its EXIT trap never ran) leaves its namespaces behind, and a
# later session or test would meet them. Remove a session's namespaces when its creator (the
# PID in its name) is gone, none of them holds a process and the newest is over a minute old.
reap_stale() {
  local id ns names pids newest t now
  now=$(date +%s)
  for id in $(ip netns list 2>/dev/null | sed -nE 's/^gwtb([0-9]{6})(sw|h[0-9]+)( .*)?$/\1/p' | sort -u); do
    [ "$id" = "$ID" ] && continue
    kill -0 "$((10#$id))" 2>/dev/null && continue
    names=$(ip netns list | sed -nE "s/^(gwtb${id}(sw|h[0-9]+))( .*)?$/\1/p")
    pids=""; newest=0
    for ns in $names; do
      pids+=$(ip netns pids "$ns" 2>/dev/null)
      t=$(stat -c %Y "/run/netns/$ns" 2>/dev/null || echo "$now"); [ "$t" -gt "$newest" ] && newest=$t
    done
    [ -z "$pids" ] && [ $((now - newest)) -ge "${TB_STALE_AGE_S:-60}" ] || continue
    for ns in $names; do ip netns del "$ns" 2>/dev/null; done
    rm -f /dev/hugepages/gwtb${id}* 2>/dev/null
    echo "testbed: removed the namespaces of session $id (its creator was killed):" $names >&2
  done
}
reap_stale
SW="gwtb${ID}sw"
ip netns add "$SW" || fail_setup "ip netns add failed"
ip netns exec "$SW" sysctl -qw net.bridge.bridge-nf-call-iptables=0 \
  net.bridge.bridge-nf-call-ip6tables=0 net.bridge.bridge-nf-call-arptables=0 >/dev/null 2>&1
ip -n "$SW" link add "gwbd$ID" type bridge 2>/dev/null || fail_setup "cannot create a bridge"
ip -n "$SW" link add "gwbc$ID" type bridge || fail_setup "cannot create a bridge"
ip -n "$SW" link set "gwbd$ID" mtu "$MTU" up; ip -n "$SW" link set "gwbc$ID" up
for i in $(seq 0 $((N - 1))); do
  ns="gwtb${ID}h$i"
  ip netns add "$ns" || fail_setup "ip netns add failed"
  NS+=("$ns")
  ip -n "$SW" link add "gd${ID}h$i" mtu "$MTU" numtxqueues "$QUEUES" numrxqueues "$QUEUES" \
    type veth peer name d0 mtu "$MTU" numtxqueues "$QUEUES" numrxqueues "$QUEUES" netns "$ns" ||
    fail_setup "veth"
  ip -n "$SW" link add "gc${ID}h$i" type veth peer name c0 netns "$ns" || fail_setup "veth"
  ip -n "$SW" link set "gd${ID}h$i" master "gwbd$ID" up
  ip -n "$SW" link set "gc${ID}h$i" master "gwbc$ID" up
  ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev d0
  ip -n "$ns" addr add "10.79.0.$((i + 1))/24" dev c0
  ip -n "$ns" link set lo up; ip -n "$ns" link set d0 up; ip -n "$ns" link set c0 up
  # Kernel UDP senders on veth leave CHECKSUM_PARTIAL: compute it (docs: transport.md 1.5).
  ip netns exec "$ns" ethtool -K d0 tx off >/dev/null 2>&1
  if [ -n "$RATE" ]; then
    # A token bucket on both ends of the host's data link: d0's egress shapes what the host
    # sends, the bridge port's egress what it receives. The bucket holds 2 ms at the rate, at
    # least 256 KiB: veth hands tbf segments of up to 64 KiB (GSO), and a bucket smaller than
    # a segment would drop it forever. The queue holds 20 ms more before tbf drops.
    burst=$(( rate_bits / 8 / 500 )); [ "$burst" -ge 262144 ] || burst=262144
    for end in "$ns d0" "$SW gd${ID}h$i"; do
      tc -n "${end% *}" qdisc replace dev "${end#* }" root tbf rate "$RATE" burst "$burst" \
        latency 20ms || fail_setup "tc qdisc tbf rate $RATE on host $i (is sch_tbf available?)"
    done
  fi
done

EAL_MEM="--no-huge -m 512 --no-shconf"
if [ "$HUGE" -gt 0 ] && [ -w /proc/sys/vm/nr_hugepages ]; then
  HUGE_OLD=$(cat /proc/sys/vm/nr_hugepages)
  echo $((HUGE_OLD + HUGE * N)) > /proc/sys/vm/nr_hugepages 2>/dev/null
  if [ "$(cat /proc/sys/vm/nr_hugepages)" -ge $((HUGE_OLD + HUGE * N)) ] && mountpoint -q /dev/hugepages; then
    EAL_MEM="--in-memory -m $((HUGE * 2))"
  else
    echo "testbed: hugepages unavailable, falling back to --no-huge" >&2
  fi
fi

if [ -n "$PCAP" ]; then
  command -v dumpcap >/dev/null || fail_setup "dumpcap (tshark) missing"
  ip netns exec "$SW" dumpcap -q -B 64 -i "gwbd$ID" -w "$PCAP" -f "udp" >/dev/null 2>&1 &
  CAP_PID=$!
  sleep 1
fi

TB_PORT=$((29500 + $$ % 400))
# The TB_* variables every process of the session sees.
TB_ENV=(TB_HOSTS="$N" TB_IFACE=d0 TB_STORE=10.79.0.1 TB_ID="$ID" TB_EAL_MEM="$EAL_MEM"
        TB_RATE="$RATE" TB_PORT="$TB_PORT")
spawn() {  # spawn NS PREFIX SCRIPT ENV... : runs SCRIPT in namespace NS, output prefixed
  local ns=$1 prefix=$2 script=$3; shift 3
  setsid env "$@" "${TB_ENV[@]}" ip netns exec "$ns" bash -c "$script" > >(sed "s/^/[$prefix] /" >&2) 2>&1 &
}
launch() {  # launch NS PREFIX ENV... : runs CMD in namespace NS, output prefixed
  local ns=$1 prefix=$2; shift 2
  spawn "$ns" "$prefix" "$CMD" "$@"
  PIDS+=($!)
}
deadline=$((SECONDS + TIMEOUT))
if [ -n "$SERVICE" ]; then
  for i in $(seq 0 $((N - 1))); do
    spawn "gwtb${ID}h$i" "h${i}s" "$SERVICE" TB_HOST=$i TB_IP="10.77.0.$((i + 1))" \
      TB_CTL_IP="10.79.0.$((i + 1))" GW_SOCKET_IFNAME=d0
    SVC_PIDS+=($!)
  done
  for i in $(seq 0 $((N - 1))); do
    until out=$(env TB_HOST=$i TB_IP="10.77.0.$((i + 1))" TB_CTL_IP="10.79.0.$((i + 1))" \
                GW_SOCKET_IFNAME=d0 "${TB_ENV[@]}" ip netns exec "gwtb${ID}h$i" bash -c "$READY" 2>&1); do
      if ! kill -0 "${SVC_PIDS[$i]}" 2>/dev/null; then
        wait "${SVC_PIDS[$i]}"; s=$?
        echo "testbed: the service on host $i exited with status $s before it was ready" >&2
        SVC_PIDS[$i]=""
        exit 1
      fi
      if [ $SECONDS -ge $deadline ]; then
        echo "testbed: the service on host $i was not ready within ${TIMEOUT}s; last check said: $out" >&2
        exit 124
      fi
      sleep 0.1
    done
  done
fi
for i in $(seq 0 $((N - 1))); do
  ns="gwtb${ID}h$i"
  host_env=(TB_HOST=$i TB_IP="10.77.0.$((i + 1))" TB_CTL_IP="10.79.0.$((i + 1))")
  if [ "$RPH" -gt 0 ]; then
    for l in $(seq 0 $((RPHS[i] - 1))); do
      r=$((RANK0[i] + l))
      launch "$ns" "h${i}r$r" "${host_env[@]}" GW_RANK=$r GW_WORLD_SIZE=$WORLD \
        GW_STORE="10.79.0.1:$TB_PORT" RANK=$r WORLD_SIZE=$WORLD LOCAL_RANK=$l \
        LOCAL_WORLD_SIZE=${RPHS[i]} MASTER_ADDR=10.79.0.1 MASTER_PORT=$TB_PORT GW_SOCKET_IFNAME=d0
    done
    continue
  fi
  launch "$ns" "h$i" "${host_env[@]}"
done

rc=0
for idx in "${!PIDS[@]}"; do
  p=${PIDS[$idx]}
  while kill -0 "$p" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then
      echo "testbed: process $idx still running after ${TIMEOUT}s: killing everything" >&2
      exit 124
    fi
    sleep 0.2
  done
  wait "$p"; s=$?
  if [ $s -ne 0 ] && [ $rc -eq 0 ]; then rc=$s; echo "testbed: process $idx exited with $s" >&2; fi
done
PIDS=()
if [ "${#SVC_PIDS[@]}" -gt 0 ]; then
  for i in "${!SVC_PIDS[@]}"; do
    if ! kill -0 "${SVC_PIDS[$i]}" 2>/dev/null; then
      wait "${SVC_PIDS[$i]}"; s=$?
      echo "testbed: the service on host $i exited (status $s) before the command ended" >&2
      SVC_PIDS[$i]=""
      [ $rc -eq 0 ] && rc=1
    fi
  done
  stop_services || { [ $rc -eq 0 ] && rc=1; }
fi
exit $rc
