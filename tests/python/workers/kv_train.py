"""Worker: PSOptimizer trains a small classifier (one changed line against plain local training).

    kv_train.py MODE UPDATE [SAVE]      e.g. bsp sum | asp server | ssp:1 sum

Prints "first loss X" and "final loss Y" (each rank's loss on the whole data set); under bsp with
sum every rank must end with the same parameters (checked against rank 0's). SAVE: each rank
writes its final parameters, flat float32, to SAVE.<rank> (test_kv.py compares daemon and direct
mode).
"""
import sys

import torch

import gradwire
import gradwire.torch.kv

mode, update = sys.argv[1], sys.argv[2]
save = sys.argv[3] if len(sys.argv) > 3 else None
comm = gradwire.init()
r, n = comm.rank, comm.size
torch.set_num_threads(1)
g = torch.Generator().manual_seed(7)
centers = torch.randn(4, 16, generator=g) * 2
y = torch.randint(0, 4, (1024,), generator=g)
x = centers[y] + torch.randn(1024, 16, generator=g)
torch.manual_seed(r)  # different initial weights: PSOptimizer starts every rank from rank 0's
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
lossf = torch.nn.CrossEntropyLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
opt = gradwire.torch.kv.PSOptimizer(opt, model.named_parameters(), mode=mode, update=update,
                                    comm=comm)


def full_loss() -> float:
    with torch.no_grad():
        return float(lossf(model(x), y))


print(f"rank {r}: first loss {full_loss():.4f}", flush=True)
for step in range(60):
    idx = torch.arange(r * 32 + step * 64, r * 32 + step * 64 + 32) % 1024
    opt.zero_grad()
    lossf(model(x[idx]), y[idx]).backward()
    opt.step()
if mode in ("bsp", "ssp:0") and update == "sum":
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    comm.broadcast(ref, root=0)
    assert torch.equal(flat, ref), "bsp with sum: the ranks' parameters differ"
if save:
    torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().tofile(f"{save}.{r}")
comm.barrier()
print(f"rank {r}: final loss {full_loss():.4f}", flush=True)
opt.close()
comm.close()
