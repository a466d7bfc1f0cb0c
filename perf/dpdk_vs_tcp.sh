#!/usr/bin/env bash
# DPDK next to kernel TCP over the same veth data interface, in ONE session of the namespace
# testbed (tests/testbed/testbed.sh), with the user-facing tool: `gradwire-perf p2p` (2 hosts:
# 8 B latency, bandwidth) and `gradwire-perf allreduce --check` (HOSTS hosts), one rank per
# namespace host under GW_RANK/GW_WORLD_SIZE/GW_STORE. TCP runs on d0 (GW_SOCKET_IFNAME=d0), DPDK
# on d0 through net_af_xdp (and/or net_af_packet), the store on the control net (TB_STORE, c0).
# Every repetition runs tcp and every DPDK set-up (port x injected loss), in alternating order
# (odd repetitions tcp first, even ones tcp last), so a noisy neighbour hits both alike. Prints
# one table: medians over the repetitions, DPDK/TCP, and with loss DPDK/loss-free DPDK.
#
# usage: perf/dpdk_vs_tcp.sh [-b PERF] [-r REPS] [-n HOSTS] [-p PORTS] [-l LOSSES] [-s AR_SIZES]
#                            [-q P2P_SIZES] [-i ITERS] [-L LAT_ITERS] [-m MTU] [-t SECONDS] [-o DIR]
#   -b  gradwire-perf binary (default: build/release/perf/gradwire-perf)
#   -r  repetitions (default 3)
#   -n  hosts of the allreduce runs (default 4; p2p always uses hosts 0 and 1)
#   -p  DPDK ports: "af_xdp", "af_packet" or both (default "af_xdp")
#   -l  injected loss rates of the DPDK runs (default "0 0.01"; GW_DPDK_INJECT_LOSS)
#   -s  allreduce sizes "MIN MAX FACTOR" (default "4K 256M 4")
#   -q  p2p bandwidth sizes "MIN MAX FACTOR" (default "64K 4M 64")
#   -i  timed iterations per size (default: gradwire-perf's adaptive rule)
#   -L  8-byte ping-pongs per p2p run (default 2000)
#   -m  MTU of the veths (default 3498 with af_xdp: one frame per 4 KiB umem chunk; else 9000)
#   -t  limit of the whole testbed session in seconds (default: 900 per repetition)
#   -o  keep the JSON documents and logs of every run in DIR (default: a temporary directory);
#       with GW_LOG_LEVEL=debug in the environment (default info) each DPDK run's log ends with
#       its engine's counters (frames, retransmissions by cause, RTT, the port's drops)
# A failed run does not stop the others: the table lists it (its finished rows still count).
# Exit status: 0 table printed, every run succeeded and every --check passed; 1 a run failed or a
# check found wrong elements; 2 bad arguments or no binary; 77 the testbed cannot run here (needs
# root and netns).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
testbed="$root/tests/testbed/testbed.sh"

