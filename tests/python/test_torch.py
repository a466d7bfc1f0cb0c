"""The torch.distributed backend and the DDP hooks, under the launcher (torchrun's variables)."""
import re
import subprocess

import pytest

from conftest import PYTHON, ROOT, env, launch, worker


@pytest.mark.parametrize("np_", [2, 3])
def test_backend_collectives(np_):
    p = launch(np_, worker("torch_ops.py"), timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("torch ops ok") == np_


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


@pytest.mark.parametrize("mode", ["ddp", "sync"])
def test_rank_killed_mid_training_others_raise(mode):
    """The last of 2 ranks SIGKILLs itself at step 3; rank 0 must raise within GW_TIMEOUT_MS
    (3 s) rather than hang, in DDP and in a synchronous dist.broadcast (whose Work.wait() must
    raise). Started without the launcher, which would end rank 0 itself."""
    import socket
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
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
