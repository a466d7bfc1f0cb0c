#!/usr/bin/env python3
"""The peers' NCCL allreduce (nccl_torch_allreduce.py: N processes on one GPU, each its own NCCL
host through NCCL_HOSTID) with the gradwire plugin in daemon mode, each rank through the gradwired
of its own "host": rank r runs with GW_HOSTID=gwhost<r> (the identity the daemon of that host was
started with) and GW_DAEMON=unix:<SOCKET_DIR>/gwd<r>.sock, so that every connection NCCL makes
between two ranks is a job of two daemons, and its bytes cross the daemons' link (tcp). The
peer's own run() does the rest, so the measurement and its output line are the peer's.

usage: nccl_daemon_allreduce.py PEER_SCRIPT SOCKET_DIR NPROCS SIZE_BYTES...
(perf/gpu/run_nccl_gpu_check.sh starts the daemons and runs this for its "gradwire daemon"
columns.)
"""
import importlib.util
import os
import sys

import torch.multiprocessing as mp


def load_peer(path):
    spec = importlib.util.spec_from_file_location("nccl_torch_allreduce", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(rank, n, sizes, port, peer_path, socket_dir):
    os.environ["GW_HOSTID"] = f"gwhost{rank}"
    os.environ["GW_DAEMON"] = f"unix:{socket_dir}/gwd{rank}.sock"
    load_peer(peer_path).run(rank, n, sizes, port)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    peer_path, socket_dir, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sizes = [int(a) for a in sys.argv[4:]] or [1 << 26]
    for r in range(n):
        if not os.path.exists(f"{socket_dir}/gwd{r}.sock"):
            sys.exit(f"nccl_daemon_allreduce.py: no gradwired socket {socket_dir}/gwd{r}.sock")
    mp.spawn(run, args=(n, sizes, 29700 + os.getpid() % 1000, peer_path, socket_dir), nprocs=n)
