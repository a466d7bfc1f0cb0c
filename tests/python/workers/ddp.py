"""Worker: DDP training steps with a given backend and comm hook; parameters must end identical.

usage: ddp.py BACKEND HOOK STEPS   (HOOK: none, allreduce, or a codec spec for compressed_hook)
"""
import sys

import torch
import torch.distributed as dist

import gradwire.torch  # noqa: F401
from gradwire.torch import comm_of, hooks

backend, hook, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
dist.init_process_group(backend)
r, n = dist.get_rank(), dist.get_world_size()
torch.manual_seed(1234)  # same initial model everywhere (DDP broadcasts it anyway)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.005)
if hook == "allreduce":
    ddp.register_comm_hook(None, hooks.allreduce_hook)
elif hook != "none":
    ddp.register_comm_hook(None, hooks.compressed_hook(hook))
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
g = torch.Generator().manual_seed(r)  # different data per rank
first = last = None
for step in range(steps):
    x = torch.randn(16, 32, generator=g)
    y = torch.randn(16, 8, generator=g)
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    first = loss.item() if first is None else first
    last = loss.item()

flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
comm = comm_of()
gathered = comm.allgather(flat)
for k in range(n):
    assert torch.equal(gathered[k], flat), f"rank {r}: parameters differ from rank {k}'s"
assert torch.isfinite(flat).all()
if hook != "none" and hook != "allreduce":
    s = comm.stats()
    assert n == 1 or s.calls > 0, s
print(f"rank {r}: ddp {backend} {hook} ok, loss {first:.4f} -> {last:.4f}")
dist.destroy_process_group()
