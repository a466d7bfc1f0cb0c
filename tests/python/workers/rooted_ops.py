"""Worker: Comm's reduce, gather, scatter, alltoallv, their i-forms and the other i-forms, on
numpy dtypes and torch tensors, checked on each rank; then the torch backend's reduce, gather,
scatter and uneven all_to_all / all_to_all_single (launched by test_torch_p2p.py)."""
import numpy as np
import torch
import torch.distributed as dist

import gradwire
import gradwire.torch  # noqa: F401

comm = gradwire.init()
r, n = comm.rank, comm.size
root = n - 1

for dt in (np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8):
    x = np.full(5, r + 1, dtype=dt)
    got = comm.reduce(x, root=root)
    assert (got is None) == (r != root), got
    if r == root:
        assert (got == n * (n + 1) // 2).all(), (dt, got)
    y = x.copy()
    comm.reduce(y, y if r == root else None, op="max", root=root)  # in place at the root
    assert (y == (n if r == root else r + 1)).all(), (dt, y)

    g = comm.gather(np.full(3, r, dtype=dt), root=0)
    if r == 0:
        assert g.shape == (n, 3) and all((g[j] == j).all() for j in range(n)), g

    out = np.zeros(2, dtype=dt)
    blocks = np.repeat(np.arange(n), 2).astype(dt) if r == root else None
    comm.scatter(blocks, out, root=root)
    assert (out == r).all(), (dt, out)

    # alltoallv: rank r sends j + 1 elements valued 10 r + j to rank j (uneven, and 0 to none).
    send = np.concatenate([np.full(j + 1, 10 * r + j) for j in range(n)]).astype(dt)
    rc = [r + 1] * n
    recv = np.zeros(sum(rc), dtype=dt)
    comm.alltoallv(send, [j + 1 for j in range(n)], recv, rc)
    want = np.concatenate([np.full(r + 1, 10 * j + r) for j in range(n)]).astype(dt)
    assert np.array_equal(recv, want), (dt, recv, want)

# i-forms, several in flight at once, and completed out of order.
x = np.full(4, float(r + 1), dtype=np.float32)
red = comm.ireduce(x, root=0)
gat = comm.igather(np.full(2, float(r), dtype=np.float32), root=0)
sc_out = np.zeros(1, dtype=np.int64)
sca = comm.iscatter(np.arange(n, dtype=np.int64) if r == 0 else None, sc_out, root=0)
v_recv = np.zeros(n, dtype=np.int32)
a2av = comm.ialltoallv(np.full(n, r, dtype=np.int32), [1] * n, v_recv, [1] * n)
b = np.full(3, float(r), dtype=np.float64)
bc = comm.ibroadcast(b, root=root)
ag = comm.iallgather(np.full(2, r, dtype=np.int64), np.zeros(2 * n, dtype=np.int64))
rs = comm.ireduce_scatter(np.ones(2 * n, dtype=np.float32), np.zeros(2, dtype=np.float32))
a2a = comm.ialltoall(np.full(n, r, dtype=np.uint8), np.zeros(n, dtype=np.uint8))
bar = comm.ibarrier()
bar.wait()
assert (a2a.wait() == np.arange(n)).all()
assert (rs.wait() == n).all()
assert (ag.wait() == np.repeat(np.arange(n), 2)).all()
assert (bc.wait() == root).all()
assert (a2av.wait() == np.arange(n)).all()
sca.wait()
assert sc_out[0] == r
g = gat.wait()
res = red.wait()
if r == 0:
    assert (res == n * (n + 1) / 2).all() and (g == np.arange(n)[:, None]).all(), (res, g)

# Mismatched counts fail on every rank, never a hang.
try:
    comm.alltoallv(np.zeros(n, dtype=np.float32), [1] * n, np.zeros(2 * n, dtype=np.float32),
                   [2] * n)
except (gradwire.InvalidArgument, gradwire.PeerError):
    pass
else:
    raise AssertionError("alltoallv with counts that disagree did not raise")
comm.close()

# The torch backend on the same calls.
dist.init_process_group("gradwire")
t = torch.full((3,), float(r + 1))
dist.reduce(t, dst=root)
assert torch.all(t == (n * (n + 1) / 2 if r == root else r + 1)), t
outs = [torch.zeros(2, dtype=torch.int8) for _ in range(n)] if r == 0 else None
dist.gather(torch.full((2,), r, dtype=torch.int8), outs, dst=0)
assert r != 0 or all(torch.all(o == j) for j, o in enumerate(outs)), outs
o = torch.zeros(2, 2)
dist.scatter(o, [torch.full((2, 2), float(j)) for j in range(n)] if r == root else None,
             src=root)
assert torch.all(o == r), o
# Uneven all_to_all_single: rank r sends j + 1 rows of width 3 to rank j.
inp = torch.cat([torch.full((j + 1, 3), float(10 * r + j)) for j in range(n)])
out = torch.zeros(n * (r + 1), 3)
dist.all_to_all_single(out, inp, [r + 1] * n, [j + 1 for j in range(n)])
want = torch.cat([torch.full((r + 1, 3), float(10 * j + r)) for j in range(n)])
assert torch.equal(out, want), out
# Uneven all_to_all of a list, bool (moved as bytes).
ins = [torch.ones(j + 1, dtype=torch.bool) for j in range(n)]
outs = [torch.zeros(r + 1, dtype=torch.bool) for _ in range(n)]
dist.all_to_all(outs, ins)
assert all(bool(o.all()) for o in outs), outs
dist.barrier()
print(f"rooted ops ok {r}")