# ---- one namespace host (the testbed runs this in every host at once) -------------------------
if [ "${1:-}" = "--host" ]; then
  h=$TB_HOST
  N=$TB_HOSTS
  sync="$DVT_DIR/sync"
  phase=0
  # Waits until every host has finished phase $1 (a file per host holding its exit status). A
  # failed run does not stop the session (the table reports it); a host that never finishes does.
  barrier() {
    local k=$1 i deadline=$((SECONDS + DVT_PHASE_TIMEOUT))
    for i in $(seq 0 $((N - 1))); do
      while [ ! -s "$sync/$k.h$i" ]; do
        if [ $SECONDS -ge $deadline ]; then
          echo "dpdk_vs_tcp: host $i did not finish phase $k within ${DVT_PHASE_TIMEOUT}s"
          exit 1
        fi
        sleep 0.1
      done
    done
  }
  # run_phase REP TEST CFG: CFG is tcp or dpdk:PORT:LOSS.
  run_phase() {
    local rep=$1 test=$2 cfg=$3 hosts rc=0 name t0
    phase=$((phase + 1))
    [ $phase -gt 1 ] && barrier $((phase - 1))
    hosts=$DVT_HOSTS
    [ "$test" = p2p ] && hosts=2
    name="$rep-$test-${cfg//:/-}"
    if [ "$h" -lt "$hosts" ]; then
      local -a env=(GW_RANK="$h" GW_WORLD_SIZE="$hosts" GW_STORE="$TB_STORE:$((29600 + phase))"
        GW_TIMEOUT_MS="$DVT_TIMEOUT_MS" GW_LOG_LEVEL="$DVT_LOG_LEVEL")
      local -a args
      if [ "$cfg" = tcp ]; then
        env+=(GW_SOCKET_IFNAME="$TB_IFACE")
        args=(--transport tcp)
      else
        local port=${cfg#dpdk:} loss=${cfg##*:} vdev
        port=${port%%:*}
        case $port in
          af_xdp) vdev="net_af_xdp0,iface=$TB_IFACE" ;;
          # Ring slots that hold a 9000-byte frame, and a 1024-slot RX ring (docs/dpdk.md).
          af_packet) vdev="net_af_packet0,iface=$TB_IFACE,framesz=9216,blocksz=36864,framecnt=1024" ;;
        esac
        env+=(GW_DPDK_IP="$TB_IP" GW_DPDK_INJECT_LOSS="$loss" GW_DPDK_INJECT_SEED=$((h + 1 + phase))
          GW_DPDK_EAL_ARGS="-l 0 $TB_EAL_MEM --no-pci --no-telemetry --log-level=*:error --vdev $vdev")
        args=(--transport dpdk)
      fi
      if [ "$test" = p2p ]; then
        args+=(--minbytes "$DVT_P2P_MIN" -e "$DVT_P2P_MAX" -f "$DVT_P2P_F" --lat-iters "$DVT_LAT_ITERS")
      else
        args+=(-b "$DVT_AR_MIN" -e "$DVT_AR_MAX" -f "$DVT_AR_F" --check)
      fi
      [ -n "$DVT_ITERS" ] && args+=(-n "$DVT_ITERS")
      t0=$SECONDS
      env "${env[@]}" timeout -k 5 "$DVT_PHASE_TIMEOUT" "$DVT_PERF" "$test" "${args[@]}" \
        -J "$DVT_DIR/json/$name.json" >"$DVT_DIR/log/$name.h$h.log" 2>&1
      rc=$?
      if [ "$h" = 0 ] || [ $rc -ne 0 ]; then
        echo "phase $phase: $name: status $rc, $((SECONDS - t0)) s"
      fi
      if [ $rc -ne 0 ]; then
        echo "dpdk_vs_tcp: $name failed on host $h (status $rc); its log ends:"
        tail -n 5 "$DVT_DIR/log/$name.h$h.log"
      fi
    fi
    echo "$rc $name" >"$sync/$phase.h$h.tmp" && mv "$sync/$phase.h$h.tmp" "$sync/$phase.h$h"
  }
  for rep in $(seq 1 "$DVT_REPS"); do
    cfgs=(tcp)
    for p in $DVT_PORTS; do for l in $DVT_LOSSES; do cfgs+=("dpdk:$p:$l"); done; done
    if [ $((rep % 2)) = 0 ]; then  # alternate: tcp last in even repetitions
      rev=()
      for ((k = ${#cfgs[@]} - 1; k >= 0; k--)); do rev+=("${cfgs[$k]}"); done
      cfgs=("${rev[@]}")
    fi
    for test in p2p allreduce; do
      for cfg in "${cfgs[@]}"; do run_phase "$rep" "$test" "$cfg"; done
    done
  done
  barrier $phase
  exit 0
fi

# ---- the driver --------------------------------------------------------------------------------
usage() { sed -n '11,28p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
die() { echo "dpdk_vs_tcp: $*" >&2; exit 2; }
perf="$root/build/release/perf/gradwire-perf"
reps=3 hosts=4 ports="af_xdp" losses="0 0.01" ar_sizes="4K 256M 4" p2p_sizes="64K 4M 64"
iters="" lat_iters=2000 mtu="" limit="" keep=""
for a in "$@"; do [ "$a" = --help ] && set -- -h; done  # --help means -h
while getopts "b:r:n:p:l:s:q:i:L:m:t:o:h" opt; do
  case "$opt" in
    b) perf="$OPTARG" ;; r) reps="$OPTARG" ;; n) hosts="$OPTARG" ;; p) ports="$OPTARG" ;;
    l) losses="$OPTARG" ;; s) ar_sizes="$OPTARG" ;; q) p2p_sizes="$OPTARG" ;; i) iters="$OPTARG" ;;
    L) lat_iters="$OPTARG" ;; m) mtu="$OPTARG" ;; t) limit="$OPTARG" ;; o) keep="$OPTARG" ;;
    h) usage 0 ;;
    *) usage ;;
  esac
