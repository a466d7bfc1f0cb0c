#!/usr/bin/env python3
"""Stragglers on the shaped testbed: allreduce against the parameter server's modes (issue 30).

    sudo examples/ps_straggler.py [--modes allreduce,bsp,ssp:2,asp,sync:3] [--straggler both]
                                  [--rate 1gbit] [--slow 4] [--target-loss 0.39] [--max-s 60]
                                  [--json FILE] [-B BUILD_DIR]

Four workers, one per testbed host (tests/testbed/testbed.sh, links shaped to --rate), train the
same small network (32-256-8 MLP, SGD lr 0.05, momentum 0.9, 256 samples per worker and step) on
a deterministic synthetic classification set (8 Gaussian classes, seed 1234, the same for every
run). The parameter-server modes keep the parameters on one server process on a fifth host
(GW_ROLE=server) and run the servers' SGD (gradwire.torch.kv.PSOptimizer, update "sgd"): the
mean of each clock's pushes under bsp and sync:K, each push as it comes (lr / 4) under ssp and
asp. "allreduce" is the synchronous baseline: gradients averaged with gw_allreduce, then the
same SGD step on every worker. With the straggler, worker 3 runs in a CPU cgroup throttled to
1/--slow of the CPU a fast worker used in the allreduce run without a straggler (on a loaded
machine a worker has far less than one CPU, and a limit of 1/--slow of a whole CPU would not slow
it; --straggler-cpu sets the base instead), as cgroup v2 cpu.max or its v1 form cpu.cfs_quota_us.
The driver moves the rank into the cgroup from outside (`ip netns exec` mounts a sysfs of its
own). The store is on host 0's data address, so the servers' traffic crosses the shaped links.

Rank 0 measures the loss on 2048 fixed samples every 5 steps; the run stops when it reaches
--target-loss (or after --max-s). Reported per run: the fast workers' (0-2) steps per second, the
straggler's, the wall time until rank 0 saw the target loss, that time against allreduce's with
the same straggler setting, rank 0's final loss, and the pushes the servers dropped (sync:K).
Needs root (network namespaces, cgroups). --worker is the per-rank program the testbed runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORKERS = 4
EVAL_EVERY = 5


# ---- the rank ------------------------------------------------------------------------------
def data(seed: int = 1234, n: int = 8192, d: int = 32, classes: int = 8):
    import torch

    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, d, generator=g) * 0.5
    y = torch.randint(0, classes, (n,), generator=g)
    x = centers[y] + torch.randn(n, d, generator=g)
    return x, y


def throttle(result_dir: str) -> None:
    """Asks the driver to move this process into the straggler's cgroup, and waits until it has.
    (`ip netns exec` mounts a sysfs of its own, so the cgroup tree is out of this rank's sight.)"""
    d = Path(result_dir)
    (d / "straggler.pid.tmp").write_text(str(os.getpid()))
    (d / "straggler.pid.tmp").rename(d / "straggler.pid")
    deadline = time.monotonic() + 30
    while not (d / "straggler.moved").exists():
        if time.monotonic() > deadline:
            raise SystemExit("ps_straggler: the driver did not throttle this rank within 30 s")
        time.sleep(0.05)


def worker(a: argparse.Namespace) -> int:
    import torch

    import gradwire
    import gradwire.torch.kv

    torch.set_num_threads(1)
    comm = gradwire.init()
    r, n = comm.rank, comm.size
    if a.cgroup and r == n - 1:
        throttle(a.result_dir)
    x, y = data()
    ex, ey = x[:2048], y[:2048]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, a.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(a.hidden, 8))
    lossf = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    mode = a.worker
    if mode != "allreduce":
        # bsp and sync:K apply each clock's mean; ssp and asp each push: a quarter of the rate.
        lr = a.lr if mode == "bsp" or mode.startswith("sync") else a.lr / n
        opt = gradwire.torch.kv.PSOptimizer(opt, model.named_parameters(), mode=mode,
                                            update=f"sgd:{lr!r},momentum=0.9", comm=comm)
    else:
        with torch.no_grad():
            for p in model.parameters():
                comm.broadcast(p.data, root=0)
    params = list(model.parameters())
    g = torch.Generator().manual_seed(100 + r)
    stop = Path(a.stop_file)
    comm.barrier()
    t0 = time.monotonic()
    cpu0 = time.process_time()
    steps, t_target, losses, after_stop = 0, None, [], ""
    while not stop.exists():
        if time.monotonic() - t0 > a.max_s + 30:
            break  # backstop: rank 0 should have stopped the run
        try:
            idx = torch.randint(0, x.shape[0], (a.batch,), generator=g)
            opt.zero_grad()
            lossf(model(x[idx]), y[idx]).backward()
            if mode == "allreduce":
                flat = torch.cat([p.grad.reshape(-1) for p in params])
                comm.allreduce(flat, op="avg")
                off = 0
                for p in params:
                    p.grad.copy_(flat[off:off + p.numel()].view_as(p))
                    off += p.numel()
            opt.step()
        except gradwire.GradwireError as e:
            if stop.exists():
                after_stop = f"{type(e).__name__}: {e}"  # a peer left first: expected
                break
            raise
        steps += 1
        if r == 0 and steps % EVAL_EVERY == 0:
            with torch.no_grad():
                loss = float(lossf(model(ex), ey))
            t = time.monotonic() - t0
            losses.append((round(t, 3), steps, round(loss, 4)))
            if t_target is None and loss <= a.target_loss:
                t_target = t
            if t_target is not None or t > a.max_s:
                stop.write_text(f"{t}\n")
    train_s = time.monotonic() - t0
    cpu_frac = (time.process_time() - cpu0) / train_s if train_s > 0 else 0.0
    with torch.no_grad():
        final = float(lossf(model(ex), ey))
    stats = None
    if mode != "allreduce":
        try:
            s = opt.stats()
            stats = {"clock": s.clock, "min_clock": s.min_clock, "dropped": s.dropped_pushes,
                     "lost": s.lost_workers}
            opt.kv.close()
        except gradwire.GradwireError as e:
            after_stop = after_stop or f"{type(e).__name__}: {e}"
    try:
        comm.close()
    except gradwire.GradwireError:
        pass
    out = {"rank": r, "mode": mode, "steps": steps, "train_s": train_s,
           "steps_per_s": steps / train_s if train_s > 0 else 0.0, "t_target": t_target,
           "final_loss": final, "losses": losses, "cpu_frac": cpu_frac, "stats": stats, "after_stop": after_stop}
    Path(a.result_dir, f"r{r}.json").write_text(json.dumps(out))
    return 0


