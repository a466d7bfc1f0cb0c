#!/bin/bash
# Daemon mode across the shaped namespace testbed (tests/testbed/testbed.sh): one gradwired per
# testbed host (a testbed service: --foreground, a socket in a temporary directory, --host-id the
# id its trainers report), started in the host's namespace, ready when gradwirectl answers, and
# trainers started with the launcher environment plus GW_DAEMON=unix:SOCKET, on 2 hosts x 2 and
# 3 hosts x 2 trainers:
#   - gradwire-perf allreduce, broadcast, allgather and reduce_scatter, each with float32 in
#     gw_mem_alloc buffers (--mem-alloc, zero-copy) and bfloat16 (allreduce: also int32 max) in
#     heap buffers (copied through the arena), every element checked (--check);
#   - barrier (and every dtype and op, iallreduces in flight) with tests/daemon's daemon_trainer
#     suite, which gradwire-perf has no subcommand for;
#   - alltoall, checked;
#   - point-to-point across hosts through the daemons (daemon_trainer p2p: a ring both ways from
#     0 B to 1 MiB, any-source at rank 0, order per tag), every element checked;
#   - --mem-alloc really allocates from the arena: with GW_DAEMON_ARENA smaller than the buffers
#     the run stops at gw_mem_alloc, saying so;
#   - two jobs at once on the same daemons (two gradwire-perf launches per trainer, each with its
#     own store and job token), both checked, and gradwirectl jobs on host 0's daemon showing both
#     running at the same time;
#   - the last trainer SIGKILLed mid-collective: every other one, on every host, fails with
#     GW_ERR_PEER within the deadline, while another job on the same daemons runs on unharmed;
#   - the last host's daemon SIGKILLed mid-collective (by a trainer of that host, which finds its
#     pid with gradwirectl status): every trainer, on every host, fails within the deadline (that
#     host's with GW_ERR_PEER), never hangs; the service's supervisor loop (as systemd's
#     Restart=on-failure would) starts the daemon again on the same socket with no cleanup by
#     hand, and a new job on every host then runs, checked.
# The testbed stops the daemons (SIGTERM, which must end them cleanly) and removes every namespace
# whatever happens; this script removes its temporary directory, and on SIGINT/SIGTERM stops the
# testbed session in progress first. Exit 77 (skipped) where the testbed cannot be built.
# usage: testbed_daemon_test.sh TESTBED_SH GRADWIRE_PERF GRADWIRED GRADWIRECTL DAEMON_TRAINER
set -u
[ $# -eq 5 ] || { echo "usage: $0 TESTBED_SH GRADWIRE_PERF GRADWIRED GRADWIRECTL DAEMON_TRAINER" >&2; exit 2; }
tb=$1; perf=$2; gwd=$3; gwctl=$4; trainer=$5
fail() { echo "testbed_daemon_test: FAIL: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "testbed_daemon_test: needs root (network namespaces)"; exit 77; }
for f in "$perf" "$gwd" "$gwctl" "$trainer"; do [ -x "$f" ] || fail "$f is not built"; done
work=$(mktemp -d)
tb_pid=""
trap 'rm -rf "$work"' EXIT
trap 'trap - INT TERM; [ -n "$tb_pid" ] && { kill -TERM "$tb_pid" 2>/dev/null; wait "$tb_pid"; }; exit 130' INT TERM

# What every trainer runs. Each case is one job on a store port of its own (rank 0's namespace
# has its own port space), so a fast trainer never meets the previous job's store; a failed case
# is recorded and the trainer goes on, so that every trainer runs the same cases.
cat >"$work/rank.sh" <<'EOF'
set -u
export GW_DAEMON="unix:$SOCKDIR/h$TB_HOST.sock" GW_HOSTID="gwtb${TB_ID}h$TB_HOST" GW_TIMEOUT_MS=30000
out="$OUTDIR/r$GW_RANK"
k=0; bad=0
case_failed() { echo "rank $GW_RANK: case $k ($1) failed: $(tail -n 3 "$out.$k" | tr '\n' ' ')"; bad=1; }
perf_case() {  # perf_case COLL ARGS... : one checked gradwire-perf job
  k=$((k + 1))
  GW_STORE="10.79.0.1:$((TB_PORT + k))" "$PERF" "$@" -b 64 -e 1M -f 16 -n 2 -w 1 --check \
    >"$out.$k" 2>&1 || case_failed "$*"
}
for coll in allreduce broadcast allgather reduce_scatter; do
  perf_case "$coll" -d float32 --mem-alloc
  perf_case "$coll" -d bfloat16
done
perf_case allreduce -d int32 -o max

# Barrier, and the rest of the C ABI, with the daemon tests' trainer (exact checks).
k=$((k + 1))
GW_STORE="10.79.0.1:$((TB_PORT + k))" "$TRAINER" suite 1000 >"$out.$k" 2>&1 || case_failed "daemon_trainer suite"

# alltoall, checked (sizes that split into 4 and 6 ranks' blocks).
for a2a in "-d float32 --mem-alloc" "-d int64"; do
  k=$((k + 1))
  # shellcheck disable=SC2086
  GW_STORE="10.79.0.1:$((TB_PORT + k))" "$PERF" alltoall $a2a -b 96 -e 96K -f 32 -n 2 -w 1 \
    --check >"$out.$k" 2>&1 || case_failed "alltoall $a2a"
done
echo "alltoall checked" >"$out.alltoall"

# Point-to-point across hosts through the daemons (ring both ways to 1 MiB, any-source, order).
k=$((k + 1))
GW_STORE="10.79.0.1:$((TB_PORT + k))" "$TRAINER" p2p 1048576 >"$out.$k" 2>&1 || case_failed "daemon_trainer p2p"

# --mem-alloc takes the buffers from the arena: 2 x 4 MiB do not fit in a 1 MiB one.
k=$((k + 1))
if GW_STORE="10.79.0.1:$((TB_PORT + k))" GW_DAEMON_ARENA=1M "$PERF" allreduce -b 4M -e 4M -n 1 \
     -w 0 --mem-alloc >"$out.$k" 2>&1; then
  case_failed "--mem-alloc with a 1 MiB arena succeeded"
elif ! grep -q "gw_mem_alloc of the send buffer (4194304 B; --mem-alloc) failed: GW_ERR_NO_MEMORY" "$out.$k"; then
  case_failed "--mem-alloc with a 1 MiB arena: not refused by gw_mem_alloc"
fi

# Two jobs at once on the same daemons: their own stores and tokens, both checked. Host 0's first
# trainer asks its daemon for its jobs meanwhile, until it has seen both running together.
k=$((k + 1)); ka=$k; k=$((k + 1)); kb=$k
GW_STORE="10.79.0.1:$((TB_PORT + ka))" GW_JOB_TOKEN="job-a-$TB_ID" "$PERF" allreduce -b 1K -e 8M \
  -f 8 -n 5 -w 1 --check --mem-alloc >"$out.$ka" 2>&1 &
pa=$!
GW_STORE="10.79.0.1:$((TB_PORT + kb))" GW_JOB_TOKEN="job-b-$TB_ID" "$PERF" allgather -b 1K -e 8M \
  -f 8 -n 5 -w 1 --check -d bfloat16 >"$out.$kb" 2>&1 &
pb=$!
if [ "$GW_RANK" = 0 ]; then
  seen=0
  while kill -0 "$pa" 2>/dev/null && kill -0 "$pb" 2>/dev/null; do
    if "$GWCTL" jobs --json --socket "$SOCKDIR/h0.sock" --timeout-ms 5000 >"$out.jobs" 2>&1 &&
       [ "$(grep -c '"state": "running"' "$out.jobs")" -ge 2 ]; then
      seen=1; cp "$out.jobs" "$OUTDIR/jobs_seen"; break
    fi
    sleep 0.05
  done
  [ $seen = 1 ] || { k=jobs; case_failed "gradwirectl jobs never showed both jobs running"; }
fi
k=$ka; wait "$pa" || case_failed "job a (allreduce) beside job b"
k=$kb; wait "$pb" || case_failed "job b (allgather) beside job a"

# A trainer killed mid-collective (the last rank, on the last host): every other trainer, on every
# host, fails with GW_ERR_PEER (exit 10 + 3) within the deadline, never hangs. Last: the job ends.
# Meanwhile another job on the same daemons (its own store and token) does not notice.
k=$((k + 1)); kb=$k; k=$((k + 1))
GW_STORE="10.79.0.1:$((TB_PORT + kb))" GW_JOB_TOKEN="bystander-$TB_ID" "$PERF" allreduce -b 4K \
  -e 4M -f 4 -n 20 -w 1 --check >"$out.$kb" 2>&1 &
pb=$!
killer=$((GW_WORLD_SIZE - 1))
GW_TIMEOUT_MS=10000 GW_STORE="10.79.0.1:$((TB_PORT + k))" timeout 60 "$TRAINER" die "$killer" \
  >"$out.$k" 2>&1
rc=$?
wait "$pb" || { k=$kb; case_failed "the bystander job beside the killed trainer's"; }
if [ "$GW_RANK" = "$killer" ]; then
  [ $rc -eq 137 ] || case_failed "the killer ended with $rc, not SIGKILL"
elif [ $rc -ne 13 ]; then
  case_failed "a killed trainer: this trainer ended with $rc (13, GW_ERR_PEER, expected)"
else
  ms=$(sed -n 's/^RESULT .*elapsed_ms=\([0-9]*\).*/\1/p' "$out.$k" | head -1)
  [ -n "$ms" ] && [ "$ms" -le 12000 ] || case_failed "GW_ERR_PEER after ${ms:-?} ms (deadline 10000)"
  echo "peer after $ms ms" >"$out.killed"
fi

# The last host's daemon SIGKILLed while every trainer loops on allreduce.
k=$((k + 1))
victim=$((TB_HOSTS - 1))
mysock="$SOCKDIR/h$TB_HOST.sock"
GW_TIMEOUT_MS=10000 GW_STORE="10.79.0.1:$((TB_PORT + k))" timeout 60 "$TRAINER" loop >"$out.$k" 2>&1 &
pt=$!
if [ "$TB_HOST" = "$victim" ] && [ "$LOCAL_RANK" = 0 ]; then
  for _ in $(seq 300); do grep -q LOOPING "$out.$k" && break; sleep 0.05; done
  sleep 0.3
  dpid=$("$GWCTL" status --json --socket "$mysock" --timeout-ms 5000 |
         sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' | head -1)
  if [ -n "$dpid" ]; then kill -KILL "$dpid"; else case_failed "no daemon pid from gradwirectl"; fi
fi
wait "$pt"; rc=$?
ms=$(sed -n 's/^RESULT .*elapsed_ms=\([0-9]*\).*/\1/p' "$out.$k" | head -1)
if [ $rc -le 10 ] || [ $rc -ge 124 ]; then
  case_failed "a killed daemon: this trainer ended with $rc (an error status expected)"
elif [ "$TB_HOST" = "$victim" ] && [ $rc -ne 13 ]; then
  case_failed "a killed daemon: its own trainer ended with $rc (13, GW_ERR_PEER, expected)"
elif [ -z "$ms" ] || [ "$ms" -gt 12000 ]; then
  case_failed "a killed daemon: failed after ${ms:-?} ms (deadline 10000)"
fi
# Started again by the service's loop on the same socket: a new job on every host runs.
for _ in $(seq 100); do
  "$GWCTL" status --socket "$mysock" --timeout-ms 1000 >/dev/null 2>&1 && break
  sleep 0.1
done
k=$((k + 1))
if GW_STORE="10.79.0.1:$((TB_PORT + k))" "$PERF" allreduce -d float32 --mem-alloc -b 64 -e 1M \
     -f 16 -n 2 -w 1 --check >"$out.$k" 2>&1; then
  echo "failed after $ms ms; a job after the restart ran" >"$out.daemon_killed"
else
  case_failed "a job after the daemon's restart"
fi
exit $bad
EOF

layout() {  # layout HOSTS RANKS_PER_HOST
  local hosts=$1 rph=$2 name="${1}x$2" t0=$SECONDS rc
  mkdir -p "$work/$name/out" "$work/$name/sock"
  local sock="$work/$name/sock/h\$TB_HOST.sock"
  OUTDIR="$work/$name/out" SOCKDIR="$work/$name/sock" PERF="$perf" TRAINER="$trainer" GWCTL="$gwctl" \
    bash "$tb" -n "$hosts" -R "$rph" -r 1gbit -t 240 \
      -S "while :; do $gwd --foreground --socket $sock --host-id gwtb\${TB_ID}h\$TB_HOST; s=\$?; \
          [ \$s -eq 0 ] && exit 0; echo \"gradwired exited with \$s: starting it again\" >&2; \
          sleep 0.2; done" \
      -W "$gwctl status --socket $sock --timeout-ms 2000" -- "bash $work/rank.sh" \
      >"$work/$name/log" 2>&1 &
  tb_pid=$!
  wait "$tb_pid"; rc=$?
  tb_pid=""
  [ $rc -eq 77 ] && { cat "$work/$name/log"; echo "testbed_daemon_test: testbed unavailable"; exit 77; }
  if [ $rc -ne 0 ]; then
    # The failed cases first (the daemons' log lines could push them out of the tail), then
    # the session's last lines; the whole log is kept beside the build for a post-mortem.
    grep 'case .* failed' "$work/$name/log" >&2
    grep -v '^\[h[0-9]*r[0-9]*\] *[0-9#]' "$work/$name/log" | tail -n 40 >&2
    cp "$work/$name/log" "${TMPDIR:-/tmp}/testbed_daemon_$name.log" 2>/dev/null &&
      echo "testbed_daemon_test: the whole log: ${TMPDIR:-/tmp}/testbed_daemon_$name.log" >&2
    fail "$name: status $rc (the lines above say which case)"
  fi
  # Every trainer ran every case (a trainer that stopped early would not fail the session).
  local want=$((hosts * rph)) n
  n=$(ls "$work/$name/out"/r*.alltoall 2>/dev/null | wc -l)
  [ "$n" -eq "$want" ] || fail "$name: $n of $want trainers reached the alltoall case"
  [ -s "$work/$name/out/jobs_seen" ] || fail "$name: no record of both jobs running at once"
  n=$(ls "$work/$name/out"/r*.killed 2>/dev/null | wc -l)
  [ "$n" -eq $((want - 1)) ] || fail "$name: $n of $((want - 1)) trainers saw the killed one"
  n=$(ls "$work/$name/out"/r*.daemon_killed 2>/dev/null | wc -l)
  [ "$n" -eq "$want" ] || fail "$name: $n of $want trainers saw the killed daemon and ran after its restart"
  grep -q "^# transport: daemon" "$work/$name/out/r0.1" || fail "$name: rank 0 did not run in daemon mode"
  echo "testbed_daemon_test: $name ok ($((SECONDS - t0)) s; $(cat "$work/$name/out/r0.alltoall");" \
    "killed daemon: rank 0 $(cat "$work/$name/out/r0.daemon_killed"))"
}

layout 2 2
layout 3 2
echo "testbed_daemon_test: ok"