done
[ $OPTIND -gt $# ] || die "unexpected argument '${!OPTIND}' (see -h)"
posint() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 $2: need a positive integer"; }
posint -r "$reps"
posint -n "$hosts"
[ "$hosts" -ge 2 ] || die "-n $hosts: an allreduce across hosts needs at least 2"
posint -L "$lat_iters"
[ -z "$iters" ] || posint -i "$iters"
[ -n "$ports" ] || die "-p: name at least one port (af_xdp, af_packet)"
for p in $ports; do
  case $p in af_xdp | af_packet) ;; *) die "-p $p: use af_xdp or af_packet" ;; esac
done
for l in $losses; do
  [[ "$l" =~ ^(0|0?\.[0-9]+)$ ]] || die "-l $l: a loss rate in [0, 1), e.g. 0.01"
done
read -r ar_min ar_max ar_f extra <<<"$ar_sizes"
[ -n "$ar_f" ] && [ -z "${extra:-}" ] || die "-s '$ar_sizes': need \"MIN MAX FACTOR\""
read -r p2p_min p2p_max p2p_f extra <<<"$p2p_sizes"
[ -n "$p2p_f" ] && [ -z "${extra:-}" ] || die "-q '$p2p_sizes': need \"MIN MAX FACTOR\""
if [ -z "$mtu" ]; then
  mtu=9000
  [[ " $ports " == *" af_xdp "* ]] && mtu=3498
fi
posint -m "$mtu"
[ -z "$limit" ] && limit=$((900 * reps))
posint -t "$limit"
[ -x "$perf" ] || die "$perf not found or not executable; build it (scripts/build.sh release) or pass -b"
perf="$(cd "$(dirname "$perf")" && pwd)/$(basename "$perf")"
[ -f "$testbed" ] || die "$testbed not found"
command -v python3 >/dev/null || die "python3 is needed for the table (apt-get install python3)"

if [ -n "$keep" ]; then
  mkdir -p "$keep" || die "cannot create $keep"
  dir="$(cd "$keep" && pwd)"
  rm -rf "$dir/sync" "$dir/json" "$dir/log"
else
  dir="$(mktemp -d /tmp/dpdk_vs_tcp.XXXXXX)" || die "mktemp failed"
  trap 'rm -rf "$dir"' EXIT
fi
mkdir -p "$dir/sync" "$dir/json" "$dir/log"

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
started="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "dpdk_vs_tcp: $reps repetition(s), ports: $ports, losses: $losses, MTU $mtu, $hosts hosts;" \
  "load average before: $load_before" >&2
DVT_DIR="$dir" DVT_PERF="$perf" DVT_REPS="$reps" DVT_HOSTS="$hosts" DVT_PORTS="$ports" \
  DVT_LOSSES="$losses" DVT_AR_MIN="$ar_min" DVT_AR_MAX="$ar_max" DVT_AR_F="$ar_f" \
  DVT_P2P_MIN="$p2p_min" DVT_P2P_MAX="$p2p_max" DVT_P2P_F="$p2p_f" DVT_ITERS="$iters" \
  DVT_LAT_ITERS="$lat_iters" DVT_TIMEOUT_MS="${GW_TIMEOUT_MS:-30000}" DVT_PHASE_TIMEOUT=300 \
  DVT_LOG_LEVEL="${GW_LOG_LEVEL:-info}" \
  bash "$testbed" -n "$hosts" -m "$mtu" -t "$limit" -- "bash '${BASH_SOURCE[0]}' --host"
rc=$?
if [ $rc = 77 ]; then
  echo "dpdk_vs_tcp: cannot run here: the namespace testbed is unavailable (it needs root," \
    "iproute2 and network namespaces; see the testbed's SKIP line above)" >&2
  exit 77
fi
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

# The table: medians over repetitions of every run's figure.
DVT_RC=$rc python3 - "$dir" "$perf" "$started" "$load_before" "$load_after" "$mtu" "$hosts" <<'EOF'
import glob, json, os, re, statistics, sys
d, perf, started, load_before, load_after, mtu, hosts = sys.argv[1:]
runs = {}  # (test, cfg) -> [doc, ...]
for path in sorted(glob.glob(os.path.join(d, "json", "*.json"))):
    m = re.match(r"(\d+)-(p2p|allreduce)-(.*)\.json$", os.path.basename(path))
    if not m:
        continue
    try:
        doc = json.load(open(path))
    except ValueError as e:
        print(f"dpdk_vs_tcp: {path}: not JSON ({e})", file=sys.stderr)
        continue
    runs.setdefault((m.group(2), m.group(3)), []).append((int(m.group(1)), doc))

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None

