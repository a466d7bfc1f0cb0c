"""DDP training side by side: gloo, the gradwire backend, and gradwire's compressed hooks.

    PYTHONPATH=python python/bin/gradwire-run -np 2 -- /usr/bin/python3 examples/train_ddp.py

With --device cuda the model and data live on the GPU (every rank uses cuda:0 unless
LOCAL_RANK names another device and there are several), and the configurations nccl (DDP over an
NCCL process group) and nccl-torch-powersgd:R (torch's powerSGD_hook over NCCL) are available
for comparison; each rank sets NCCL_HOSTID to its rank first, so ranks sharing one GPU pose as
hosts (run under CUDA MPS, as ../shared/peers/with_mps.sh does).

Every configuration trains the same model (a small transformer encoder classifying synthetic
token sequences it makes itself, same seed) for --steps steps; rank 0 prints final loss, loss
ratio to gloo, median step time and gradient bytes sent per step per rank, and writes
train_ddp.png (loss curves and step times) when matplotlib is present. examples/bench_ddp.sh runs
it once per configuration, interleaved, on loopback and on the shaped testbed, and prints the
table docs/python.md reports.
"""
import argparse
import gc
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

import gradwire.torch  # noqa: F401 (registers the backend)
from gradwire.torch import comm_of, hooks

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--png", default="train_ddp.png")
ap.add_argument("--configs", default="gloo,gradwire,gw-fp16,gw-topk:0.01,gw-powersgd:4",
                help="comma list; also gloo-torch-powersgd:R (torch's powerSGD_hook over gloo; "
                "needs --one-bucket on Debian's torch 1.13, see there); with --device cuda also "
                "nccl and nccl-torch-powersgd:R")
ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
ap.add_argument("--vocab", type=int, default=1000, help="embedding rows (the embedding's gradient"
                " is dense in DDP, so a large vocabulary makes communication weigh against compute)")
ap.add_argument("--dim", type=int, default=128)
ap.add_argument("--layers", type=int, default=2)
ap.add_argument("--seq", type=int, default=32)
ap.add_argument("--optim", default="adam", choices=["adam", "sgd"], help="sgd's step costs less"
                " compute, so communication weighs more in the step time")
ap.add_argument("--bucket-mb", type=float, default=25, help="DDP's bucket_cap_mb")
ap.add_argument("--one-bucket", action="store_true", help="every gradient in one DDP bucket (no "
                "small first bucket): torch's powerSGD_hook over gloo on torch 1.13 issues the "
                "collectives of several buckets from gloo's callbacks in an order that differs "
                "between ranks, which gloo aborts on (op.preamble.length <= op.nbytes); with one "
                "bucket there is one order")
ap.add_argument("--json", default="", help="rank 0 appends one JSON line per configuration here")
args = ap.parse_args()

if args.device == "cuda":
    import os
    os.environ.setdefault("NCCL_HOSTID", f"gw-rank-{os.environ.get('RANK', '0')}")
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)
gw_group = dist.new_group(backend="gradwire")  # gradwire for the gradients, gloo for the rest
gw_comm = comm_of(gw_group)
dev = torch.device("cpu")
nccl_group = None
if args.device == "cuda":
    n = torch.cuda.device_count()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % n)
    torch.cuda.set_device(dev)
    if any(c.startswith("nccl") for c in args.configs.split(",")):
        nccl_group = dist.new_group(backend="nccl")


class Model(torch.nn.Module):
    def __init__(self, vocab=args.vocab, dim=args.dim, classes=10):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        layer = torch.nn.TransformerEncoderLayer(dim, 4, 4 * dim, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, args.layers)
        self.head = torch.nn.Linear(dim, classes)

    def forward(self, x):
        return self.head(self.enc(self.emb(x)).mean(1))


def data(step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    y = (x[:, 0] % 10)  # a learnable rule
    return x.to(dev), y.to(dev)


def train(config):
    torch.manual_seed(0)
    model = Model().to(dev)
    nbytes = sum(p.numel() * 4 for p in model.parameters())
    pg = gw_group if config == "gradwire" else nccl_group if config.startswith("nccl") else None
    if args.one_bucket:
        dist._DEFAULT_FIRST_BUCKET_BYTES = int(args.bucket_mb * 1024 * 1024)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, process_group=pg, device_ids=[dev.index] if dev.type == "cuda" else None,
        bucket_cap_mb=args.bucket_mb)
    sent = None
    if config.startswith("gw-"):
        ddp.register_comm_hook(gw_comm, hooks.compressed_hook(config[3:]))
    elif config.startswith(("gloo-torch-powersgd:", "nccl-torch-powersgd:")):
        state = psgd.PowerSGDState(process_group=pg, matrix_approximation_rank=int(
            config.split(":")[1]), start_powerSGD_iter=2)
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
    opt = (torch.optim.Adam(ddp.parameters(), lr=1e-3) if args.optim == "adam"
           else torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9))
    losses, times = [], []
    gw_comm.reset_stats()
    for step in range(args.steps):
        x, y = data(step)
        dist.barrier()
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    if config.startswith("gw-"):
        sent = gw_comm.stats().bytes_sent / args.steps
    elif world > 1 and "powersgd" not in config:
        sent = 2 * (world - 1) / world * nbytes  # a ring allreduce of every gradient
    del ddp, opt
    gc.collect()  # the finished DDP's reducer must be gone before the next one starts
    dist.barrier()
    return losses, times, sent


results = {}
for config in args.configs.split(","):
    results[config] = train(config)
    if rank == 0:  # one line per configuration as it ends, so a piped run shows progress
        ms = 1000 * statistics.median(results[config][1])
        print(f"{config}: {args.steps} steps done, median step {ms:.1f} ms", flush=True)

if rank == 0:
    base = statistics.mean(results["gloo"][0][-5:]) if "gloo" in results else None
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"{world} ranks, {args.steps} steps, batch {args.batch}, {where}, torch {torch.__version__}")
    print(f"{'config':24} {'final loss':>10} {'vs gloo':>8} {'step ms':>8} {'MB sent/step':>13}")
    for config, (losses, times, sent) in results.items():
        final = statistics.mean(losses[-5:])
        ratio = f"{final / base:.2f}" if base else "-"
        ms = statistics.median(times[2:]) * 1000
        mb = f"{sent / 1e6:.2f}" if sent is not None else "-"
        print(f"{config:24} {final:10.4f} {ratio:>8} {ms:8.1f} {mb:>13}")
        if args.json:
            import json
            with open(args.json, "a") as f:
                f.write(json.dumps({"config": config, "world": world, "final_loss": final,
                                    "step_ms": ms, "sent_bytes": sent, "losses": losses,
                                    "times": times}) + "\n")
    if args.png:  # --png '' writes none
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
            for config, (losses, times, _) in results.items():
                a.plot(losses, label=config)
                b.plot([t * 1000 for t in times], label=config)
            a.set(xlabel="step", ylabel="loss", title="loss")
            b.set(xlabel="step", ylabel="ms", title="step time")
            a.legend()
            fig.tight_layout()
            fig.savefig(args.png)
            print(f"wrote {args.png}")
        except ImportError:
            pass
dist.destroy_process_group()
