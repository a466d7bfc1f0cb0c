#!/usr/bin/env bash
# gradwire under a real two-node Slurm on this machine (issue 34, item 10): each node is a
# network namespace, as tests/testbed/ makes hosts. As root, the test makes its cluster in a
# temporary folder: a bridge and two namespaces (10.79.N.1 and .2, the bridge .254), munged on its
# own socket, slurmctld in this namespace and one slurmd per node namespace. A slurmd enters only
# its node's network namespace (nsenter --net), so it keeps this machine's cgroup mounts, which
# `ip netns exec` would hide behind a fresh sysfs (Slurm 22.05 will not start without them), plus
# a UTS namespace with the node's hostname and a mount namespace where /etc/hosts names the nodes
# and the nodes' TmpFS is the node's own (PMIx makes its per-step folders there).
# Then one `sbatch -N 2` job runs:
#   1. `srun --mpi=none` one rank per node with GW_STORE on node 1: rank and size from
#      SLURM_PROCID/SLURM_NTASKS, every rank's sum right, the two ranks on different hosts over
#      tcp (each names its node's address);
#   2. when `srun --mpi=list` offers pmix, `srun --mpi=pmix -n 4` (2 ranks per node): the store
#      from PMIx alone, every rank's sum right.
# Every wait has a deadline; on every exit the job is cancelled, the daemons stopped, the
# namespaces, the bridge and the folder removed. Exit 77 (skip) when not root, when munge, Slurm,
# nsenter or unshare is missing, or when network namespaces cannot be made.
# usage: slurm_netns_test.sh HELLO_ALLREDUCE
set -uo pipefail
hello=$1
say() { echo "slurm_netns_test: $*"; }
fail() {
  say "FAIL: $*" >&2
  for f in slurmctld.log slurmd.gwsn1.log slurmd.gwsn2.log munged.log; do
    [ -f "$dir/$f" ] && { echo "--- $f (last lines)" >&2; tail -15 "$dir/$f" >&2; }
  done
  exit 1
}

source "$(dirname "${BASH_SOURCE[0]}")/slurm_lib.sh"
slurm_lib_need_tools nsenter unshare ip