def fmt(x, spec):
    return "-" if x is None else format(x, spec)

def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b

def cfgs():
    dp = sorted({c for (_, c) in runs if c != "tcp"}, key=lambda c: (c.split("-")[1], float(c.split("-")[2])))
    return dp

def loss_label(c):
    l = float(c.split("-")[2])
    return "0" if l == 0 else f"{l * 100:g}%"

def size_label(b):
    for unit, s in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << s and b % (1 << s) == 0:
            return f"{b >> s}{unit}"
    return str(b)

errors, wrong_total, checked = [], 0, 0
for path in sorted(glob.glob(os.path.join(d, "sync", "*.h*"))):
    rc, _, name = open(path).read().strip().partition(" ")
    if rc != "0":
        host = path.rsplit(".h", 1)[1]
        errors.append(f"{name} on host {host}: exit status {rc} (log: {name}.h{host}.log)")
for (test, cfg), docs in runs.items():
    for rep, doc in docs:
        if "error" in doc:
            errors.append(f"{rep}-{test}-{cfg}: {doc['error']}")
        if test == "allreduce":
            for row in doc.get("rows", []):
                if isinstance(row.get("wrong"), int) and row["wrong"] >= 0:
                    wrong_total += row["wrong"]
                    checked += 1

print(f"# dpdk_vs_tcp: {started}, {os.uname().release}, {os.cpu_count()} CPUs, "
      f"load average before {load_before}, after {load_after}")
print(f"# gradwire-perf: {perf}")
print(f"# testbed: namespace hosts, veth pairs + a Linux bridge (veth, not a NIC), MTU {mtu}; "
      f"data on d0 (tcp: GW_SOCKET_IFNAME=d0, dpdk: the PMD on d0), store on c0")
print("# medians over repetitions (tcp and dpdk alternating); the loss is injected by DPDK's own "
      "injector (GW_DPDK_INJECT_LOSS), TCP runs without")
print("# per-run values: stderr")

# p2p
tcp = [doc for _, doc in runs.get(("p2p", "tcp"), [])]
def p2p_lat(docs):
    return med([doc.get("latency", {}).get("t_median_us") for doc in docs])
def p2p_bw(docs):
    out = {}
    for doc in docs:
        for row in doc.get("bandwidth", []):
            out.setdefault(row["bytes"], []).append(row["bw_average_MBps"])
    return {b: med(v) for b, v in out.items()}
def ifaces(docs):
    return sorted({doc.get("transport_properties", {}).get("interfaces", "?") for doc in docs})
if runs.get(("p2p", "tcp")) or any(t == "p2p" for t, _ in runs):
    print("#")
    print("# p2p: 2 hosts, gradwire-perf p2p; latency = 8 B ping-pong, median half round trip (us); "
          "bandwidth = rank 0 -> rank 1 (MB/s, 1e6 B)")
    print(f"# tcp interfaces: {', '.join(ifaces(tcp)) or '-'}")
    print(f"# {'metric':<12} {'port':<10} {'loss':>5} {'runs':>4} {'TCP':>10} {'DPDK':>10} "
          f"{'DPDK/TCP':>9} {'vs 0 loss':>9}")
    t_lat, t_bw = p2p_lat(tcp), p2p_bw(tcp)
    print(f"# tcp runs: {len(tcp)}", file=sys.stderr)
    for c in cfgs():
        docs = [doc for _, doc in runs.get(("p2p", c), [])]
        if not docs:
            continue
        port = c.split("-")[1]
        base = [doc for _, doc in runs.get(("p2p", f"dpdk-{port}-0"), [])]
        lat = p2p_lat(docs)
        lr = ratio(lat, p2p_lat(base)) if loss_label(c) != "0" and base else None
        print(f"  {'lat 8B us':<12} {port:<10} {loss_label(c):>5} {len(docs):>4} {fmt(t_lat, '.2f'):>10} "
              f"{fmt(lat, '.2f'):>10} {fmt(ratio(lat, t_lat), '.2f'):>9} {fmt(lr, '.2f'):>9}")
        bw, bbw = p2p_bw(docs), p2p_bw(base)
        for b in sorted(bw):
            r0 = ratio(bw[b], bbw.get(b)) if loss_label(c) != "0" and base else None
            print(f"  {'bw ' + size_label(b) + ' MB/s':<12} {port:<10} {loss_label(c):>5} {len(docs):>4} "
                  f"{fmt(t_bw.get(b), '.0f'):>10} {fmt(bw[b], '.0f'):>10} "
                  f"{fmt(ratio(bw[b], t_bw.get(b)), '.2f'):>9} {fmt(r0, '.2f'):>9}")
        print(f"#   dpdk {port} loss {loss_label(c)} interfaces: {', '.join(ifaces(docs))}")
        for name, ds in (("tcp", tcp), (c, docs)):
            print(f"p2p {name}: lat us " + " ".join(fmt(d.get('latency', {}).get('t_median_us'), '.2f') for d in ds)
                  + "; bw MB/s " + " | ".join(" ".join(fmt(r['bw_average_MBps'], '.0f') for r in d.get('bandwidth', [])) for d in ds),
                  file=sys.stderr)

