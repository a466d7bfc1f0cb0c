"""Worker: the gradwire backend, the C ABI's compressed allreduce and DDP on CUDA tensors.

Every rank uses cuda:0 (the GPU test machine has one GPU; ranks pose as hosts). Checks, on each
rank: collectives on CUDA tensors give the exact results (issued on a side stream too, whose
reader sees inputs written before the call and outputs finished after it),
gw_allreduce_compressed on a CUDA tensor gives the same bits as on the same values in host memory
(fp16: the codec is deterministic), and a DDP model on the GPU with gradwire's hooks ends with
identical parameters on every rank.
"""
import torch
import torch.distributed as dist

import gradwire.torch  # noqa: F401 (registers the backend)
from gradwire.torch import comm_of, hooks

dist.init_process_group("gradwire")
r, n = dist.get_rank(), dist.get_world_size()
dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)

t = torch.full((1000,), float(r + 1), device=dev)
dist.all_reduce(t)
assert t.is_cuda and torch.equal(t.cpu(), torch.full((1000,), n * (n + 1) / 2)), t
t = torch.arange(7, dtype=torch.float16, device=dev) if r == 0 else torch.zeros(7, dtype=torch.float16, device=dev)
dist.broadcast(t, src=0)
assert torch.equal(t.cpu(), torch.arange(7, dtype=torch.float16)), t
outs = [torch.zeros(3, device=dev) for _ in range(n)]
dist.all_gather(outs, torch.full((3,), float(r), device=dev))
assert all(torch.equal(o.cpu(), torch.full((3,), float(i))) for i, o in enumerate(outs)), outs

# A collective issued on a side stream (DDP and FSDP use them) reads what that stream wrote
# before it: the backend's worker waits for an event recorded on the caller's current stream. The
# GPU sleeps before the fill, so a worker that did not wait would send zeros.
side = torch.cuda.Stream()
t = torch.zeros(1 << 20, device=dev)
torch.cuda.synchronize()
with torch.cuda.stream(side):
    torch.cuda._sleep(200_000_000)
    t.fill_(float(r + 1))
    work = dist.all_reduce(t, async_op=True)
work.wait()
torch.cuda.synchronize()
assert torch.equal(t.cpu(), torch.full((1 << 20,), n * (n + 1) / 2)), "side stream not waited for"

# Outputs the worker writes with a device-to-device copy (reduce_scatter_tensor, all_to_all_single,
# all_gather into a list) are finished when the Work completes, for a reader on a side stream
# (FSDP's reduce-scatter stream reads the output at once): the worker synchronises its stream.
# Large outputs, read on the side stream right after the call, so a copy still queued shows.
m = 64 << 18  # 64 MiB of float32 per rank block
inp = torch.full((n * m,), float(r + 1), device=dev)
out = torch.full((m,), float("nan"), device=dev)
torch.cuda.synchronize()
with torch.cuda.stream(side):
    dist.reduce_scatter_tensor(out, inp)
    got = out.clone()
torch.cuda.synchronize()
assert torch.equal(got.cpu(), torch.full((m,), n * (n + 1) / 2)), "reduce_scatter output unfinished"
a2a = torch.full((n * m,), float("nan"), device=dev)
with torch.cuda.stream(side):
    dist.all_to_all_single(a2a, inp)
    got = a2a.clone()
torch.cuda.synchronize()
want = torch.arange(1, n + 1, dtype=torch.float32)  # block j came from rank j, all j + 1
assert torch.equal(got.view(n, m)[:, -1].cpu(), want), "all_to_all_single output unfinished"
assert not torch.isnan(got).any().item(), "all_to_all_single output unfinished"
outs = [torch.full((m,), float("nan"), device=dev) for _ in range(n)]
with torch.cuda.stream(side):
    dist.all_gather(outs, torch.full((m,), float(r), device=dev))
    got = torch.stack(outs)
torch.cuda.synchronize()
assert torch.equal(got[:, -1].cpu(), torch.arange(n, dtype=torch.float32)), "all_gather unfinished"
assert not torch.isnan(got).any().item(), "all_gather output unfinished"
del inp, out, a2a, outs, got

comm = comm_of()
g = torch.Generator().manual_seed(7 + r)
for spec in ("fp16", "bf16", "sign"):
    host = torch.randn(1 << 20, generator=g)
    gpu = host.to(dev)
    comm.allreduce_compressed(host, spec, f"host.{spec}")
    comm.allreduce_compressed(gpu, spec, f"gpu.{spec}")
    if spec == "sign":
        # sign's worker side scales on the GPU: every rank holds the same result, within the
        # scale's rounding of the host path's, which may flip a sum that is that close to zero
        # (docs/gpudirect.md allows 0.1% of the elements)
        every = comm.allgather(gpu)
        assert all(torch.equal(every[k], gpu) for k in range(n)), "ranks differ"
        off = (gpu.cpu() - host).abs() > 1e-4 * host.abs().max()
        assert off.float().mean().item() <= 1e-3, (spec, off.sum().item())
    else:
        assert torch.equal(gpu.cpu(), host), spec

torch.manual_seed(1234)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                            torch.nn.Linear(512, 16)).to(dev)
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=0.25)
ddp.register_comm_hook(None, hooks.compressed_hook("fp16"))
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
gd = torch.Generator(device=dev).manual_seed(r)
for _ in range(5):
    x = torch.randn(64, 256, device=dev, generator=gd)
    y = torch.randn(64, 16, device=dev, generator=gd)
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
gathered = comm.allgather(flat)
assert gathered.is_cuda
for k in range(n):
    assert torch.equal(gathered[k], flat), f"rank {r}: parameters differ from rank {k}'s"
print(f"rank {r}: cuda ok (torch {torch.__version__})")
dist.destroy_process_group()
