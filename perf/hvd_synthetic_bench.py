#!/usr/bin/python3
"""Training throughput of one torchvision model on synthetic data, images/sec after a warm-up,
through gradwire's Horovod API or through torch's DistributedDataParallel (DDP).

usage (under a launcher: gradwire-run, torchrun, tests/testbed/testbed.sh -R):
  hvd_synthetic_bench.py --mode MODE [--model NAME] [--batch-size B] [--image-size S]
                         [--warmup W] [--steps N] [--threads T]
  MODE:
    hvd            gradwire.torch's DistributedOptimizer (fusion buckets of
                   GRADWIRE_FUSION_THRESHOLD bytes, default 25 MiB; 0: one bucket per parameter)
    hvd-fp16       the same with Compression.fp16
    hvd-codec:SPEC the same with Compression.codec(SPEC), a gradwire codec (topk:0.01, sign, ...)
    ddp-gloo       DDP over torch's Gloo backend (GLOO_SOCKET_IFNAME picks the interface)
    ddp-gradwire   DDP over the "gradwire" torch.distributed backend
    local          no communication: every rank trains its own copy (the compute ceiling of
                   this many ranks on this machine); every rank prints its own line, with
                   RANK and WORLD_SIZE from the launcher's environment
Every mode trains the same model (torchvision's, built with its own BatchNorm in every mode, so
that no mode adds collectives to the forward pass), with SGD, on one fixed random batch per rank
of B images of 3 x S x S and random labels of 1000 classes, for W warm-up steps then N timed
steps. The time is the slowest rank's (a MAX reduction over the ranks through the mode's own
transport after the timed steps, which start after a reduction that lines the ranks up). Rank 0
prints one line:
  hvd_bench mode=MODE model=NAME ranks=R batch=B image=S steps=N time_s=T images_per_sec=X
  step_ms=Y grad_bytes=G fusion_threshold=F
images_per_sec counts every rank's images (B x R x N / T; in local mode the rank's own,
B x N / T); grad_bytes is the model's float32 gradient, what each step reduces. --threads
sets torch's intra-op threads (default 1: ranks share the machine's cores). Needs Debian's /usr/bin/python3 with
python3-torch and python3-torchvision.
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n", 2)[2])
    p.add_argument("--mode", required=True)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    ok = a.mode in ("hvd", "hvd-fp16", "ddp-gloo", "ddp-gradwire", "local") or (
        a.mode.startswith("hvd-codec:") and len(a.mode) > len("hvd-codec:"))
    if not ok:
        p.error(f"--mode {a.mode!r}: one of hvd, hvd-fp16, hvd-codec:SPEC, ddp-gloo, ddp-gradwire, "
                f"local")
    for name in ("batch_size", "image_size", "steps", "threads"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.warmup < 0:
        p.error("--warmup must be >= 0")
    return a


def main() -> int:
    a = parse()
    try:
        from torchvision import models
    except ImportError:
        print("hvd_synthetic_bench: torchvision missing (apt-get install python3-torchvision)",
              file=sys.stderr)
        return 3
    if not hasattr(models, a.model):
        print(f"hvd_synthetic_bench: torchvision has no model {a.model!r}", file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = getattr(models, a.model)()

    if a.mode == "local":
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        net = model

        def slowest(t: float) -> float:
            return t
    elif a.mode.startswith("hvd"):
        import gradwire.torch as hvd

        hvd.init()
        rank, world = hvd.rank(), hvd.size()
        opt = torch.optim.SGD(model.parameters(), lr=0.01 * world)
        comp = hvd.Compression.none
        if a.mode == "hvd-fp16":
            comp = hvd.Compression.fp16
        elif a.mode.startswith("hvd-codec:"):
            comp = hvd.Compression.codec(a.mode[len("hvd-codec:"):])
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       compression=comp)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        net = model

        def slowest(t: float) -> float:
            return hvd.allreduce(torch.tensor([t]), op=hvd.Max, name="bench.time").item()
    else:
        import torch.distributed as dist

        if a.mode == "ddp-gradwire":
            import gradwire.torch  # noqa: F401  (the import registers the backend)
        dist.init_process_group("gloo" if a.mode == "ddp-gloo" else "gradwire")
        rank, world = dist.get_rank(), dist.get_world_size()
        net = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(net.parameters(), lr=0.01 * world)

        def slowest(t: float) -> float:
            x = torch.tensor([t])
            dist.all_reduce(x, op=dist.ReduceOp.MAX)
            return x.item()

    g = torch.Generator().manual_seed(100 + rank)
    data = torch.randn(a.batch_size, 3, a.image_size, a.image_size, generator=g)
    target = torch.randint(0, 1000, (a.batch_size,), generator=g)

    def step() -> None:
        opt.zero_grad()
        loss = F.cross_entropy(net(data), target)
        loss.backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    slowest(0.0)  # lines the ranks up before the clock starts
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    took = slowest(time.perf_counter() - t0)
    grad_bytes = sum(p.numel() * 4 for p in model.parameters())
    if a.mode == "local":
        print(f"hvd_bench mode=local model={a.model} rank={rank} ranks={world} "
              f"batch={a.batch_size} image={a.image_size} steps={a.steps} time_s={took:.3f} "
              f"images_per_sec={a.batch_size * a.steps / took:.2f} "
              f"step_ms={1000 * took / a.steps:.1f} grad_bytes={grad_bytes}", flush=True)
    elif rank == 0:
        fusion = os.environ.get("GRADWIRE_FUSION_THRESHOLD", "default") if a.mode.startswith(
            "hvd") else "ddp-25MiB"
        print(f"hvd_bench mode={a.mode} model={a.model} ranks={world} batch={a.batch_size} "
              f"image={a.image_size} steps={a.steps} time_s={took:.3f} "
              f"images_per_sec={a.batch_size * world * a.steps / took:.2f} "
              f"step_ms={1000 * took / a.steps:.1f} grad_bytes={grad_bytes} "
              f"fusion_threshold={fusion}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
