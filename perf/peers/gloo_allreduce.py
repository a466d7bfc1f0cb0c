#!/usr/bin/python3
"""Peer driver for the collective benchmarks: PyTorch's Gloo backend, one collective of float32.

--op (default allreduce):
  allreduce       all_reduce, sum, in place                            busbw = algbw * 2(n-1)/n
  broadcast       broadcast from rank 0, in place                      busbw = algbw
  allgather       all_gather_into_tensor, else all_gather into views   busbw = algbw * (n-1)/n
                  of one output tensor (torch 1.13's Gloo has only the latter)
  reduce_scatter  reduce_scatter_tensor, else reduce_scatter, sum      busbw = algbw * (n-1)/n
                  (torch 1.13's Gloo has neither: --probe says so)
SIZE is the whole buffer as in nccl-tests: allgather's output (each rank gives SIZE/n),
reduce_scatter's input (each rank keeps SIZE/n); for those two it is rounded down to a multiple of
4n bytes, for the others of 4. Same conventions as gradwire-perf: iterations
clamp(2e9 / size / ranks, 3, 50) unless -n, 2 warm-up calls, per iteration the slowest rank's time
(a MAX allreduce of the times), the median of those. After the timed calls one more call, its
output first overwritten with -1, is checked on every rank against a rank- and index-dependent
pattern (a strided sample of at most 65536 elements that reaches every rank's block); wrong is
the sum over the ranks. Rank 0 prints one line per size:
  gloo np=N op=OP bytes=S time_us=T busbw_GBps=B wrong=W machine_cpu_s_per_gb=C
C: the whole machine's busy CPU time (/proc/stat) over rank 0's timed iterations per GB of the
buffer, as gradwire-perf --cpu (its loop also has each iteration's barrier, time reduction and,
for allreduce, the copy that restores the input); the run's own only on an otherwise idle machine.

usage:
  gloo_allreduce.py [--op OP] [-n ITERS] SIZE_BYTES...        under a launcher (RANK, WORLD_SIZE,
                                                              MASTER_ADDR, MASTER_PORT;
                                                              GLOO_SOCKET_IFNAME picks the
                                                              interface)
  gloo_allreduce.py --np N [--op OP] [-n ITERS] SIZE_BYTES... forks N ranks on loopback
  gloo_allreduce.py --probe OP                                exit 0 if this torch's Gloo runs OP,
                                                              else print why and exit 3
Needs Debian's /usr/bin/python3 with python3-torch.
"""
import argparse
import os
import statistics
import sys
import time

OPS = ("allreduce", "broadcast", "allgather", "reduce_scatter")


