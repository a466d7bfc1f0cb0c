"""Worker: one parameter-server mode's rule with scripted timing (tests/python/test_kv.py).

    kv_rules.py CASE      CASE: bsp | ssp | asp | sync | sgd | kill_asp | kill_bsp

The last rank is the held-back one: it sleeps HOLD seconds at a scripted clock while the others
go on. Each rank checks the values its pulls return against the mode's rule (exact where the
rule is exact, bounds where the rule gives bounds) and the waits against the hold, and prints
"kv CASE ok" (or "kv CASE went on" / "kv CASE raised ..." for the fault cases).
"""
import os
import signal
import sys
import time

import numpy as np

import gradwire
import gradwire.kv

case = sys.argv[1]
HOLD = 1.5
comm = gradwire.init()
r, n = comm.rank, comm.size
last = n - 1


def say(msg: str) -> None:
    print(f"rank {r}: {msg}", flush=True)


def store(mode: str, update: str = "sum") -> gradwire.kv.KVStore:
    return gradwire.kv.KVStore(comm, mode=mode, update=update)


if case == "bsp":
    # Every rank pushes (r+1)*(c+1) in clock c; the last rank holds clock 1 back. A pushpull in
    # clock c returns exactly the clock's sum, and waits for the held-back push.
    kv = store("bsp")
    kv.init(0, np.zeros(5, np.float32))
    total = n * (n + 1) / 2
    for c in range(4):
        if r == last and c == 1:
            time.sleep(HOLD)
        t0 = time.monotonic()
        out = kv.pushpull(0, np.full(5, (r + 1) * (c + 1), np.float32), np.empty(5, np.float32))
        waited = time.monotonic() - t0
        kv.clock()
        assert np.all(out == total * (c + 1)), (c, out)
        if c == 1 and r != last:
            assert waited > HOLD * 0.6, f"clock 1 returned after {waited:.2f} s, before the push"
        # A plain pull in the next clock sees the same closed clock's sum.
        if c == 3:
            assert np.all(kv.pull(0) == total * (c + 1))
    kv.close()

elif case == "ssp":
    # ssp:1, every push (ones) added. The last rank finishes clock 0, then holds back. A rank at
    # clock c may pull once the slowest has clock >= c-1, and then sees at least every push of
    # clocks <= c-2: n*(c-1) ones. Fast ranks at clock 2 go on; at clock 3 they must wait.
    S = 1
    kv = store(f"ssp:{S}")
    kv.init(0, np.zeros(3, np.float64))
    clocks = 5
    for c in range(clocks):
        if r == last and c == 1:
            time.sleep(HOLD)
        kv.push(0, np.ones(3, np.float64))
        kv.clock()
        mine = c + 1  # this rank's clock now
        t0 = time.monotonic()
        v = kv.pull(0)
        waited = time.monotonic() - t0
        floor = n * max(0, mine - S)  # every push of clocks <= mine-S-1: (mine-S) clocks of n
        assert np.all(v >= floor), (mine, v, floor)
        assert np.all(v <= n * clocks), (mine, v)
        if r != last and mine == S + 2:
            assert waited > HOLD * 0.5, f"clock {mine}: pulled after {waited:.2f} s"
        if r != last and mine == S + 1:
            assert waited < HOLD * 0.5, f"clock {mine}: waited {waited:.2f} s, the rule allows it"
    comm.barrier()
    assert np.all(kv.pull(0) == n * clocks)
    kv.close()

elif case == "asp":
    # Pulls never wait: the last rank holds back before its first push; the others push and pull
    # five clocks at once, each pull at least their own pushes. At the end every push is there.
    kv = store("asp")
    kv.init(0, np.zeros(4, np.int64))
    if r == last:
        time.sleep(HOLD)
    t0 = time.monotonic()
    for c in range(5):
        kv.push(0, np.ones(4, np.int64))
        kv.clock()
        v = kv.pull(0)
        assert np.all(v >= c + 1) and np.all(v <= 5 * n), (c, v)
    if r != last:
        assert time.monotonic() - t0 < HOLD * 0.6, "asp pulls waited for the held-back rank"
    comm.barrier()
    assert np.all(kv.pull(0) == 5 * n)
    kv.close()

