#!/usr/bin/env bash
# Checks tests/testbed/testbed.sh itself: the launcher environment of every rank (-R), the token
# bucket on both ends of every host's data link (-r), refusal of bad arguments, a correct 2x2
# allreduce across the shaped link, the default tcp interface (the route to the store), the
# per-host services (-S/-W: ready before the ranks, stopped after them, failures reported), and
# that nothing (namespaces, links) is left behind, also
# after a failing rank. Exit 77 (skipped) where the testbed cannot be built (not root).
# usage: testbed_test.sh TESTBED_SH GRADWIRE_PERF
set -uo pipefail
tb="$1"; perf="$2"
fail() { echo "testbed_test: FAIL: $*" >&2; exit 1; }
# Namespaces this test's sessions left: those not there when it started (another session's, or
# a killed session's that the testbed has not removed yet, are not this test's to judge).
gwtb() { ip netns list 2>/dev/null | sed -nE 's/^(gwtb[0-9a-z]+)( .*)?$/\1/p' | sort; }
before=$(gwtb)
left_behind() {
  local new
  new=$(comm -13 <(echo "$before") <(gwtb))
  [ -z "$new" ] || fail "namespaces left behind: $new"
}

# Bad arguments are refused before anything is built (exit 2), root or not.
bash "$tb" -r 1gigabit -- true 2>/dev/null; [ $? -eq 2 ] || fail "-r 1gigabit accepted"
bash "$tb" -R x -- true 2>/dev/null; [ $? -eq 2 ] || fail "-R x accepted"
bash "$tb" -n 3 -R 2,1 -- true 2>/dev/null; [ $? -eq 2 ] || fail "-R with 2 counts for 3 hosts accepted"
bash "$tb" -n 2 -R 2,0 -- true 2>/dev/null; [ $? -eq 2 ] || fail "-R with an empty host accepted"
bash "$tb" -n 0 -- true 2>/dev/null; [ $? -eq 2 ] || fail "-n 0 accepted"
bash "$tb" -q 0 -- true 2>/dev/null; [ $? -eq 2 ] || fail "-q 0 accepted"
bash "$tb" -q 65 -- true 2>/dev/null; [ $? -eq 2 ] || fail "-q 65 accepted"
bash "$tb" -q x -- true 2>/dev/null; [ $? -eq 2 ] || fail "-q x accepted"