def machine_busy_s() -> float:
    """Every CPU's busy time so far (user nice system irq softirq steal of /proc/stat), -1 if
    unreadable."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        v = [float(x) for x in fields[1:9]] + [0.0] * 8
        return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return -1.0


def busbw_factor(op: str, world: int) -> float:
    if op == "allreduce":
        return 2 * (world - 1) / world
    if op == "broadcast":
        return 1.0
    return (world - 1) / world


def make_call(op: str, world: int, x, out):
    """Runs OP once (input x, output out) and returns that call, trying the tensor forms of
    allgather and reduce_scatter first. Every rank tries the same forms in the same order, and
    Gloo refuses an unsupported one before it communicates, so all ranks settle on the same call.
    Raises RuntimeError when this Gloo has none."""
    import torch.distributed as dist

    if op == "allreduce":
        forms = [("all_reduce", lambda: dist.all_reduce(out))]
    elif op == "broadcast":
        forms = [("broadcast", lambda: dist.broadcast(out, 0))]
    elif op == "allgather":
        views = list(out.chunk(world))
        forms = [("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(out, x)),
                 ("all_gather", lambda: dist.all_gather(views, x))]
    else:
        pieces = list(x.chunk(world))
        forms = [("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(out, x)),
                 ("reduce_scatter", lambda: dist.reduce_scatter(out, pieces))]
    errors = []
    for name, f in forms:
        if not hasattr(dist, name):
            errors.append(f"no torch.distributed.{name}")
            continue
        try:
            f()
            return f
        except RuntimeError as e:
            errors.append(f"{name}: {str(e).splitlines()[0]}")
    raise RuntimeError("; ".join(errors))


def inputs(op: str, rank: int, world: int, count: int):
    """(x, out, base, want_of): x the input, out the output (the same tensor where the call is in
    place), base what x holds before each call, want_of(idx) the expected output at indices idx."""
    import torch

    blk = count // world
    if op == "allgather":
        # Each rank's block has a value of its own, so a block in the wrong place is caught.
        base = (16 * rank + torch.arange(blk, dtype=torch.int64) % 13).to(torch.float32)
        x = base.clone()
        out = torch.empty(count, dtype=torch.float32)
        return x, out, base, lambda idx: (16 * (idx // blk) + (idx % blk) % 13).to(torch.float32)
    base = ((torch.arange(count, dtype=torch.int64) + rank) % 13).to(torch.float32)
    if op == "broadcast":
        x = base.clone() if rank == 0 else torch.full((count,), -1.0)
        return x, x, base, lambda idx: (idx % 13).to(torch.float32)
    if op == "allreduce":
        x = base.clone()
        return x, x, base, lambda idx: sum((idx + r) % 13 for r in range(world)).to(torch.float32)
    out = torch.empty(blk, dtype=torch.float32)
    return base.clone(), out, base, lambda idx: sum(
        (rank * blk + idx + r) % 13 for r in range(world)).to(torch.float32)


def run(rank: int, world: int, op: str, sizes: list, iters_fixed: int, init: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    blocked = op in ("allgather", "reduce_scatter")
    for size in sizes:
        count = size // 4 // world * world if blocked else size // 4
        if count <= 0:
            raise SystemExit(f"gloo_allreduce: size {size}: need at least "
                             f"{4 * world if blocked else 4} bytes")
        size = count * 4
        x, out, base, want_of = inputs(op, rank, world, count)
        # Restores x before each call where the call overwrites its own input (all_reduce in
        # place; broadcast's root keeps its data, the others' input is their output).
        restore = (lambda: x.copy_(base)) if op == "allreduce" else (lambda: None)
        iters = iters_fixed or max(3, min(50, int(2e9 // size // world)))
        restore()
        call = make_call(op, world, x, out)  # the first warm-up call
        restore()
        call()
        times = []
        busy0 = machine_busy_s()
        for _ in range(iters):
            restore()
            dist.barrier()
            t = time.perf_counter()
            call()
            mine = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)
            times.append(mine.item())
        busy1 = machine_busy_s()
        cpu = "?" if busy0 < 0 or busy1 < 0 else f"{(busy1 - busy0) / (size * iters / 1e9):.4f}"
        # A wrong result is not a figure: one more call into an overwritten output, checked.
        restore()
        if not (op == "broadcast" and rank == 0) and op != "allreduce":
            out.fill_(-1.0)
        call()
        n_out = out.numel()
        step = max(1, n_out // 65536)
        idx = torch.unique(torch.cat([torch.arange(0, n_out, step, dtype=torch.int64),
                                      torch.tensor([n_out - 1], dtype=torch.int64)]))
        wrong = torch.tensor([int((out[idx] != want_of(idx)).sum())], dtype=torch.int64)
        dist.all_reduce(wrong)
        med = statistics.median(times)
        if rank == 0:
            print(f"gloo np={world} op={op} bytes={size} time_us={med * 1e6:.1f} "
                  f"busbw_GBps={size * busbw_factor(op, world) / med / 1e9:.4f} "
                  f"wrong={int(wrong.item())} machine_cpu_s_per_gb={cpu}", flush=True)
    dist.destroy_process_group()


def probe(op: str) -> int:
    """Whether this torch's Gloo runs OP: a one-rank group tries the same calls as a run."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    x, out, _, _ = inputs(op, 0, 1, 4)
    try:
        make_call(op, 1, x, out)
    except RuntimeError as e:
        print(f"torch {torch.__version__}'s Gloo cannot run {op}: {e}")
        return 3
    finally:
        dist.destroy_process_group()
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=0, help="fork this many ranks on loopback")
    ap.add_argument("--op", choices=OPS, default="allreduce", help="the collective")
    ap.add_argument("--probe", choices=OPS, help="exit 0 if Gloo runs this collective, else 3")
    ap.add_argument("-n", type=int, default=0, help="timed iterations (0: adaptive)")
    ap.add_argument("sizes", type=int, nargs="*", help="message sizes in bytes")
    a = ap.parse_args()
    if a.probe:
        sys.exit(probe(a.probe))
    if not a.sizes:
        ap.error("no sizes")
    if a.np > 0:
        import torch.multiprocessing as mp
        init = f"tcp://127.0.0.1:{29600 + os.getpid() % 1000}"
        mp.spawn(run, args=(a.np, a.op, a.sizes, a.n, init), nprocs=a.np)
        return
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        init = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    except KeyError as e:
        sys.exit(f"gloo_allreduce: {e.args[0]} is not set: run under a launcher or pass --np N")
    run(rank, world, a.op, a.sizes, a.n, init)


if __name__ == "__main__":
    main()
