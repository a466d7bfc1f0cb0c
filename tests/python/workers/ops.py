"""Worker: every Comm operation on every dtype, checked on each rank (launched by the tests)."""
import numpy as np
import torch

import gradwire

comm = gradwire.init()
r, n = comm.rank, comm.size
assert n == int(__import__("os").environ["WORLD_SIZE"])

NP = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8]
TORCH = [torch.bfloat16, torch.float32, torch.int64]


def arrays(k, value, dtypes=None):
    """The same values as a numpy array and a torch tensor of every supported dtype."""
    for dt in NP:
        yield np.full(k, value, dtype=dt)
    for dt in TORCH:
        yield torch.full((k,), value, dtype=dt)


def eq(a, want):
    a = a.float().numpy() if isinstance(a, torch.Tensor) else a.astype(np.float64)
    return np.array_equal(a, np.asarray(want, dtype=np.float64) * np.ones_like(a))


ranks = np.arange(1, n + 1)
for op, want in (("sum", ranks.sum()), ("prod", ranks.prod()), ("min", 1), ("max", n),
                 ("avg", ranks.sum() // n)):
    for a in arrays(7, r + 1):
        if op == "avg" and str(a.dtype) in ("float32", "float64", "float16", "torch.bfloat16",
                                            "torch.float32"):
            w = ranks.sum() / n
        else:
            w = want
        comm.allreduce(a, op=op)
        assert eq(a, w), (op, a.dtype, a, w)
# out of place
s = np.full(3, r, dtype=np.float32)
out = comm.allreduce(s, np.empty(3, dtype=np.float32))
assert eq(out, sum(range(n))) and eq(s, r)

for a in arrays(5, 0):
    if r == n - 1:
        a[:] = 9
    comm.broadcast(a, root=n - 1)
    assert eq(a, 9), a

for a in arrays(3, r):
    g = comm.allgather(a)
    assert tuple(g.shape) == (n, 3), g.shape
    for k in range(n):
        assert eq(g[k], k), g

for a in arrays(n * 2, r + 1):
    res = comm.reduce_scatter(a)
    assert res.shape[0] == 2 and eq(res, ranks.sum()), res

for dt in (np.int64, np.float32):
    send = (np.arange(n * 2) + 100 * r).astype(dt)
    res = comm.alltoall(send)
    want = [100 * j + 2 * r + k for j in range(n) for k in range(2)]
    assert np.array_equal(res, np.array(want, dtype=dt)), res

comm.barrier()

# async: several in flight, completing in issue order
reqs = [comm.iallreduce(np.full(1000, float(i + r), dtype=np.float32)) for i in range(4)]
for i, q in enumerate(reqs):
    res = q.wait(timeout=10)
    assert eq(res, sum(i + k for k in range(n))), res
    assert q.done and q.test()

# split: even and odd ranks; ranks >= 3 join none
sub = comm.split(r % 2 if r < 3 else -1, key=-r)  # keys reverse the order
if r >= 3:
    assert sub is None
else:
    members = [k for k in range(min(n, 3)) if k % 2 == r % 2]
    assert sub.size == len(members), (sub.size, members)
    assert sub.rank == len(members) - 1 - members.index(r), (sub.rank, members)
    t = np.ones(4, dtype=np.float32)
    sub.allreduce(t)
    assert eq(t, len(members))
p = np.ones(1, dtype=np.float32)
comm.allreduce(p)  # the parent works beside the children
assert eq(p, n)
if sub is not None:
    sub.close()
comm.barrier()

# compression: sums within the codec's error; stats count the calls
comm.reset_stats()
for spec in ("none", "fp16", "bf16", "topk:0.5", "sign", "powersgd:1"):
    t = torch.full((64,), float(r + 1))
    comm.allreduce_compressed(t, spec, key=f"k.{spec}")
    assert torch.isfinite(t).all(), spec
    if spec in ("none", "fp16", "bf16"):
        assert torch.all(t == ranks.sum()), (spec, t)
st = comm.stats()
assert st.calls == 6, st  # at 1 rank too (nothing crosses a wire, calls still count)
assert n == 1 or st.bytes_sent < st.bytes_uncompressed * 6, st
comm.close()
print(f"rank {r}: ops ok")