out=$(bash "$tb" -n 2 -R 2 -r 200mbit -t 60 -- \
  'echo "env $GW_RANK $GW_WORLD_SIZE $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GW_STORE $MASTER_ADDR:$MASTER_PORT $GW_SOCKET_IFNAME $TB_HOST"
   tc qdisc show dev d0' 2>&1)
rc=$?
[ $rc -eq 77 ] && { echo "$out" >&2; exit 77; }
[ $rc -eq 0 ] || { echo "$out" >&2; fail "testbed exited $rc"; }
for r in 0 1 2 3; do
  h=$((r / 2)); l=$((r % 2))
  line=$(grep "^\[h${h}r$r\] env" <<<"$out") || { echo "$out" >&2; fail "no output from rank $r"; }
  read -r _ _ grank gws rank ws lrank lws store master ifname host <<<"$line"
  [ "$grank $gws $rank $ws $lrank $lws $ifname $host" = "$r 4 $r 4 $l 2 d0 $h" ] ||
    fail "rank $r environment: $line"
  [ "$store" = "$master" ] && [ "${store%:*}" = 10.79.0.1 ] || fail "rank $r store: $line"
done
[ "$(grep -c 'tbf .*rate 200Mbit' <<<"$out")" -eq 4 ] || { echo "$out" >&2; fail "tbf 200Mbit not on every rank's d0"; }

# A failing rank fails the run, and cleanup still happens.
bash "$tb" -n 2 -R 2 -t 60 -- '[ "$GW_RANK" != 3 ]' 2>/dev/null && fail "a failing rank was not reported"
left_behind

# The namespaces of a session killed with SIGKILL (no process inside, creator gone) are removed
# by the next session; a live session's are not.
dead=999999
while kill -0 "$dead" 2>/dev/null; do dead=$((dead - 1)); done
stale="gwtb$(printf '%06d' "$dead")"
ip netns add "${stale}h0" && ip netns add "${stale}sw" || fail "ip netns add failed"
TB_STALE_AGE_S=0 bash "$tb" -n 1 -t 60 -- true 2>/dev/null || fail "a session beside stale namespaces failed"
[ -z "$(ip netns list | grep "^$stale")" ] ||
  { ip netns del "${stale}h0"; ip netns del "${stale}sw"; fail "a killed session's namespaces were kept"; }
live="gwtb$(printf '%06d' $(($$ % 1000000)))"
ip netns add "${live}h0" || fail "ip netns add failed"
TB_STALE_AGE_S=0 bash "$tb" -n 1 -t 60 -- true 2>/dev/null
kept=$(ip netns list | grep -c "^${live}h0")
ip netns del "${live}h0"
[ "$kept" = 1 ] || fail "the namespaces of a live session (creator $$) were removed"
left_behind

# A real job: 2 hosts x 2 ranks over the shaped link, checked results.
out=$(bash "$tb" -n 2 -R 2 -r 1gbit -t 120 -- "$perf allreduce -b 1M -e 4M -f 4 -n 3 -w 1 --check" 2>&1)
rc=$?
[ $rc -eq 0 ] || { echo "$out" >&2; fail "2x2 allreduce over the testbed exited $rc"; }
grep -q "Out of bounds values : 0 OK" <<<"$out" || { echo "$out" >&2; fail "allreduce check failed"; }
left_behind
# The default tcp interface is the one routing to the store's host (c0 here, although d0 comes
# first), as NCCL follows the route to its bootstrap address; GW_SOCKET_IFNAME=d0 still wins.
out=$(bash "$tb" -n 2 -R 1 -t 60 -- \
  "env -u GW_SOCKET_IFNAME $perf allreduce --transport tcp -b 1K -e 1K -n 1 -w 0" 2>&1)
rc=$?
[ $rc -eq 0 ] || { echo "$out" >&2; fail "allreduce without GW_SOCKET_IFNAME exited $rc"; }
grep -q "# transport: tcp on c0:10.79.0.1 " <<<"$out" ||
  { echo "$out" >&2; fail "default interface is not the route to the store (c0)"; }
out=$(bash "$tb" -n 2 -R 1 -t 60 -- "$perf allreduce --transport tcp -b 1K -e 1K -n 1 -w 0" 2>&1)
rc=$?
[ $rc -eq 0 ] || { echo "$out" >&2; fail "allreduce with GW_SOCKET_IFNAME=d0 exited $rc"; }
grep -q "# transport: tcp on d0:10.77.0.1 " <<<"$out" ||
  { echo "$out" >&2; fail "GW_SOCKET_IFNAME=d0 did not choose d0"; }

# -S/-W: a service per host, ready before the ranks start, stopped (SIGTERM) after them; one that
# ignores SIGTERM is killed and fails the session, as does one that dies early.
bash "$tb" -S true -- true 2>/dev/null; [ $? -eq 2 ] || fail "-S without -W accepted"
svc=$(mktemp -d)
# The service writes its pid once the host's TB_* environment is there; the ranks find it running.
out=$(bash "$tb" -n 2 -R 2 -t 60 \
  -S "trap 'echo stopped >$svc/h\$TB_HOST.stopped; exit 0' TERM
      echo \$\$ \$TB_HOST \$GW_SOCKET_IFNAME >$svc/h\$TB_HOST.up; while :; do sleep 0.1; done" \
  -W "[ -s $svc/h\$TB_HOST.up ]" -- \
  "read -r pid host ifname <$svc/h\$TB_HOST.up && kill -0 \$pid && [ \$host = \$TB_HOST ] && [ \$ifname = d0 ]" 2>&1)
rc=$?
[ $rc -eq 0 ] || { echo "$out" >&2; rm -rf "$svc"; fail "ranks beside a service exited $rc"; }
for h in 0 1; do
  [ -e "$svc/h$h.stopped" ] || { rm -rf "$svc"; fail "the service of host $h was not stopped with SIGTERM"; }
done
out=$(TB_SERVICE_STOP_S=1 bash "$tb" -n 1 -R 1 -t 60 -S "trap '' TERM; while :; do sleep 0.1; done" \
  -W true -- true 2>&1)
[ $? -eq 1 ] && grep -q "did not stop within 1s" <<<"$out" ||
  { echo "$out" >&2; rm -rf "$svc"; fail "a service ignoring SIGTERM was not killed and reported"; }
out=$(bash "$tb" -n 1 -R 1 -t 60 -S "exit 3" -W false -- true 2>&1)
[ $? -eq 1 ] && grep -q "exited with status 3 before it was ready" <<<"$out" ||
  { echo "$out" >&2; rm -rf "$svc"; fail "a service dying before it was ready was not reported"; }
rm -rf "$svc"
left_behind
echo "testbed_test: ok"
