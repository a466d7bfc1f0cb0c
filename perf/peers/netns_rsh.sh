#!/usr/bin/env bash
# Open MPI's remote-shell agent for the namespace testbed (mpirun --mca plm_rsh_agent THIS):
# "THIS HOST COMMAND..." runs COMMAND in network namespace HOST, as ssh would on a real host,
# with a UTS namespace of its own whose hostname is HOST, so that each testbed host's orted has
# its own node name (and session directory) while they all share this machine.
set -eu
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done  # ssh-style options, if any
host="$1"; shift
ip netns list | grep -q "^$host\b" || { echo "netns_rsh: no namespace '$host'" >&2; exit 255; }
exec ip netns exec "$host" unshare --uts /bin/sh -c 'hostname "$0" && exec /bin/sh -c "$1"' "$host" "$*"
