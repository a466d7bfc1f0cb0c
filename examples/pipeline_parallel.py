"""Pipeline parallelism on gradwire: a model split into stages on different ranks.

Each rank holds a contiguous slice of the model's layers (a stage). A batch is cut into
micro-batches; activations go forward from stage to stage and the gradients of those activations
go back, with torch.distributed send/recv on the "gradwire" backend, in a GPipe schedule (every
forward, then every backward) or 1F1B (after a warm-up, one forward and one backward in turn, so
each stage holds at most as many activations as there are stages). Each stage then takes an SGD
step on its own parameters.

Every rank also trains the whole model in its own process on the whole batch (the reference),
and at the end checks its stage's parameters, and the last stage the loss of every step, against
it: equal to float tolerance, or the example exits 1 (on every rank: the verdict is all-reduced).

    gradwire-run -np 2 -- python3 examples/pipeline_parallel.py [--schedule 1f1b] [--steps 5]
    (2 to 4 ranks: the model has 4 layers)
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist

import gradwire.torch  # noqa: F401 (registers the "gradwire" backend)

WIDTHS = [16, 32, 32, 24, 8]  # input, the three hidden sizes, output: 4 Linear layers


def make_model(seed: int, dtype: torch.dtype) -> torch.nn.Sequential:
    """The whole model, the same on every rank (same seed)."""
    torch.manual_seed(seed)
    layers: list = []
    for i in range(len(WIDTHS) - 1):
        layers.append(torch.nn.Linear(WIDTHS[i], WIDTHS[i + 1]).to(dtype))
        if i < len(WIDTHS) - 2:
            layers.append(torch.nn.Tanh())
    return torch.nn.Sequential(*layers)


def stage_bounds(stages: int) -> list:
    """[(first, last) module indices of each stage]: the Linear layers as evenly as possible,
    each with the activation after it."""
    n_linear = len(WIDTHS) - 1
    per = [n_linear // stages + (1 if s < n_linear % stages else 0) for s in range(stages)]
    out, at = [], 0
    for k in per:
        first = 2 * at
        at += k
        last = min(2 * at - 1, 2 * n_linear - 2)  # modules: Linear, Tanh, ..., Linear
        out.append((first, last))
    return out


def data(seed: int, batch: int, dtype: torch.dtype) -> tuple:
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, WIDTHS[0], generator=g, dtype=dtype)
    y = torch.randn(batch, WIDTHS[-1], generator=g, dtype=dtype)
    return x, y


def reference(args: argparse.Namespace, dtype: torch.dtype) -> tuple:
    """The whole model trained in this process on the whole batch: (model, losses)."""
    model = make_model(args.seed, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    losses = []
    x, y = data(args.seed, args.batch, dtype)
    for _ in range(args.steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


class Stage:
    """This rank's slice of the model and the send/recv of one training step."""

    def __init__(self, args: argparse.Namespace, rank: int, stages: int,
                 dtype: torch.dtype) -> None:
        self.rank, self.stages, self.dtype = rank, stages, dtype
        self.first, self.last = stage_bounds(stages)[rank]
        whole = make_model(args.seed, dtype)
        self.net = torch.nn.Sequential(*list(whole)[self.first:self.last + 1])
        self.opt = torch.optim.SGD(self.net.parameters(), lr=args.lr)
        self.micro = args.micro_batches
        self.corrupt = args.corrupt
        self.pending: list = []  # (Work, tensor) of sends in flight: the tensor stays alive

    def width_in(self) -> int:
        return self.net[0].in_features

    def width_out(self) -> int:
        return [m for m in self.net if isinstance(m, torch.nn.Linear)][-1].out_features

    def send(self, t: torch.Tensor, peer: int, tag: int) -> None:
        t = t.detach().contiguous()
        self.pending.append((dist.isend(t, peer, tag=tag), t))

    def forward(self, i: int, xs: list, ys: list, saved: dict, losses: list) -> None:
        if self.rank == 0:
            inp = xs[i]
        else:
            inp = torch.empty(xs[i].shape[0], self.width_in(), dtype=self.dtype)
            dist.recv(inp, self.rank - 1, tag=i)
            inp.requires_grad_()
        out = self.net(inp)
        if self.rank == self.stages - 1:
            # Each micro-batch's mean, over the micro-batches: the whole batch's mean.
            out = torch.nn.functional.mse_loss(out, ys[i]) / self.micro
            losses.append(out.detach())
        else:
            self.send(out, self.rank + 1, tag=i)
        saved[i] = (inp, out)

    def backward(self, i: int, saved: dict) -> None:
        inp, out = saved.pop(i)
        if self.rank == self.stages - 1:
            out.backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, self.rank + 1, tag=1000 + i)
            if self.corrupt and i == 0:
                grad[0, 0] += 1e-3  # --corrupt: a wrong gradient the check must catch
            out.backward(grad)
        if self.rank > 0:
            self.send(inp.grad, self.rank - 1, tag=1000 + i)

    def step(self, x: torch.Tensor, y: torch.Tensor, schedule: str) -> float:
        xs, ys = x.chunk(self.micro), y.chunk(self.micro)
        saved: dict = {}
        losses: list = []
        self.opt.zero_grad()
        if schedule == "gpipe":
            for i in range(self.micro):
                self.forward(i, xs, ys, saved, losses)
            for i in reversed(range(self.micro)):
                self.backward(i, saved)
        else:  # 1f1b: warm-up forwards, then one forward and one backward in turn, cool-down
            warm = min(self.stages - self.rank - 1, self.micro)
            for i in range(warm):
                self.forward(i, xs, ys, saved, losses)
            for k in range(self.micro - warm):
                self.forward(warm + k, xs, ys, saved, losses)
                self.backward(k, saved)
            for i in range(self.micro - warm, self.micro):
                self.backward(i, saved)
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()
        self.opt.step()
        return float(sum(losses)) if losses else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float64")
    ap.add_argument("--tolerance", type=float, default=None,
                    help="relative tolerance (default 1e-9 for float64, 1e-4 for float32)")
    ap.add_argument("--corrupt", action="store_true",
                    help="perturb one received gradient (shows that the check catches it)")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    tol = args.tolerance or (1e-9 if dtype == torch.float64 else 1e-4)
    if args.batch % args.micro_batches:
        ap.error("--batch must divide by --micro-batches")

    dist.init_process_group("gradwire")
    rank, stages = dist.get_rank(), dist.get_world_size()
    if not 1 <= stages <= len(WIDTHS) - 1:
        print(f"pipeline_parallel: {stages} ranks; the model has {len(WIDTHS) - 1} layers",
              file=sys.stderr)
        return 2
    stage = Stage(args, rank, stages, dtype)
    x, y = data(args.seed, args.batch, dtype)
    losses = [stage.step(x, y, args.schedule) for _ in range(args.steps)]

    ref_model, ref_losses = reference(args, dtype)
    ref = list(ref_model)[stage.first:stage.last + 1]
    problems = []
    for (name, p), q in zip(stage.net.named_parameters(),
                            torch.nn.Sequential(*ref).parameters()):
        if not torch.allclose(p, q, rtol=tol, atol=tol):
            problems.append(f"parameter {name}: max difference {(p - q).abs().max().item():.3g}")
    if rank == stages - 1:
        for s, (a, b) in enumerate(zip(losses, ref_losses)):
            if abs(a - b) > tol * max(1.0, abs(b)):
                problems.append(f"step {s}: loss {a!r}, one process {b!r}")
    bad = torch.tensor([len(problems)])
    dist.all_reduce(bad)
    for p in problems:
        print(f"rank {rank}: MISMATCH {p}", flush=True)
    if rank == stages - 1:
        print(f"pipeline {args.schedule}: {stages} stages, {args.micro_batches} micro-batches, "
              f"loss {losses[0]:.6f} -> {losses[-1]:.6f} (one process: {ref_losses[-1]:.6f})",
              flush=True)
    if bad.item():
        return 1
    print(f"rank {rank}: pipeline {args.schedule} matches the one-process model", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
