#!/usr/bin/env bash
# A real Prometheus scrapes gradwired (issue 34, item 10). The test starts
#   gradwired --foreground --socket DIR/gwd.sock --metrics 127.0.0.1:P1
#   prometheus (Debian's) with a scrape config for 127.0.0.1:P1 every second, storage in DIR,
# then asks Prometheus' HTTP API for the daemon's counters: `up` is 1, the allreduces counted are
# read once, a one-rank job (hello_allreduce with GW_DAEMON) runs through the daemon three times,
# and the counter Prometheus reports must grow by 3. Both servers are stopped and DIR removed on
# every exit. Exit 77 (skip) without prometheus or without --metrics in this gradwired.
# usage: prometheus_test.sh GRADWIRED HELLO_ALLREDUCE
set -uo pipefail
gwd=$1
hello=$2
say() { echo "prometheus_test: $*"; }
fail() { say "FAIL: $*" >&2; exit 1; }

prom=$(command -v prometheus || true)
[ -n "$prom" ] || { say "skipped: no prometheus (Debian: apt-get install prometheus)"; exit 77; }
py=/usr/bin/python3
[ -x "$py" ] || py=python3

dir=$(mktemp -d /tmp/gw_prom_test.XXXXXX)
gwd_pid=""
prom_pid=""
cleanup() {
  for p in $prom_pid $gwd_pid; do
    kill "$p" 2>/dev/null || continue
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

free_port() {
  "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
metrics_port=$(free_port)
prom_port=$(free_port)

# The daemon, in the foreground of a background job so that its pid is ours to stop.
"$gwd" --foreground --socket "$dir/gwd.sock" --metrics "127.0.0.1:$metrics_port" \
  >"$dir/gwd.log" 2>&1 &
gwd_pid=$!
deadline=$((SECONDS + 20))
until grep -q "metrics on http://" "$dir/gwd.log"; do
  if ! kill -0 "$gwd_pid" 2>/dev/null; then
    if grep -qi "prometheus-cpp\|not built" "$dir/gwd.log"; then
      say "skipped: this gradwired has no --metrics: $(cat "$dir/gwd.log")"
      exit 77
    fi
    fail "gradwired exited: $(cat "$dir/gwd.log")"
  fi
  [ $SECONDS -lt $deadline ] ||
    fail "gradwired did not announce its metrics in 20 s: $(cat "$dir/gwd.log")"
  sleep 0.1
done

cat >"$dir/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: gradwired
    static_configs:
      - targets: ["127.0.0.1:$metrics_port"]
EOF
"$prom" --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
  --web.listen-address="127.0.0.1:$prom_port" --log.level=warn >"$dir/prometheus.log" 2>&1 &
prom_pid=$!

# query EXPR: the value of the first sample of an instant query ("" when none yet, or no answer).
query() {
  "$py" - "$prom_port" "$1" <<'EOF'
import json, sys, urllib.parse, urllib.request
port, expr = sys.argv[1], sys.argv[2]
url = "http://127.0.0.1:%s/api/v1/query?%s" % (port, urllib.parse.urlencode({"query": expr}))
try:
    with urllib.request.urlopen(url, timeout=2) as r:
        body = json.load(r)
except Exception:
    sys.exit(0)
res = body.get("data", {}).get("result", [])
if body.get("status") == "success" and res:
    print(res[0]["value"][1])
EOF
}
# wait_for EXPR TEST SECONDS: until query EXPR gives a value for which [ value TEST ] holds.
wait_for() {
  local expr=$1 test=$2 limit=$3 v=""
  local deadline=$((SECONDS + limit))
  while [ $SECONDS -lt $deadline ]; do
    kill -0 "$prom_pid" 2>/dev/null || fail "prometheus exited: $(cat "$dir/prometheus.log")"
    kill -0 "$gwd_pid" 2>/dev/null || fail "gradwired exited: $(cat "$dir/gwd.log")"
    v=$(query "$expr")
    if [ -n "$v" ] && "$py" -c "import sys; sys.exit(0 if float('$v') $test else 1)"; then
      echo "$v"
      return 0
    fi
    sleep 0.5
  done
  fail "after ${limit} s Prometheus answers '$expr' with '${v:-nothing}', want $test;" \
    "prometheus log: $(tail -5 "$dir/prometheus.log")"
}

ok_expr='gradwired_collectives_total{job="gradwired",kind="allreduce",result="ok"}'
wait_for 'up{job="gradwired"}' "== 1" 60 >/dev/null
before=$(wait_for "$ok_expr" ">= 0" 20)
say "Prometheus scrapes gradwired: up 1, allreduces ok $before"

for i in 1 2 3; do
  out=$(env GW_DAEMON="unix:$dir/gwd.sock" GW_RANK=0 GW_WORLD_SIZE=1 GW_TIMEOUT_MS=10000 \
    timeout 30 "$hello" 2>&1) || fail "job $i through the daemon failed: $out"
  grep -q "sum 1 (ok)" <<<"$out" || fail "job $i: unexpected output: $out"
done
after=$(wait_for "$ok_expr" ">= $before + 3" 20)
accepted=$(wait_for 'gradwired_clients_accepted_total{job="gradwired"}' ">= 3" 10)
say "after 3 one-rank jobs: allreduces ok $before -> $after, clients accepted $accepted"
say "ok"
