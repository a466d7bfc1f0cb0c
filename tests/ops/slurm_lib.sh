# Shared by tests/ops/slurm_test.sh and slurm_netns_test.sh (sourced, not run): a private munge,
# deadlines, rank checks and a batch job's wait. The caller sets `dir` (its temporary folder) and
# `pids` (daemons to stop, oldest first), and defines `fail` and `say`.

py=/usr/bin/python3
[ -x "$py" ] || py=python3

slurm_lib_need_tools() {
  [ "$(id -u)" -eq 0 ] || { say "skipped: needs root (slurmd runs jobs as their user)"; exit 77; }
  local t
  for t in munged mungekey slurmctld slurmd srun sbatch scontrol scancel sinfo "$@"; do
    command -v "$t" >/dev/null || {
      say "skipped: no $t (Debian: apt-get install munge slurmctld slurmd slurm-client)"
      exit 77
    }
  done
}

# A TCP port free on every address, below the kernel's ephemeral range (20000-28999), so that no
# other test's connect() can be handed it between this check and the daemon's bind: a port from
# bind(0) comes from that range, and slurmctld once failed on one ("Address already in use").
# Where the range starts lower, the kernel's pick.
free_port() {
  "$py" -c '
import random, socket
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(200 if lo > 20001 else 0):
    p = random.randrange(20000, min(lo, 29000))
    with socket.socket() as s:
        try:
            s.bind(("", p))
        except OSError:
            continue
    print(p)
    break
else:
    with socket.socket() as s:
        s.bind(("", 0))
        print(s.getsockname()[1])'
}

# wait_until SECONDS WHAT COMMAND...: until COMMAND succeeds, failing after SECONDS or when a
# daemon of `pids` exited.
wait_until() {
  local limit=$1 what=$2
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || fail "no $what after $limit s"
    for p in "${pids[@]}"; do
      kill -0 "$p" 2>/dev/null || fail "waiting for $what: a daemon (pid $p) exited"
    done
    sleep 0.2
  done
}

# stop_daemons: newest first; then any job step that outlived its slurmd (slurmstepd
# daemonizes) and runs from our spool folder.
stop_daemons() {
  local i p
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    p=${pids[i]}
    kill "$p" 2>/dev/null || continue
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  for p in $(pgrep -f "slurmstepd.*$dir" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
}

# start_munge: a key of our own and a daemon on our own socket, $dir/munge/munge.sock.
start_munge() {
  mkdir -m 700 "$dir/munge"
  mungekey --create --keyfile="$dir/munge/munge.key" --bits=1024 || fail "mungekey failed"
  munged --foreground --force --socket="$dir/munge/munge.sock" --key-file="$dir/munge/munge.key" \
    --log-file="$dir/munged.log" --pid-file="$dir/munge/munged.pid" \
    --seed-file="$dir/munge/munged.seed" >/dev/null 2>&1 &
  pids+=($!)
  chmod 755 "$dir/munge"
  wait_until 10 "munge socket" test -S "$dir/munge/munge.sock"
}

# The slurm.conf lines every test cluster shares (after its own host and port lines).
slurm_common_conf() {
  cat <<EOC
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.sock
StateSaveLocation=$dir/ctld
SlurmctldPidFile=$dir/slurmctld.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
EOC
}

# check_ranks OUTPUT N: every rank 0..N-1 printed the sum of 1..N, each once.
check_ranks() {
  local out=$1 n=$2 want r
  want=$((n * (n + 1) / 2))
  for ((r = 0; r < n; r++)); do
    [ "$(grep -c "hello_allreduce: rank $r of $n, gradwire .*: sum $want (ok)" <<<"$out")" = 1 ] ||
      return 1
  done
}

# wait_job JOB OUTPUT_FILE: until the batch job is COMPLETED with exit code 0 (120 s), else fail
# with its state and output. Leaves `info` (scontrol's line) set.
wait_job() {
  local job=$1 out=$2 state="" deadline=$((SECONDS + 120))
  while [ $SECONDS -lt $deadline ]; do
    info=$(scontrol -o show job "$job" 2>&1)
    state=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$info")
    case "$state" in
      COMPLETED) break ;;
      FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED)
        fail "sbatch job $job ended $state: $info; output: $(cat "$out" 2>/dev/null)" ;;
    esac
    sleep 0.5
  done
  [ "$state" = COMPLETED ] || fail "sbatch job $job not done in 120 s (state ${state:-unknown})"
  grep -q "ExitCode=0:0" <<<"$info" || fail "sbatch job $job: $info"
}

# wait_nodes_idle SECONDS SLURMD_PIDS...: until every node of partition gw is idle in sinfo.
# Slurm 22.05 cannot start slurmd in some cgroup set-ups (a hybrid v1/v2 mount, no cgroup file
# system at all): that is this machine's limit, not gradwire's, and skips the test naming it.
wait_nodes_idle() {
  local limit=$1 p why
  shift
  local deadline=$((SECONDS + limit))
  until [ "$(sinfo -h -p gw -o %t 2>/dev/null | sort -u)" = idle ]; do
    for p in "$@"; do
      kill -0 "$p" 2>/dev/null && continue
      why=$(grep -h -i -E "fatal|error" "$dir"/slurmd*.log "$dir"/slurmd*.out 2>/dev/null |
        grep -i cgroup | grep -v cgroup.conf | head -2)  # (our cgroup.conf is ours to get right)
      if [ -n "$why" ]; then
        say "skipped: slurmd cannot start with this machine's cgroups: $why"
        exit 77
      fi
      fail "slurmd exited"
    done
    [ $SECONDS -lt $deadline ] ||
      fail "nodes not idle in sinfo after $limit s (states: $(sinfo -h -p gw -o %t 2>/dev/null))"
    sleep 0.2
  done
}

# Under cgroup v2, slurmd makes its slurmstepd scope itself (cgroup.conf's IgnoreSystemd, as it
# runs outside systemd here); slurm_scope_cleanup removes it again when this test made it.
scope=/sys/fs/cgroup/system.slice/slurmstepd.scope
made_scope=""
[ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" = cgroup2fs ] && [ ! -e "$scope" ] && made_scope=1
slurm_scope_cleanup() {
  if [ -n "$made_scope" ] && [ -d "$scope" ]; then
    find "$scope" -depth -type d -exec rmdir {} \; 2>/dev/null
  fi
}