id=$(($$ % 10000))
br="gwsl${id}b"
net="10.79.$(($$ % 250))"
nss=("gwsl${id}n1" "gwsl${id}n2")
dir=$(mktemp -d /tmp/gw_slurm_netns_test.XXXXXX)
chmod 755 "$dir"
pids=()
cleanup() {
  if [ -f "$dir/slurm.conf" ]; then
    SLURM_CONF=$dir/slurm.conf timeout 10 scancel --full --quiet --partition=gw 2>/dev/null || true
  fi
  stop_daemons
  slurm_scope_cleanup
  for ns in "${nss[@]}"; do ip netns del "$ns" 2>/dev/null; done
  ip link del "$br" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# The two hosts: a veth each, on one bridge in this namespace.
if ! ip link add "$br" type bridge 2>/dev/null; then
  say "skipped: cannot make a bridge (network namespaces need root and CAP_NET_ADMIN)"
  exit 77
fi
ip addr add "$net.254/24" dev "$br" && ip link set "$br" up || fail "bridge $br"
for i in 1 2; do
  ns=${nss[i - 1]}
  ip netns add "$ns" || fail "ip netns add $ns"
  ip link add "${br%b}v$i" type veth peer name eth0 netns "$ns" || fail "veth for $ns"
  ip link set "${br%b}v$i" master "$br" up
  ip -n "$ns" addr add "$net.$i/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
done

start_munge

host=$(hostname -s)
cat >"$dir/hosts" <<EOF
127.0.0.1 localhost
$net.254 $host
$net.1 gwsn1
$net.2 gwsn2
EOF
ctld_port=$(free_port)
slurmd_port=$(free_port)
mkdir -p "$dir/ctld" "$dir/spool/gwsn1" "$dir/spool/gwsn2" "$dir/tmp" "$dir/tmp1" "$dir/tmp2"
cat >"$dir/slurm.conf" <<EOF
# Two nodes as network namespaces, for tests/ops/slurm_netns_test.sh.
ClusterName=gwtest2
SlurmctldHost=$host($net.254)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmdSpoolDir=$dir/spool/%n
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmdLogFile=$dir/slurmd.%n.log
$(slurm_common_conf)
TmpFS=$dir/tmp
NodeName=gwsn1 NodeHostname=gwsn1 NodeAddr=$net.1 CPUs=2 State=UNKNOWN
NodeName=gwsn2 NodeHostname=gwsn2 NodeAddr=$net.2 CPUs=2 State=UNKNOWN
PartitionName=gw Nodes=gwsn1,gwsn2 Default=YES MaxTime=5 State=UP OverSubscribe=YES
EOF
echo "IgnoreSystemd=yes" >"$dir/cgroup.conf"
export SLURM_CONF=$dir/slurm.conf

slurmctld -D -i -f "$SLURM_CONF" >"$dir/slurmctld.out" 2>&1 &
pids+=($!)
wait_until 30 "answer from slurmctld" scontrol ping
for i in 1 2; do
  nsenter --net="/run/netns/${nss[i - 1]}" unshare --uts --mount sh -c \
    "hostname gwsn$i && mount --bind '$dir/hosts' /etc/hosts && mount --bind '$dir/tmp$i' '$dir/tmp' &&
     exec slurmd -D -N gwsn$i -f '$SLURM_CONF'" \
    >"$dir/slurmd.$i.out" 2>&1 &
  pids+=($!)
done
wait_nodes_idle 60 "${pids[-2]}" "${pids[-1]}"
say "cluster up: slurmctld $net.254:$ctld_port, slurmd gwsn1 $net.1 and gwsn2 $net.2"

mpis=$(srun --mpi=list 2>&1)
pmix=0
grep -qw pmix <<<"$mpis" && pmix=1
cat >"$dir/job.sh" <<EOF
#!/bin/bash
#SBATCH -N 2
#SBATCH --ntasks-per-node=1
#SBATCH --time=2
#SBATCH --output=$dir/job.out
export GW_TIMEOUT_MS=20000 GW_LOG_LEVEL=info GW_JOB_TOKEN=slurm-netns-test
echo "hosts: \$(srun hostname | sort | tr '\n' ' ')"
GW_STORE=$net.1:$(free_port) srun --mpi=none "$hello"
if [ $pmix = 1 ]; then
  echo "--- pmix"
  srun --mpi=pmix --ntasks=4 --ntasks-per-node=2 --overcommit "$hello"
fi
EOF
job=$(sbatch --parsable "$dir/job.sh" 2>&1) || fail "sbatch: $job"
job=${job%%;*}
wait_job "$job" "$dir/job.out"
out=$(cat "$dir/job.out")
grep -q "^hosts: gwsn1 gwsn2 $" <<<"$out" || fail "the job's steps did not run on both nodes: $out"
plain=$(sed '/^--- pmix/,$d' <<<"$out")
check_ranks "$plain" 2 || fail "srun --mpi=none: not both ranks summed right: $out"
for i in 1 2; do
  grep -q "rank $((i - 1)) of 2, launcher Slurm.*transport tcp (eth0:$net.$i" <<<"$plain" ||
    fail "rank $((i - 1)) did not run on gwsn$i over tcp ($net.$i): $out"
done
say "sbatch -N 2, srun --mpi=none: 2 ranks on gwsn1 and gwsn2 over tcp, sums ok"
if [ $pmix = 1 ]; then
  pmixed=$(sed -n '/^--- pmix/,$p' <<<"$out")
  check_ranks "$pmixed" 4 || fail "srun --mpi=pmix -n 4 over 2 nodes: not every rank summed right: $out"
  grep -q "store .*(PMIx)" <<<"$pmixed" || fail "srun --mpi=pmix: the store did not come from PMIx: $out"
  say "sbatch -N 2, srun --mpi=pmix -n 4: 4 ranks (2 per node) ok"
else
  say "srun --mpi=list offers no pmix ($(tr '\n' ' ' <<<"$mpis")): the PMIx step is left out"
fi
say "ok"
