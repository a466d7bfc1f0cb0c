"""Worker: Comm.mem_empty arrays (numpy and torch, one of 2 MiB) through every collective kind that
takes them; with GW_DAEMON set they lie in the daemon's arena. Prints "mem ok RANK" when every
result is right."""
import gc
import sys

import numpy as np

import gradwire

c = gradwire.init()
r, n = c.rank, c.size
a = c.mem_empty((4, 256), "float32")
assert a.shape == (4, 256) and a.dtype == np.float32 and a.flags.c_contiguous
a[:] = r + 1
c.allreduce(a, a)
assert (a == n * (n + 1) / 2).all(), a[:2]
# 2 MiB: ranks of one host over shm map each other's mem_empty memory (the shared-buffer allreduce).
big = c.mem_empty(1 << 19, "float32")
big[:] = np.arange(1 << 19, dtype=np.float32) % 7 + r
c.allreduce(big, big)
assert (big == (np.arange(1 << 19) % 7) * n + n * (n - 1) / 2).all(), big[:8]
del big
b = c.mem_empty(1000, "int64")
b[:] = np.arange(1000) + r
c.broadcast(b, root=n - 1)
assert (b == np.arange(1000) + n - 1).all()
g = c.mem_empty(n * 10, "int32")
c.allgather(np.full(10, r, dtype=np.int32), g)
assert (g == np.repeat(np.arange(n), 10)).all()
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    t = c.mem_empty((8, 8), "bfloat16", torch=True)
    assert t.dtype == torch.bfloat16 and t.shape == (8, 8)
    t.fill_(1.0)
    c.allreduce(t, t)
    assert (t == float(n)).all()
    f = c.mem_empty(64, "float32", torch=True)
    f.fill_(2.0)
    c.allreduce_compressed(f, "fp16", "f")
    assert (f == 2.0 * n).all()
    del t, f
try:
    c.mem_empty(2, "bfloat16")
    sys.exit("bfloat16 without torch was accepted")
except gradwire.InvalidArgument:
    pass
# Closed while an array is alive: the array stays usable, the comm goes with it.
keep = c.mem_empty(16, "float64")
del a, b, g
gc.collect()
c.close()
keep[:] = 3.0
assert keep.sum() == 48.0
del keep
gc.collect()
print("mem ok", r, flush=True)
