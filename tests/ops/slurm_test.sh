#!/usr/bin/env bash
# gradwire under a real Slurm on this machine (issue 34, item 10). As root, the test makes a
# one-node cluster of its own in a temporary folder: a munge key and munged on its own socket, a
# slurm.conf (the node "gwnode" at 127.0.0.1 with 4 CPUs, its own slurmctld and slurmd ports, state
# and spool folders in the temporary folder, no cgroups, no accounting), slurmctld and slurmd in
# the foreground of background jobs. Then:
#   1. `srun -n 4 hello_allreduce` with PMIx (`--mpi=pmix`, when `srun --mpi=list` offers it): the
#      ranks, size and store address come from PMIx alone; all 4 ranks print the right sum;
#   2. `srun --mpi=none -n 4` with only GW_STORE set: rank and size from SLURM_PROCID and
#      SLURM_NTASKS (gradwire's launcher detection);
#   3. `sbatch -n 2` of a script running `srun hello_allreduce`, waited for until COMPLETED with
#      exit code 0, and its output checked.
# Every wait has a deadline; on every exit the jobs are cancelled, the daemons stopped and the
# folder removed. Exit 77 (skip) when not root or when munge or Slurm is not installed.
# The jobs are single-node here; tests/ops/slurm_netns_test.sh runs a two-node cluster, one slurmd
# per network namespace.
# With GRADWIRE_PERF, also `srun -n 4 gradwire-perf allreduce -b 1K -e 64K -c` (checked sums).
# usage: slurm_test.sh HELLO_ALLREDUCE [GRADWIRE_PERF]
set -uo pipefail
hello=$1
perf=${2:-}
say() { echo "slurm_test: $*"; }
fail() {
  say "FAIL: $*" >&2
  for f in slurmctld.log slurmd.log munged.log; do
    [ -f "$dir/$f" ] && { echo "--- $f (last lines)" >&2; tail -15 "$dir/$f" >&2; }
  done
  exit 1
}

source "$(dirname "${BASH_SOURCE[0]}")/slurm_lib.sh"
slurm_lib_need_tools

dir=$(mktemp -d /tmp/gw_slurm_test.XXXXXX)
chmod 755 "$dir"  # munged wants its socket's folder searchable by all
pids=()
cleanup() {
  if [ -f "$dir/slurm.conf" ]; then
    SLURM_CONF=$dir/slurm.conf timeout 10 scancel --full --quiet --partition=gw 2>/dev/null || true
  fi
  stop_daemons
  slurm_scope_cleanup
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

start_munge

ctld_port=$(free_port)
slurmd_port=$(free_port)
host=$(hostname -s)
mkdir -p "$dir/ctld" "$dir/spool"
cat >"$dir/slurm.conf" <<EOF
# A one-node cluster for tests/ops/slurm_test.sh.
ClusterName=gwtest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmdSpoolDir=$dir/spool
SlurmdPidFile=$dir/slurmd.pid
SlurmdLogFile=$dir/slurmd.log
$(slurm_common_conf)
TmpFS=$dir
NodeName=gwnode NodeHostname=$host NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=gw Nodes=gwnode Default=YES MaxTime=5 State=UP OverSubscribe=YES
EOF
# slurmd runs outside systemd here: under cgroup v2 it makes its slurmstepd scope itself instead of
# asking systemd over D-Bus (Slurm 22.05's IgnoreSystemd; cgroup v1 ignores it).
cat >"$dir/cgroup.conf" <<EOF
IgnoreSystemd=yes
EOF
export SLURM_CONF=$dir/slurm.conf

slurmctld -D -i -f "$SLURM_CONF" >"$dir/slurmctld.out" 2>&1 &
pids+=($!)
wait_until 30 "answer from slurmctld" scontrol ping
slurmd -D -N gwnode -f "$SLURM_CONF" >"$dir/slurmd.out" 2>&1 &
pids+=($!)
wait_nodes_idle 60 "${pids[-1]}"
say "cluster up: slurmctld :$ctld_port, slurmd gwnode :$slurmd_port, munge $dir/munge/munge.sock"

common_env=(GW_TIMEOUT_MS=20000)
mpis=$(srun --mpi=list 2>&1)
if grep -qw pmix <<<"$mpis"; then
  out=$(env "${common_env[@]}" GW_LOG_LEVEL=info timeout 120 srun --mpi=pmix -n 4 --time=2 \
    "$hello" 2>&1) || fail "srun --mpi=pmix -n 4: $out"
  check_ranks "$out" 4 || fail "srun --mpi=pmix -n 4: not every rank summed right: $out"
  grep -q "store .*(PMIx)" <<<"$out" ||
    fail "srun --mpi=pmix: the store did not come from PMIx: $out"
  say "srun --mpi=pmix -n 4: 4 ranks ok, store from PMIx"
  if [ -n "$perf" ]; then
    out=$(env "${common_env[@]}" timeout 180 srun --mpi=pmix -n 4 --time=3 "$perf" allreduce \
      -b 1K -e 64K -c 2>&1) || fail "srun --mpi=pmix -n 4 gradwire-perf allreduce -c: $out"
    grep -q "^ *65536 " <<<"$out" || fail "gradwire-perf under srun printed no 64K row: $out"
    say "srun --mpi=pmix -n 4 gradwire-perf allreduce -b 1K -e 64K -c: checked, rows 1K..64K"
  fi
else
  say "srun --mpi=list offers no pmix ($(tr '\n' ' ' <<<"$mpis")): the PMIx run is left out"
fi

store_port=$(free_port)
out=$(env "${common_env[@]}" GW_STORE="127.0.0.1:$store_port" \
  timeout 120 srun --mpi=none -n 4 --time=2 "$hello" 2>&1) ||
  fail "srun --mpi=none -n 4 with GW_STORE: $out"
check_ranks "$out" 4 || fail "srun --mpi=none -n 4: not every rank summed right: $out"
say "srun --mpi=none -n 4 (SLURM_PROCID/SLURM_NTASKS, GW_STORE): 4 ranks ok"

mpi=none
grep -qw pmix <<<"$mpis" && mpi=pmix
cat >"$dir/job.sh" <<EOF
#!/bin/bash
#SBATCH --ntasks=2
#SBATCH --time=2
#SBATCH --output=$dir/job.out
export GW_TIMEOUT_MS=20000
[ $mpi = pmix ] || export GW_STORE=127.0.0.1:$(free_port)
srun --mpi=$mpi "$hello"
EOF
job=$(sbatch --parsable "$dir/job.sh" 2>&1) || fail "sbatch: $job"
job=${job%%;*}
wait_job "$job" "$dir/job.out"
out=$(cat "$dir/job.out")
check_ranks "$out" 2 || fail "sbatch job $job: not both ranks summed right: $out"
say "sbatch -n 2 (srun --mpi=$mpi inside): job $job COMPLETED, 2 ranks ok"
say "ok"
