#!/usr/bin/env python3
"""One worker of perf/ps_bench.sh (run by the testbed in its host's namespace; not by hand).

    ps_bench_rank.py --bytes B --partition P [--chunks C[,C...]] -n ITERS -r REPS
    ps_bench_rank.py --ceiling-only --hosts H --bytes B --ceiling-port PORT [--ceiling-streams S]

--ceiling-only (every host of a session): the machine ceiling of perf/link_ceiling.py (every host
streams B bytes of plain TCP to the next while receiving B, all at once, over S connections per
link, default 4); each host prints
"CEILING seconds". Otherwise, in one process, on the same workers and buffer,
REPS times interleaved (kv_keys: the same buffer as B/P keys of P bytes, every part's ipushpull
in flight at once, as BytePS partitions a tensor into keys on the worker): gw_allreduce (sum; GW_ALGO as the environment sets) of B bytes of float32,
and KVStore push_pull (bsp, sum, partitions of P bytes, then clock) of the same buffer, ITERS
timed calls each after one warm-up; one store per chunk size C of --chunks (GW_KV_CHUNK_BYTES when
it is made: 0 = whole partitions), each with its kv and kv_keys rows (names suffixed _cC).
Every result is checked (the sum of the ranks' values).
Rank 0 prints one line per figure: "RESULT name=value ..." with the median seconds per call.
"""
import argparse
import os
import statistics
import time

import numpy as np

import gradwire
import gradwire.kv

ap = argparse.ArgumentParser()
ap.add_argument("--bytes", type=int, required=True)
ap.add_argument("--partition", type=int, default=4 << 20)
ap.add_argument("--chunks", default="", help="comma-separated chunk bytes, one store each")
ap.add_argument("-n", type=int, default=3)
ap.add_argument("-r", type=int, default=2)
ap.add_argument("--ceiling-port", type=int, default=0)
ap.add_argument("--ceiling-only", action="store_true")
ap.add_argument("--ceiling-streams", type=int, default=4)
ap.add_argument("--hosts", type=int, default=0)
a = ap.parse_args()
count = a.bytes // 4


if a.ceiling_only:
    from link_ceiling import ceiling  # perf/link_ceiling.py, beside this script

    secs = ceiling(int(os.environ["TB_HOST"]), a.hosts, a.bytes, a.ceiling_port, a.ceiling_streams)
    print(f"CEILING {secs:.4f}", flush=True)
    raise SystemExit(0)

comm = gradwire.init()
r, n = comm.rank, comm.size


def worst(x: float) -> float:
    """The slowest rank's figure (every rank's call must have finished)."""
    v = np.array([x], np.float64)
    comm.allreduce(v, op="max")
    return float(v[0])


value = np.full(count, r + 1, np.float32)
expect = n * (n + 1) / 2
buf = np.empty(count, np.float32)
chunks = [int(c) for c in a.chunks.split(",") if c != ""] or [None]
part = max(1, a.partition // 4)
pieces = [(1 + i, s) for i, s in enumerate(range(0, count, part))]
stores = {}
for c in chunks:
    if c is not None:  # read by the store's creation (kv/client.cc), then fixed for the store
        os.environ["GW_KV_CHUNK_BYTES"] = str(c)
    kv = gradwire.kv.KVStore(comm, mode="bsp", update="sum", partition_bytes=a.partition)
    kv.init(0, np.zeros(count, np.float32))
    for key, start in pieces:
        kv.init(key, np.zeros(min(part, count - start), np.float32))
    stores["" if c is None else f"_c{c}"] = kv
whats = ["allreduce"] + [f"{w}{sfx}" for sfx in stores for w in ("kv", "kv_keys")]
times = {w: [] for w in whats}
for rep in range(a.r):
    for what in whats:
        kv = stores.get(what[what.index("_c"):] if "_c" in what else "")
        for it in range(a.n + (1 if rep == 0 else 0)):
            buf[:] = value
            comm.barrier()
            t0 = time.monotonic()
            if what == "allreduce":
                comm.allreduce(buf)
            elif what.startswith("kv_keys"):
                reqs = [kv.ipushpull(key, buf[s:s + part], priority=-key)
                        for key, s in pieces]
                for q in reqs:
                    q.wait()
                kv.clock()
            else:
                kv.pushpull(0, buf)
                kv.clock()
            dt = worst(time.monotonic() - t0)
            if not (buf[0] == expect and buf[-1] == expect and np.all(buf == expect)):
                raise SystemExit(f"rank {r}: {what}: wrong result {buf[:4]}, expected {expect}")
            if rep > 0 or it > 0:  # the first call of the run is the warm-up
                times[what].append(dt)
for kv in stores.values():
    kv.close()
if r == 0:
    fig = {k: statistics.median(v) for k, v in times.items() if v}
    print("RESULT " + " ".join([f"{k}_s={v:.4f}" for k, v in fig.items()] +
                               [f"{k}_runs={len(v)}" for k, v in times.items() if v]), flush=True)
comm.close()
