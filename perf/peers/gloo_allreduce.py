#!/usr/bin/python3
"""Peer driver for the allreduce benchmarks: PyTorch's Gloo backend, float32 sum, in place.

Same conventions as gradwire-perf: iterations clamp(2e9 / size / ranks, 3, 50) unless -n,
2 warm-up calls, per iteration the slowest rank's time (a MAX allreduce of the times), the
median of those, and the nccl-tests busbw (bytes * 2(n-1)/n / time). Rank 0 prints one line
per size:  gloo np=N bytes=S time_us=T busbw_GBps=B wrong=W

usage:
  gloo_allreduce.py [-n ITERS] SIZE_BYTES...        under a launcher (RANK, WORLD_SIZE,
                                                    MASTER_ADDR, MASTER_PORT; GLOO_SOCKET_IFNAME
                                                    picks the interface)
  gloo_allreduce.py --np N [-n ITERS] SIZE_BYTES... forks N ranks on loopback
Needs Debian's /usr/bin/python3 with python3-torch.
"""
import argparse
import os
import statistics
import sys
import time


def run(rank: int, world: int, sizes: list, iters_fixed: int, init: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    for size in sizes:
        count = size // 4
        if count <= 0:
            raise SystemExit(f"gloo_allreduce: size {size}: need at least 4 bytes")
        base = (torch.arange(count, dtype=torch.int64) + rank) % 13
        x = base.to(torch.float32)
        iters = iters_fixed or max(3, min(50, int(2e9 // size // world)))
        for _ in range(2):
            x.copy_(base)
            dist.all_reduce(x)
        times = []
        for _ in range(iters):
            x.copy_(base)  # in place: restore the input outside the timed region
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(x)
            mine = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)
            times.append(mine.item())
        idx = torch.arange(min(count, 4096), dtype=torch.int64)
        want = sum(((idx + r) % 13) for r in range(world)).to(torch.float32)
        wrong = int((x[: len(idx)] != want).sum())
        med = statistics.median(times)
        if rank == 0:
            print(f"gloo np={world} bytes={size} time_us={med * 1e6:.1f} "
                  f"busbw_GBps={size * 2 * (world - 1) / world / med / 1e9:.4f} wrong={wrong}",
                  flush=True)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=0, help="fork this many ranks on loopback")
    ap.add_argument("-n", type=int, default=0, help="timed iterations (0: adaptive)")
    ap.add_argument("sizes", type=int, nargs="+", help="message sizes in bytes")
    a = ap.parse_args()
    if a.np > 0:
        import torch.multiprocessing as mp
        init = f"tcp://127.0.0.1:{29600 + os.getpid() % 1000}"
        mp.spawn(run, args=(a.np, a.sizes, a.n, init), nprocs=a.np)
        return
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        init = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    except KeyError as e:
        sys.exit(f"gloo_allreduce: {e.args[0]} is not set: run under a launcher or pass --np N")
    run(rank, world, a.sizes, a.n, init)


if __name__ == "__main__":
    main()