# allreduce
def ar_times(docs):
    out = {}
    for doc in docs:
        for row in doc.get("rows", []):
            out.setdefault(row["size_bytes"], []).append(row.get("time_us"))
    return {b: med(v) for b, v in out.items()}
tcp = [doc for _, doc in runs.get(("allreduce", "tcp"), [])]
if any(t == "allreduce" for t, _ in runs):
    print("#")
    print(f"# allreduce: {hosts} hosts, gradwire-perf allreduce --check, float32 sum; time = the tool's "
          "median over iterations of the slowest rank (us), median over runs; algbw = size/time (GB/s)")
    print(f"# {'size(B)':>10} {'port':<10} {'loss':>5} {'runs':>4} {'TCP us':>10} {'DPDK us':>10} "
          f"{'TCP algbw':>9} {'DPDK algbw':>10} {'DPDK/TCP':>9} {'vs 0 loss':>9}  (ratios of algbw)")
    # What the C ABI really ran (rank 0's INFO lines), so a silent fallback cannot pass as DPDK.
    for c in ["tcp"] + cfgs():
        seen = set()
        for rep, _ in runs.get(("allreduce", c), []):
            try:
                log = open(os.path.join(d, "log", f"{rep}-allreduce-{c}.h0.log")).read()
            except OSError:
                continue
            m = re.search(r"communicator ready: rank 0 of \d+, .*?transport (\w+)", log)
            e = re.search(r"dpdk: engine on (\S+)", log)
            seen.add((m.group(1) if m else "?") + (f" on {e.group(1)}" if e else ""))
        print(f"#   {c} ran: {', '.join(sorted(seen)) or '?'}")
    tt = ar_times(tcp)
    for c in cfgs():
        docs = [doc for _, doc in runs.get(("allreduce", c), [])]
        if not docs:
            continue
        port = c.split("-")[1]
        base = ar_times([doc for _, doc in runs.get(("allreduce", f"dpdk-{port}-0"), [])])
        dt = ar_times(docs)
        for b in sorted(dt):
            ta, da = tt.get(b), dt[b]
            tbw = b / ta / 1e3 if ta else None
            dbw = b / da / 1e3 if da else None
            vs0 = ratio(base.get(b), da) if loss_label(c) != "0" else None
            print(f"  {b:>10} {port:<10} {loss_label(c):>5} {len(docs):>4} {fmt(ta, '.1f'):>10} "
                  f"{fmt(da, '.1f'):>10} {fmt(tbw, '.3f'):>9} {fmt(dbw, '.3f'):>10} "
                  f"{fmt(ratio(ta, da), '.2f'):>9} {fmt(vs0, '.2f'):>9}")
        for name, ds in (("tcp", tcp), (c, docs)):
            print(f"allreduce {name}: time us per run, by size: " + " | ".join(
                " ".join(fmt(r.get('time_us'), '.0f') for r in d.get('rows', [])) for d in ds), file=sys.stderr)
print("#")
print(f"# check: {checked} allreduce rows verified with --check, {wrong_total} wrong elements")
for e in errors:
    print(f"# FAILED run (its finished rows are in the medians): {e}")
status = 0
if wrong_total:
    print("dpdk_vs_tcp: --check found wrong elements", file=sys.stderr)
    status = 1
for e in errors:
    print(f"dpdk_vs_tcp: run failed: {e}", file=sys.stderr)
    status = 1
if int(os.environ["DVT_RC"]) != 0:
    print(f"# INCOMPLETE: the testbed session failed (status {os.environ['DVT_RC']}); see the host output above")
    status = 1
sys.exit(status)
EOF
