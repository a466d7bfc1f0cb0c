"""Worker: every call of the Horovod API (gradwire.torch as hvd) on N ranks, values checked."""
import os
import sys

import torch

import gradwire.torch as hvd

# Two ranks per pretend host (GW_HVD_HOST, read by init()).
os.environ["GW_HVD_HOST"] = f"host{int(os.environ['RANK']) // 2}"
hvd.init()
hvd.init()  # a second call does nothing
r, n = hvd.rank(), hvd.size()
assert hvd.is_initialized()
assert 0 <= r < n and n == int(os.environ["WORLD_SIZE"])
assert hvd.local_size() == min(2, n - (r // 2) * 2), (r, hvd.local_size())
assert hvd.local_rank() == r % 2 and hvd.cross_rank() == r // 2, (r, hvd.local_rank())
assert hvd.cross_size() == (n + 1) // 2
assert not hvd.nccl_built() and not hvd.mpi_built() and not hvd.gloo_built()
S = n * (n - 1) / 2  # sum of the ranks

# allreduce: default Average, the op= forms, average=, pre/postscale, in place, async, poll.
x = torch.full((5,), float(r))
assert torch.allclose(hvd.allreduce(x), torch.full((5,), S / n))
assert torch.equal(x, torch.full((5,), float(r)))  # not in place
assert torch.allclose(hvd.allreduce(x, average=False), torch.full((5,), S))
assert torch.allclose(hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5),
                      torch.full((5,), S))
assert torch.equal(hvd.allreduce(x, op=hvd.Min), torch.zeros(5))
assert torch.equal(hvd.allreduce(x, op=hvd.Max), torch.full((5,), n - 1.0))
p = hvd.allreduce(torch.full((3,), r + 1.0), op=hvd.Product)
assert torch.equal(p, torch.full((3,), float(torch.arange(1, n + 1).prod())))
y = torch.full((4,), float(r))
h = hvd.allreduce_async_(y, op=hvd.Sum, name="y")
hvd.synchronize(h)
assert torch.equal(y, torch.full((4,), S))
h = hvd.allreduce_async(torch.ones(7, dtype=torch.float64), name="z")
while not hvd.poll(h):
    pass
assert torch.equal(hvd.synchronize(h), torch.ones(7, dtype=torch.float64))
try:
    hvd.synchronize(h)
    raise AssertionError("a synchronized handle must be refused")
except ValueError:
    pass
hvd.allreduce_(y, op=hvd.Sum)
assert torch.equal(y, torch.full((4,), S * n))
assert torch.allclose(hvd.allreduce(x, compression=hvd.Compression.fp16), torch.full((5,), S / n))
h = hvd.allreduce_async(torch.full((64,), 1.0 + r), op=hvd.Sum,
                        compression=hvd.Compression.codec("fp16"), name="codec")
assert torch.allclose(hvd.synchronize(h), torch.full((64,), n + S))
try:
    hvd.allreduce(x, op=hvd.Adasum)
    raise AssertionError("Adasum must raise")
except NotImplementedError as e:
    assert "Adasum" in str(e)
# Differentiable: d/dx sum(allreduce_sum(x)) on every rank = n.
w = torch.ones(3, requires_grad=True)
hvd.allreduce(w * 2, op=hvd.Sum).sum().backward()
assert torch.equal(w.grad, torch.full((3,), 2.0 * n)), w.grad

# allgather: first dimension differs between ranks (rank k has k+1 rows).
g = hvd.allgather(torch.full((r + 1, 2), float(r)))
rows = [k for k in range(n) for _ in range(k + 1)]
assert torch.equal(g, torch.tensor(rows, dtype=torch.float32).unsqueeze(1).expand(-1, 2)), g
h = hvd.allgather_async(torch.tensor([r], dtype=torch.int64))
assert hvd.synchronize(h).tolist() == list(range(n))
v = torch.full((r + 1,), 1.0, requires_grad=True)
(hvd.allgather(v) * torch.arange(1.0, len(rows) + 1)).sum().backward()
start = sum(k + 1 for k in range(r))
assert torch.equal(v.grad, n * torch.arange(1.0, len(rows) + 1)[start: start + r + 1]), v.grad
if n > 1:
    try:
        hvd.allgather(torch.zeros(1, r + 1))  # a second dimension that differs
        raise AssertionError("mismatched inner shapes must raise")
    except ValueError as e:
        assert "first dimension" in str(e), e

# broadcast: new tensor, in place, async.
b = torch.full((3,), float(r))
assert torch.equal(hvd.broadcast(b, root_rank=n - 1), torch.full((3,), n - 1.0))
assert torch.equal(b, torch.full((3,), float(r)))
hvd.broadcast_(b, 0)
assert torch.equal(b, torch.zeros(3))
h = hvd.broadcast_async(torch.full((2,), float(r)), 0)
assert torch.equal(hvd.synchronize(h), torch.zeros(2))
b = torch.zeros(2)
h = hvd.broadcast_async_(b + r, 0)
assert torch.equal(hvd.synchronize(h), torch.zeros(2))

# alltoall: equal shares, then splits (rank r sends j+1 rows to rank j).
a = torch.arange(n * 2, dtype=torch.float32) + 100 * r
out = hvd.alltoall(a)
assert out.tolist() == [100 * j + 2 * r + i for j in range(n) for i in range(2)], out
splits = [j + 1 for j in range(n)]
rows_ = torch.cat([torch.full((j + 1, 3), float(10 * r + j)) for j in range(n)])
out, got = hvd.alltoall(rows_, splits=splits)
assert got.tolist() == [r + 1] * n, got
assert torch.equal(out, torch.cat([torch.full((r + 1, 3), float(10 * j + r)) for j in range(n)]))

# objects, parameters and optimizer state.
assert hvd.broadcast_object({"k": r, "s": "x" * 100}, root_rank=0) == {"k": 0, "s": "x" * 100}
assert hvd.allgather_object(("rank", r)) == [("rank", k) for k in range(n)]
torch.manual_seed(r)  # different models per rank, made equal by the broadcast
m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
m[1].running_mean.fill_(r)
hvd.broadcast_parameters(m.state_dict(), root_rank=0)
flat = torch.cat([t.reshape(-1).float() for t in m.state_dict().values()])
assert torch.equal(hvd.allgather(flat.unsqueeze(0)), flat.unsqueeze(0).expand(n, -1))
hvd.broadcast_parameters(m.named_parameters(), root_rank=n - 1)
opt = torch.optim.Adam(m.parameters(), lr=0.01 * (r + 1))
if r == 0:  # only the root has stepped: the others get its Adam state and its lr
    m(torch.randn(8, 4)).sum().backward()
    opt.step()
hvd.broadcast_optimizer_state(opt, root_rank=0)
sd = opt.state_dict()
assert sd["param_groups"][0]["lr"] == 0.01 and len(sd["state"]) == 4, sd["param_groups"]
ea = torch.cat([s["exp_avg"].reshape(-1) for s in sd["state"].values()])
assert torch.equal(hvd.allgather(ea.unsqueeze(0)), ea.unsqueeze(0).expand(n, -1))

# join: every rank arrives; the last to arrive is a rank.
assert 0 <= hvd.join() < n
print(f"rank {r}: hvd ops ok", flush=True)
hvd.shutdown()
sys.exit(0)
