"""A mixture-of-experts layer on gradwire: tokens routed to experts on other ranks with uneven
all_to_all_single.

Every rank holds --experts-per-rank experts (small MLPs) and its own tokens. A router (a linear
gate, the same on every rank) sends each token to its top-1 expert: the tokens go to the expert's
rank with all_to_all_single whose splits are the counts per destination (uneven, and different on
every rank), the expert outputs come back the same way with the splits swapped, and each output
is scaled by its gate probability. The all-to-all is an autograd function (its backward is the
all-to-all with the splits swapped), so the loss's gradients reach the experts on other ranks.

Every rank then computes the same layer in its own process over every rank's tokens (the
reference) and checks its tokens' outputs and input gradients, and its experts' parameter
gradients, against it: equal to float tolerance, or the example exits 1 (on every rank).

    gradwire-run -np 2 -- python3 examples/moe_alltoall.py [--tokens 64] [--experts-per-rank 2]
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist

import gradwire
import gradwire.torch  # noqa: F401 (registers the "gradwire" backend)


def experts_and_gate(args: argparse.Namespace, world: int, dtype: torch.dtype) -> tuple:
    """Every expert of the job and the gate: the same on every rank (same seed)."""
    torch.manual_seed(args.seed)
    d, h = args.dim, 2 * args.dim
    experts = [torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.GELU(),
                                   torch.nn.Linear(h, d)).to(dtype)
               for _ in range(world * args.experts_per_rank)]
    gate = torch.nn.Linear(d, world * args.experts_per_rank, bias=False).to(dtype)
    gate.weight.requires_grad_(False)
    return experts, gate


def tokens(args: argparse.Namespace, rank: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank r's tokens: a different number on every rank, so the splits are uneven."""
    g = torch.Generator().manual_seed(args.seed + 100 + rank)
    return torch.randn(args.tokens + 7 * rank, args.dim, generator=g, dtype=dtype)


def route(gate: torch.nn.Linear, x: torch.Tensor) -> tuple:
    probs = torch.softmax(gate(x), dim=-1)
    p, e = probs.max(dim=-1)
    return p, e


class AllToAll(torch.autograd.Function):
    """all_to_all_single with splits as an autograd function."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list, in_splits: list) -> torch.Tensor:
        ctx.splits = (out_splits, in_splits)
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple:
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits)
        return back, None, None


def moe_distributed(x: torch.Tensor, gate: torch.nn.Linear, mine: list, first: int,
                    per_rank: int, world: int) -> torch.Tensor:
    """The layer on this rank's tokens x, with this rank's experts mine (ids first...)."""
    p, e = route(gate, x)
    order = torch.argsort(e, stable=True)  # by expert, so by destination rank
    dest = e[order] // per_rank
    send_counts = torch.bincount(dest, minlength=world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)  # one count per rank: even
    sc, rc = send_counts.tolist(), recv_counts.tolist()
    arrived = AllToAll.apply(x[order], rc, sc)
    ids = torch.empty(sum(rc), dtype=torch.int64)
    dist.all_to_all_single(ids, e[order].contiguous(), rc, sc)
    out = torch.zeros_like(arrived)
    for k, expert in enumerate(mine):
        sel = ids == first + k
        if sel.any():
            out = out.index_put((sel.nonzero(as_tuple=True)[0],), expert(arrived[sel]))
    back = AllToAll.apply(out, sc, rc)
    y = torch.empty_like(back)
    y = y.index_put((order,), back)
    return y * p.unsqueeze(-1)


def moe_reference(x: torch.Tensor, gate: torch.nn.Linear, experts: list) -> torch.Tensor:
    p, e = route(gate, x)
    y = torch.zeros_like(x)
    for k, expert in enumerate(experts):
        sel = e == k
        if sel.any():
            y = y.index_put((sel.nonzero(as_tuple=True)[0],), expert(x[sel]))
    return y * p.unsqueeze(-1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=64, help="tokens on rank 0 (rank r: +7r)")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--experts-per-rank", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float64")
    ap.add_argument("--backend", default="gradwire", help="torch.distributed backend (gloo: "
                    "the same layer on torch's own, for comparison)")
    ap.add_argument("--corrupt", action="store_true",
                    help="perturb one expert's output on rank 0 (shows that the check catches it)")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    tol = 1e-9 if dtype == torch.float64 else 1e-4

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.backend == "gradwire" and not gradwire.has_collective("alltoallv"):
        print("moe_alltoall: the loaded libgradwire.so has no gw_alltoallv (uneven all-to-all)",
              file=sys.stderr)
        return 2
    per = args.experts_per_rank
    experts, gate = experts_and_gate(args, world, dtype)
    mine = experts[rank * per:(rank + 1) * per]
    if args.corrupt and rank == 0:
        with torch.no_grad():
            mine[0][2].bias[0] += 1e-3

    x = tokens(args, rank, dtype).requires_grad_()
    y = moe_distributed(x, gate, mine, rank * per, per, world)
    (y ** 2).sum().backward()

    # The reference: every rank's tokens through every expert in this process.
    ref_experts, ref_gate = experts_and_gate(args, world, dtype)
    xs = [tokens(args, r, dtype).requires_grad_() for r in range(world)]
    ys = [moe_reference(xr, ref_gate, ref_experts) for xr in xs]
    sum((yr ** 2).sum() for yr in ys).backward()

    problems = []
    if not torch.allclose(y, ys[rank], rtol=tol, atol=tol):
        problems.append(f"outputs: max difference {(y - ys[rank]).abs().max().item():.3g}")
    if not torch.allclose(x.grad, xs[rank].grad, rtol=tol, atol=tol):
        problems.append("input gradients: max difference "
                        f"{(x.grad - xs[rank].grad).abs().max().item():.3g}")
    for k, (a, b) in enumerate(zip(mine, ref_experts[rank * per:(rank + 1) * per])):
        for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
            ga = pa.grad if pa.grad is not None else torch.zeros_like(pa)
            gb = pb.grad if pb.grad is not None else torch.zeros_like(pb)
            if not torch.allclose(ga, gb, rtol=tol, atol=tol):
                problems.append(f"expert {rank * per + k} {name} gradient: max difference "
                                f"{(ga - gb).abs().max().item():.3g}")
    bad = torch.tensor([len(problems)])
    dist.all_reduce(bad)
    for p in problems:
        print(f"rank {rank}: MISMATCH {p}", flush=True)
    if bad.item():
        return 1
    _, e = route(gate, x.detach())
    counts = torch.bincount(e // per, minlength=world).tolist()
    print(f"rank {rank}: moe {x.shape[0]} tokens to ranks {counts}: matches the one-process "
          "layer", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
