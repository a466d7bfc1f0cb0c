#!/usr/bin/env python3
"""Compressed kv pushes on loopback (docs/parameter-server.md, "Compressed pushes"): 2 workers,
co-located servers, one key of --bytes float32 (partitions of --partition bytes), bsp push_pull
(sum) then clock, for codec none, fp16 and topk:0.01. Run it as

    python3 -m gradwire.run -np 2 -- /usr/bin/python3 perf/ps_codec_bench.py [--bytes 16M]

Rank 0 prints per codec: the bytes one worker's pushes put on the wire per clock (the push
frames: 80-byte header + payload per partition, payload = the codec's encoded size, as
docs/wire-kv.md gives it; computed, not sniffed) and the median seconds of the slowest rank's
push_pull + clock over -n calls after one warm-up. The ceiling, in the same run: rank 0 streams
--bytes over one loopback TCP connection to itself (the copy a raw push costs at the least).
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
ap.add_argument("--bytes", default="16M")
ap.add_argument("--partition", type=int, default=4 << 20)
ap.add_argument("-n", type=int, default=7)
a = ap.parse_args()
nbytes = int(a.bytes[:-1]) << 20 if a.bytes.endswith("M") else int(a.bytes)
count = nbytes // 4
per = a.partition // 4
parts = [min(per, count - p) for p in range(0, count, per)]


def push_bytes(codec):
    """One worker's push frames per clock (kv/wire.h header + the codec's encoded_size)."""
    def enc(n):
        if codec is None:
            return 4 * n
        if codec == "fp16":
            return 2 * n
        if codec.startswith("topk:"):
            return 8 + 8 * max(1, round(float(codec[5:]) * n))
        raise ValueError(codec)
    return sum(80 + enc(n) for n in parts)


def ceiling():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    out = socket.create_connection(srv.getsockname())
    inc, _ = srv.accept()
    payload = memoryview(bytearray(nbytes))
    got = [0]

    def recv():
        buf = bytearray(4 << 20)
        while got[0] < nbytes:
            k = inc.recv_into(buf)
            if k == 0:
                break
            got[0] += k
    best = float("inf")
    for _ in range(3):
        got[0] = 0
        t = threading.Thread(target=recv)
        t0 = time.monotonic()
        t.start()
        out.sendall(payload)
        t.join()
        best = min(best, time.monotonic() - t0)
    for s in (out, inc, srv):
        s.close()
    return best


comm = gradwire.init()
r = comm.rank
rng = np.random.default_rng(r)
grad = rng.standard_normal(count).astype(np.float32)
if r == 0:
    print(f"RESULT ceiling_loopback_s={ceiling():.4f} bytes={nbytes}", flush=True)
for codec in (None, "fp16", "topk:0.01"):
    with gradwire.kv.KVStore(comm, mode="bsp", codec=codec, partition_bytes=a.partition) as kv:
        kv.init(1, np.zeros(count, np.float32))
        out = np.empty(count, np.float32)
        times = []
        for i in range(a.n + 1):
            comm.barrier()
            t0 = time.monotonic()
            kv.pushpull(1, grad, out)
            kv.clock()
            dt = np.array([time.monotonic() - t0], np.float64)
            comm.allreduce(dt, op="max")
            if i > 0:
                times.append(float(dt[0]))
        assert np.all(np.isfinite(out))
        if codec is None:  # the raw sum is exact for two ranks' values
            mine = grad.copy()
            comm.allreduce(mine)
            assert np.array_equal(out, mine)
    if r == 0:
        print(f"RESULT codec={codec or 'none'} push_bytes_per_clock={push_bytes(codec)} "
              f"pushpull_clock_s={statistics.median(times):.4f}", flush=True)
