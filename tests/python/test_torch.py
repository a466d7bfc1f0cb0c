"""The torch.distributed backend and the DDP hooks, under the launcher (torchrun's variables).

The multi-rank runs take several seconds each (torch's import, spawned ranks): marked slow, out of
the quick run (pytest -m "not slow"); the one-rank group test stays in it."""
import re
import subprocess

import pytest

from conftest import PYTHON, ROOT, env, launch, worker


@pytest.mark.slow
@pytest.mark.parametrize("np_", [2, 3])
def test_backend_collectives(np_):
    p = launch(np_, worker("torch_ops.py"), timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("torch ops ok") == np_


@pytest.mark.slow
@pytest.mark.parametrize("backend,hook", [
    ("gradwire", "none"),
    ("gradwire", "allreduce"),
    ("gloo", "allreduce"),           # gloo for DDP's control plane, gradwire for the gradients
    ("gradwire", "fp16"),
    ("gradwire", "bf16"),
    ("gloo", "topk:0.1"),
    ("gradwire", "sign"),
    ("gradwire", "powersgd:2"),
])
def test_ddp_parameters_identical(backend, hook):
    # ddp.py asserts, on every rank, that the parameters equal every other rank's afterwards.
    p = launch(2, worker("ddp.py"), backend, hook, "4", timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count(f"ddp {backend} {hook} ok") == 2


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "sync"])
def test_rank_killed_mid_training_others_raise(mode):
    """The last of 2 ranks SIGKILLs itself at step 3; rank 0 must raise within GW_TIMEOUT_MS
    (3 s) rather than hang, in DDP and in a synchronous dist.broadcast (whose Work.wait() must
    raise). Started without the launcher, which would end rank 0 itself."""
    from gradwire._ports import free_ports
    port = free_ports(1)[0]
    procs = [subprocess.Popen([PYTHON, worker("kill.py"), *(["sync"] if mode == "sync" else [])],
                              cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env=env(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                                      GW_TIMEOUT_MS="3000"))
             for r in range(2)]
    out0, _ = procs[0].communicate(timeout=60)
    procs[1].wait(timeout=60)
    assert procs[1].returncode == -9
    assert procs[0].returncode == 0, out0
    m = re.search(r"rank 0: raised (\w+) after ([0-9.]+) s", out0)
    assert m and float(m.group(2)) < 5, out0


def test_one_rank_groups_and_group_names():
    # torch's distributed_test.py sets MASTER_ADDR alone, makes one-rank groups and destroys
    # groups by name (torch 2.x keeps a name in a ProcessGroup's backends, which a Python
    # ProcessGroup has none of): both failed on torch 2.11 before.
    code = (
        "import os, torch, torch.distributed as dist\n"
        "os.environ['MASTER_ADDR'] = '127.0.0.1'\n"
        "os.environ.pop('MASTER_PORT', None)\n"
        "from gradwire.torch import ProcessGroupGradwire\n"
        "pg = ProcessGroupGradwire(dist.HashStore(), 0, 1)\n"
        "pg._set_group_name('g7')\n"
        "assert pg.group_name == 'g7', pg.group_name\n"
        "dist.init_process_group('gradwire', store=dist.HashStore(), rank=0, world_size=1)\n"
        "g = dist.new_group([0])\n"
        "t = torch.ones(3)\n"
        "dist.all_reduce(t, group=g)\n"
        "assert torch.equal(t, torch.ones(3))\n"
        "dist.destroy_process_group(g)\n"
        "dist.destroy_process_group()\n"
        "print('groups ok')\n")
    e = env()
    for k in ("RANK", "WORLD_SIZE", "MASTER_PORT", "GW_STORE"):
        e.pop(k, None)
    p = subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=e, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and "groups ok" in p.stdout, p.stdout + p.stderr