elif case == "sync":
    # sync:K with K = n-1: the last rank holds clock 1 back; the others' clock 1 closes without it
    # (their pushpull returns exactly their sum, at once); its late push is dropped and counted.
    k = n - 1
    kv = store(f"sync:{k}")
    kv.init(0, np.zeros(2, np.float32))
    fast_total = k * (k + 1) / 2
    # The held-back rank stops after its late clock: a clock it alone pushes would never close.
    for c in range(2 if r == last else 3):
        if r == last and c == 1:
            time.sleep(HOLD)
        t0 = time.monotonic()
        out = kv.pushpull(0, np.full(2, (r + 1) * (c + 1), np.float32), np.empty(2, np.float32))
        kv.clock()
        if c == 0:
            # Everyone is at clock 1 before anyone pushes it. Without this a loaded machine could
            # let the fast ranks close clocks 0-2 before the last rank's clock-0 push arrived:
            # dropped, it would then join clock 3 (the newest closed + 1), which nobody else
            # pushes, and its "late" pull would wait for that clock until the deadline.
            comm.barrier()
        if r != last and c == 1:
            assert time.monotonic() - t0 < HOLD * 0.6, "sync:K waited for the held-back rank"
            assert np.all(out == fast_total * (c + 1)), (c, out)
    comm.barrier()
    dropped = np.array([kv.stats().dropped_pushes], np.int64)
    comm.allreduce(dropped, op="max")
    assert dropped[0] >= 1, "the late push was not counted as dropped"
    kv.close()

elif case == "sgd":
    # bsp with the servers' sgd:0.5,momentum=0.9: rank r pushes (r+1) each clock; the update
    # applies the mean m = (n+1)/2: v = 0.9 v + m; w -= 0.5 v.
    kv = store("bsp", "sgd:0.5,momentum=0.9")
    w0 = np.array([1, 2, 3, 4], np.float64)
    kv.init(7, w0)
    m = (n + 1) / 2
    w, v = w0.copy(), 0.0
    for c in range(3):
        kv.push(7, np.full(4, r + 1, np.float64))
        kv.clock()
        v = 0.9 * v + m
        w = w - 0.5 * v
        got = kv.pull(7)
        assert np.allclose(got, w, rtol=0, atol=1e-12), (c, got, w)
    kv.close()

elif case in ("kill_asp", "kill_bsp"):
    # Dedicated servers (gradwire-run --servers): the last rank dies (SIGKILL) at clock 2. Under
    # asp the others go on and the loss is counted; under bsp they raise PeerError naming it.
    mode = case.split("_")[1]
    kv = store(mode)
    kv.init(0, np.zeros(8, np.float32))
    t0 = time.monotonic()
    try:
        for c in range(12):
            if c == 2:
                if r == last:
                    os.kill(os.getpid(), signal.SIGKILL)
                t0 = time.monotonic()
            kv.push(0, np.ones(8, np.float32))
            kv.clock()
            kv.pull(0)
            if mode == "asp":
                time.sleep(0.1)
    except gradwire.PeerError as e:
        say(f"kv {case} raised PeerError after {time.monotonic() - t0:.1f} s: {e}")
        os._exit(0)
    deadline = time.monotonic() + 10
    while kv.stats().lost_workers < 1 and time.monotonic() < deadline:
        kv.push(0, np.ones(8, np.float32))
        kv.clock()
        kv.pull(0)
        time.sleep(0.1)
    say(f"kv {case} went on, lost_workers={kv.stats().lost_workers}")
    kv.close()
    comm.close()
    sys.exit(0)

elif case == "stream":
    # Streamed partitions (GW_KV_CHUNK_BYTES from the test, smaller than the 1024-byte
    # partitions): bsp push_pull of 1000 floats is the exact sum every clock, and waits for the
    # held-back rank's push; the stats see the clocks.
    kv = gradwire.kv.KVStore(comm, mode="bsp", update="sum", partition_bytes=1024)
    kv.init(0, np.zeros(1000, np.float32))
    idx = np.arange(1000, dtype=np.float32)
    for c in range(3):
        if r == last and c == 1:
            time.sleep(HOLD)
        t0 = time.monotonic()
        out = kv.pushpull(0, idx + (r + 1) * (c + 1), np.empty(1000, np.float32))
        waited = time.monotonic() - t0
        kv.clock()
        assert np.array_equal(out, n * idx + n * (n + 1) / 2 * (c + 1)), (c, out[:8])
        if c == 1 and r != last:
            assert waited > HOLD * 0.6, f"clock 1 returned after {waited:.2f} s, before the push"
    assert kv.stats().clock == 3
    kv.close()

else:
    sys.exit(f"unknown case {case}")

say(f"kv {case} ok")
comm.close()
