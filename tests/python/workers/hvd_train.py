"""Worker: a model trained through hvd.DistributedOptimizer must match DDP over the gradwire backend.

usage: hvd_train.py MODE STEPS
  MODE: fused (default fusion), unfused (GW_FUSION_THRESHOLD=0 set by the test), bpps2
  (backward_passes_per_step=2 against DDP's no_sync), fp16 (Compression.fp16: close, not equal),
  codec (Compression.codec("fp16")), syncbn (SyncBatchNorm against one BatchNorm of the global
  batch), overlap (buckets start during backward).
Both runs start from the same seed and see the same per-rank data.
"""
import sys

import torch
import torch.distributed as dist

import gradwire.torch as hvd

mode, steps = sys.argv[1], int(sys.argv[2])
dist.init_process_group("gradwire")
hvd.init(hvd.comm_of())
r, n = hvd.rank(), hvd.size()


def model() -> torch.nn.Module:
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                               torch.nn.Tanh(), torch.nn.Linear(64, 8))


def batches(k: int) -> list:
    g = torch.Generator().manual_seed(100 + r)
    return [(torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)) for _ in range(k)]


def flat(m: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


if mode == "syncbn":
    # Each rank holds rows [8r, 8r+8) of one global batch; SyncBatchNorm on the slices must give
    # the slices of BatchNorm on the whole batch, forward and backward.
    torch.manual_seed(7)
    full = torch.randn(8 * n, 3, 5, 5) * 3 + 1
    dy = torch.randn(8 * n, 3, 5, 5)
    ref = torch.nn.BatchNorm2d(3)
    sync = hvd.SyncBatchNorm(3)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 2)
        ref.bias.uniform_(-1, 1)
    sync.load_state_dict(ref.state_dict())
    xf = full.clone().requires_grad_()
    yf = ref(xf)
    (yf * dy).sum().backward()
    xs = full[8 * r: 8 * r + 8].clone().requires_grad_()
    ys = sync(xs)
    (ys * dy[8 * r: 8 * r + 8]).sum().backward()
    assert torch.allclose(ys, yf[8 * r: 8 * r + 8].detach(), atol=1e-5)
    assert torch.allclose(xs.grad, xf.grad[8 * r: 8 * r + 8], atol=1e-5), \
        (xs.grad - xf.grad[8 * r: 8 * r + 8]).abs().max()
    gw = hvd.allreduce(sync.weight.grad, op=hvd.Sum)
    assert torch.allclose(gw, ref.weight.grad, atol=1e-4), (gw, ref.weight.grad)
    assert torch.allclose(sync.running_mean, ref.running_mean, atol=1e-5)
    assert torch.allclose(sync.running_var, ref.running_var, atol=1e-5)
    sync.eval()
    assert torch.allclose(sync(full), ref.eval()(full), atol=1e-5)
    print(f"rank {r}: hvd train {mode} ok", flush=True)
    sys.exit(0)

if mode == "overlap":
    # Reductions start during backward: when the input's gradient (the last one backward
    # computes) is made, the buckets of the later layers have been started already.
    m = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                   named_parameters=m.named_parameters())
    assert len(opt._buckets) > 2, len(opt._buckets)  # GW_FUSION_THRESHOLD set by the test
    for step in range(3):  # the first step, then the rebuilt buckets
        seen = []
        x = torch.randn(4, 32).requires_grad_()
        x.register_hook(lambda g: seen.append(sum(b.handle is not None for b in opt._buckets)))
        opt.zero_grad()
        m(x).sum().backward()
        assert seen and seen[0] >= 2, (step, seen)
        opt.step()
    print(f"rank {r}: hvd train {mode} ok, {seen[0]} of {len(opt._buckets)} buckets started "
          "before backward ended", flush=True)
    sys.exit(0)

passes = 2 if mode == "bpps2" else 1
data = batches(steps * passes)

# DDP over the gradwire backend.
m1 = model()
ddp = torch.nn.parallel.DistributedDataParallel(m1)
opt1 = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
for s in range(steps):
    opt1.zero_grad()
    for k in range(passes):
        x, y = data[s * passes + k]
        if k < passes - 1:
            with ddp.no_sync():
                torch.nn.functional.mse_loss(ddp(x), y).backward()
        else:
            torch.nn.functional.mse_loss(ddp(x), y).backward()
    opt1.step()

# The same through the Horovod API.
m2 = model()
opt2 = torch.optim.SGD(m2.parameters(), lr=0.05, momentum=0.9)
compression = {"fp16": hvd.Compression.fp16,
               "codec": hvd.Compression.codec("fp16")}.get(mode, hvd.Compression.none)
opt2 = hvd.DistributedOptimizer(opt2, named_parameters=m2.named_parameters(),
                                compression=compression, backward_passes_per_step=passes)
hvd.broadcast_parameters(m2.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt2, root_rank=0)
for s in range(steps):
    opt2.zero_grad()
    for k in range(passes):
        x, y = data[s * passes + k]
        torch.nn.functional.mse_loss(m2(x), y).backward()
    opt2.step()

a, b = flat(m1), flat(m2)
tol = 2e-3 if mode in ("fp16", "codec") else 1e-5
assert torch.allclose(a, b, atol=tol), f"rank {r}: max difference {(a - b).abs().max()}"
assert not torch.equal(b, flat(model())), "training did not move the parameters"
everyone = hvd.allgather(b.unsqueeze(0))
for k in range(n):
    assert torch.equal(everyone[k], b), f"rank {r}: parameters differ from rank {k}'s"
print(f"rank {r}: hvd train {mode} ok, max |ddp - hvd| {(a - b).abs().max():.2e}", flush=True)
dist.destroy_process_group()
