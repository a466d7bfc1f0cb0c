#!/bin/bash
# perf/plugin_daemon_netns.sh small and fast, as ctest plugin_daemon_netns runs it: the script
# refuses bad arguments (status 2, before building anything), the bench's two ends refuse to run
# when they disagree on the transfers (the listening end says so, status 1, within seconds), and
# one short session unshaped and one at 1gbit (4 MiB x 3, 100 round trips, 1 run) complete in
# both modes with every message checked and every daemon-mode connection a job of the two
# namespace hosts' daemons over tcp; then one short session over dpdk (-x dpdk: AF_XDP on d0 for
# direct mode's ends, then for the daemons, which bring their ports up at start), where the DPDK
# port module is built. Not a performance check. 77 where namespaces cannot be made.
# usage: plugin_daemon_netns_test.sh SOURCE_DIR BUILD_DIR
set -u
[ $# -eq 2 ] || { echo "usage: $0 SOURCE_DIR BUILD_DIR" >&2; exit 2; }
src=$1; build=$2
script="$src/perf/plugin_daemon_netns.sh"; peer="$build/tests/plugin/nccl_plugin_peer"
fail() { echo "plugin_daemon_netns_test: FAIL: $*" >&2; exit 1; }
for bad in "-r 10xbit" "-s 0" "-n 0" "-T x" "-x udp"; do
  # shellcheck disable=SC2086
  out=$(bash "$script" -B "$build" $bad 2>&1); rc=$?
  [ $rc -eq 2 ] || fail "'$bad' gave status $rc, expected 2: $out"
done
work=$(mktemp -d)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
# The ends disagree (4 MiB here, 8 MiB there), on loopback: the listener refuses at the hello.
GW_SOCKET_IFNAME=lo timeout 30 "$peer" bench-connect "$work/h" 8M 3 10 >/dev/null 2>&1 &
pids+=($!); disown
out=$(GW_SOCKET_IFNAME=lo timeout 30 "$peer" bench-listen "$work/h" 4M 3 10 2>&1); rc=$?
if [ $rc -ne 1 ] || ! grep -q "the ends disagree" <<<"$out"; then
  fail "mismatched ends: status $rc: $out"
fi
out=$(bash "$script" -B "$build" -r none -r 1gbit -n 1 -s 4M -T 3 -l 100 2>&1); rc=$?
echo "$out"
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || fail "the script ended with status $rc"
n=$(grep -c '^| daemon (each end' <<<"$out")
[ "$n" -eq 2 ] || fail "$n daemon-mode summary rows, expected 2"
if [ -e "$build/capi/libgradwire_dpdk.so" ]; then
  out=$(bash "$script" -B "$build" -x dpdk -r none -n 1 -s 4M -T 3 -l 100 2>&1); rc=$?
  echo "$out"
  [ $rc -eq 0 ] || fail "the script over dpdk ended with status $rc"
  grep -q '^| daemon (each end.*, dpdk between them) | [0-9]' <<<"$out" ||
    fail "no daemon-mode summary row over dpdk"
else
  echo "plugin_daemon_netns_test: no DPDK port module in $build: the dpdk session is not run"
fi
echo "plugin_daemon_netns_test: ok"