# ---- the driver ----------------------------------------------------------------------------
def make_cgroup(slow: float, cpu: float) -> tuple[str, str]:
    """A cgroup limited to cpu/slow of one CPU: (its path, how) or ("", why not)."""
    period = 100000
    quota = max(1000, int(period * cpu / slow))
    name = f"gw_straggler_{os.getpid()}"
    v2 = Path("/sys/fs/cgroup")
    if "cpu" in (v2 / "cgroup.controllers").read_text().split() \
            if (v2 / "cgroup.controllers").exists() else False:
        d = v2 / name
        d.mkdir(exist_ok=True)
        (d / "cpu.max").write_text(f"{quota} {period}\n")
        return str(d), f"cgroup v2 cpu.max {quota} {period}"
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v1 / "cpu.cfs_quota_us").exists():
        d = v1 / name
        d.mkdir(exist_ok=True)
        (d / "cpu.cfs_period_us").write_text(f"{period}\n")
        (d / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        return str(d), f"cgroup v1 cpu.cfs_quota_us {quota} / cpu.cfs_period_us {period} " \
            "(cpu.max's v1 form)"
    return "", "no cgroup cpu controller"


def run_one(a: argparse.Namespace, mode: str, cgroup: str) -> dict:
    res = Path(tempfile.mkdtemp(prefix="ps_straggler."))
    stop = res / "stop"
    py = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    lib = Path(a.build) / "capi" / "libgradwire.so"
    me = shlex.quote(str(Path(__file__).resolve()))
    wargs = (f"--worker {shlex.quote(mode)} --stop-file {stop} --result-dir {res} "
             f"--target-loss {a.target_loss} --max-s {a.max_s} --lr {a.lr} --batch {a.batch} "
             f"--hidden {a.hidden}")
    if cgroup:
        wargs += f" --cgroup {cgroup}"
    # The store on host 0's data address: the kv servers advertise the address on the route to
    # the store, and their traffic must cross the shaped links (not the control network).
    common = (f"export PYTHONPATH={ROOT / 'python'} GRADWIRE_LIBRARY={lib} GW_SOCKET_IFNAME=d0 "
              f"GW_STORE=10.77.0.1:$TB_PORT MASTER_ADDR=10.77.0.1 MASTER_PORT=$TB_PORT "
              f"GW_KV_SERVERS=1 GW_TIMEOUT_MS={a.timeout_ms}; ")
    server = f"GW_ROLE=server GW_KV_SERVER_RANK=0 exec {py} -m gradwire.kv" \
        if mode != "allreduce" else "true"
    cmd = (common + f"if [ $TB_HOST -lt {WORKERS} ]; then GW_RANK=$TB_HOST "
           f"GW_WORLD_SIZE={WORKERS} exec {py} {me} {wargs}; else {server}; fi")
    tb = [str(ROOT / "tests" / "testbed" / "testbed.sh"), "-n", str(WORKERS + 1),
          "-t", str(int(a.max_s) + 120)]
    if a.rate != "none":
        tb += ["-r", a.rate]
    t0 = time.monotonic()
    log = res / "testbed.log"
    with open(log, "w") as logf:
        p = subprocess.Popen(["bash", *tb, "--", cmd], stdout=logf, stderr=subprocess.STDOUT,
                             text=True)
        moved = False
        while p.poll() is None:
            if time.monotonic() - t0 > a.max_s + 180:
                p.terminate()
                p.wait()
                break
            pid = res / "straggler.pid"
            if cgroup and not moved and pid.exists():
                # Every thread of the rank goes (cgroup.procs); the rank waits for the marker.
                Path(cgroup, "cgroup.procs").write_text(pid.read_text().strip())
                (res / "straggler.moved").write_text("")
                moved = True
            time.sleep(0.05)
    wall = time.monotonic() - t0
    output = log.read_text()
    ranks = {}
    for f in res.glob("r*.json"):
        d = json.loads(f.read_text())
        ranks[d["rank"]] = d
    for f in res.iterdir():
        f.unlink()
    res.rmdir()
    if len(ranks) < WORKERS:
        tail = "\n".join(output.splitlines()[-40:])
        return {"mode": mode, "error": f"testbed status {p.returncode}, {len(ranks)} of "
                f"{WORKERS} ranks reported:\n{tail}"}
    fast = [ranks[r]["steps_per_s"] for r in range(WORKERS - 1)]
    cpu = sum(ranks[r]["cpu_frac"] for r in range(WORKERS - 1)) / (WORKERS - 1)
    stats = ranks[0].get("stats") or {}
    return {"mode": mode, "fast_steps_per_s": sum(fast) / len(fast),
            "straggler_steps_per_s": ranks[WORKERS - 1]["steps_per_s"],
            "t_target": ranks[0]["t_target"], "final_loss": ranks[0]["final_loss"],
            "steps0": ranks[0]["steps"], "dropped": max((ranks[r].get("stats") or {})
                                                        .get("dropped", 0) for r in ranks),
            "lost": stats.get("lost", 0), "run_s": wall, "fast_cpu": cpu,
            "after_stop": {r: ranks[r]["after_stop"] for r in ranks if ranks[r]["after_stop"]}}


def driver(a: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        print("ps_straggler: needs root (network namespaces, cgroups)", file=sys.stderr)
        return 77
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    settings = {"both": [False, True], "on": [True], "off": [False]}[a.straggler]
    rows = []
    print(f"# ps_straggler: {WORKERS} workers + 1 server host, links {a.rate}, batch {a.batch} "
          f"per worker, target loss {a.target_loss}, max {a.max_s} s per run; load average "
          f"{os.getloadavg()[0]:.1f} at the start (a shared machine: every figure is under load)")
    for slowed in settings:
        # The straggler gets 1/slow of the CPU the fast workers used without one (the
        # allreduce run's, measured here: on a loaded machine a worker has far less than one
        # CPU, and 1/slow of a whole CPU would not slow it), else 1/slow of one CPU.
        base = [r["fast_cpu"] for r in rows if r["mode"] == "allreduce" and "error" not in r]
        cpu = base[0] if base and a.straggler_cpu is None else (a.straggler_cpu or 1.0)
        cgroup, how = make_cgroup(a.slow, cpu) if slowed else ("", "")
        if slowed:
            print(f"# straggler: rank {WORKERS - 1} at {cpu:.3f}/{a.slow:g} of one CPU ({how}); "
                  f"{cpu:.3f}: {'the fast workers CPU use without a straggler' if base else 'given'}")
            if not cgroup:
                print("# no straggler possible here; skipping", file=sys.stderr)
                continue
        try:
            for mode in modes:
                row = run_one(a, mode, cgroup)
                row["straggler"] = slowed
                rows.append(row)
                if "error" in row:
                    print(f"# {mode} straggler={slowed}: FAILED: {row['error']}", file=sys.stderr)
                else:
                    print(f"# done: {mode} straggler={slowed} in {row['run_s']:.0f} s",
                          file=sys.stderr)
        finally:
            if cgroup:
                for _ in range(50):
                    try:
                        os.rmdir(cgroup)
                        break
                    except OSError:
                        time.sleep(0.1)
    print(f"{'#mode':<10} {'straggler':>9} {'fast_steps/s':>12} {'slow_steps/s':>12} "
          f"{'t_to_loss_s':>11} {'vs_allreduce':>12} {'final_loss':>10} {'dropped':>7}")
    for r in rows:
        if "error" in r:
            print(f"{r['mode']:<10} {'yes' if r['straggler'] else 'no':>9} {'failed':>12}")
            continue
        base = next((b for b in rows if b["mode"] == "allreduce" and "error" not in b
                     and b["straggler"] == r["straggler"]), None)
        t = r["t_target"]
        ratio = f"{t / base['t_target']:.2f}x" if t and base and base["t_target"] else "-"
        print(f"{r['mode']:<10} {'yes' if r['straggler'] else 'no':>9} "
              f"{r['fast_steps_per_s']:>12.1f} {r['straggler_steps_per_s']:>12.1f} "
              f"{(f'{t:.1f}' if t else 'not reached'):>11} {ratio:>12} "
              f"{r['final_loss']:>10.4f} {r['dropped']:>7}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
        print(f"# wrote {a.json}")
    return 1 if any("error" in r for r in rows) else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="allreduce,bsp,ssp:2,asp,sync:3")
    ap.add_argument("--straggler", choices=["both", "on", "off"], default="both")
    ap.add_argument("--rate", default="1gbit", help="tc rate of every host's link, or none")
    ap.add_argument("--slow", type=float, default=4.0, help="the straggler's CPU: 1/SLOW of one")
    ap.add_argument("--target-loss", type=float, default=0.39)
    ap.add_argument("--max-s", type=float, default=60.0)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--batch", type=int, default=256, help="samples per worker and step")
    ap.add_argument("--hidden", type=int, default=256, help="the MLP's hidden width")
    ap.add_argument("--straggler-cpu", type=float,
                    help="CPUs the straggler's limit is 1/--slow of (default: what the fast "
                    "workers used in the allreduce run without a straggler, else 1)")
    ap.add_argument("--timeout-ms", type=int, default=20000, help="GW_TIMEOUT_MS of every rank")
    ap.add_argument("--json")
    ap.add_argument("-B", "--build", default=str(ROOT / "build" / "release"))
    # The rank (run by the testbed): --worker MODE.
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--stop-file", help=argparse.SUPPRESS)
    ap.add_argument("--result-dir", help=argparse.SUPPRESS)
    ap.add_argument("--cgroup", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.slow < 1:
        ap.error("--slow must be >= 1")
    return worker(a) if a.worker else driver(a)


if __name__ == "__main__":
    sys.exit(main())
