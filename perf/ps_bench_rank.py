#!/usr/bin/env python3
"""One worker of perf/ps_bench.sh (run by the testbed in its host's namespace; not by hand).

    ps_bench_rank.py --bytes B --partition P -n ITERS -r REPS --ceiling-port PORT

In one process, on the same workers and buffer: (1) the ceiling: every worker streams B bytes of
plain TCP over d0 to the next worker while receiving B from the previous one, all at once (what
the shaped links and this machine's CPUs carry with every host sending and receiving); (2) then,
REPS times interleaved: gw_allreduce (sum; GW_ALGO as the environment sets) of B bytes of float32,
and KVStore push_pull (bsp, sum, partitions of P bytes, then clock) of the same buffer, ITERS
timed calls each after one warm-up. Every result is checked (the sum of the ranks' values).
Rank 0 prints one line per figure: "RESULT name=value ..." with the median seconds per call.
"""
import argparse
import socket
import statistics
import threading
import time

import numpy as np

import gradwire
import gradwire.kv

ap = argparse.ArgumentParser()
ap.add_argument("--bytes", type=int, required=True)
ap.add_argument("--partition", type=int, required=True)
ap.add_argument("-n", type=int, default=3)
ap.add_argument("-r", type=int, default=2)
ap.add_argument("--ceiling-port", type=int, required=True)
ap.add_argument("--skip-allreduce", action="store_true")
a = ap.parse_args()

comm = gradwire.init()
r, n = comm.rank, comm.size
count = a.bytes // 4


def ip(rank: int) -> str:
    return f"10.77.0.{rank + 1}"  # the testbed's data address of host `rank`


def ceiling() -> float:
    """Seconds to send a.bytes to the next worker while receiving a.bytes from the previous."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((ip(r), a.ceiling_port))
    srv.listen(1)
    comm.barrier()
    got = [0]

    def recv() -> None:
        c, _ = srv.accept()
        buf = bytearray(1 << 20)
        while got[0] < a.bytes:
            k = c.recv_into(buf)
            if k == 0:
                break
            got[0] += k
        c.close()

    t = threading.Thread(target=recv)
    t.start()
    out = socket.create_connection((ip((r + 1) % n), a.ceiling_port))
    payload = memoryview(bytearray(1 << 20))
    comm.barrier()
    t0 = time.monotonic()
    sent = 0
    while sent < a.bytes:
        sent += out.send(payload[: min(len(payload), a.bytes - sent)])
    t.join()
    dt = time.monotonic() - t0
    out.close()
    srv.close()
    assert got[0] == a.bytes, f"ceiling: received {got[0]} of {a.bytes} bytes"
    return dt


def worst(x: float) -> float:
    """The slowest rank's figure (every rank's call must have finished)."""
    v = np.array([x], np.float64)
    comm.allreduce(v, op="max")
    return float(v[0])


ceil_s = worst(ceiling())
value = np.full(count, r + 1, np.float32)
expect = n * (n + 1) / 2
buf = np.empty(count, np.float32)
kv = gradwire.kv.KVStore(comm, mode="bsp", update="sum", partition_bytes=a.partition)
kv.init(0, np.zeros(count, np.float32))
times = {"allreduce": [], "kv": []}
for rep in range(a.r):
    for what in ("allreduce", "kv"):
        if what == "allreduce" and a.skip_allreduce:
            continue
        for it in range(a.n + (1 if rep == 0 else 0)):
            buf[:] = value
            comm.barrier()
            t0 = time.monotonic()
            if what == "allreduce":
                comm.allreduce(buf)
            else:
                kv.pushpull(0, buf)
                kv.clock()
            dt = worst(time.monotonic() - t0)
            if not (buf[0] == expect and buf[-1] == expect and np.all(buf == expect)):
                raise SystemExit(f"rank {r}: {what}: wrong result {buf[:4]}, expected {expect}")
            if rep > 0 or it > 0:  # the first call of the run is the warm-up
                times[what].append(dt)
kv.close()
if r == 0:
    fig = {k: statistics.median(v) for k, v in times.items() if v}
    print("RESULT " + " ".join([f"ceiling_s={ceil_s:.4f}"] +
                               [f"{k}_s={v:.4f}" for k, v in fig.items()] +
                               [f"{k}_runs={len(v)}" for k, v in times.items() if v]), flush=True)
comm.close()
