"""Horovod's API (import gradwire.torch as hvd): every call, and training that matches DDP.

The multi-rank runs start torch on every rank (seconds each): marked slow, like test_torch.py."""
import pytest

from conftest import PYTHON, ROOT, launch, worker


@pytest.mark.slow
@pytest.mark.parametrize("np_", [2, 3])
def test_every_call(np_):
    p = launch(np_, worker("hvd_ops.py"), timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("hvd ops ok") == np_


@pytest.mark.slow
@pytest.mark.parametrize("mode,fusion", [
    ("fused", None),
    ("unfused", "0"),       # one reduction per parameter
    ("fused", "3000"),      # buckets of a few parameters
    ("bpps2", None),        # backward_passes_per_step=2 against DDP's no_sync
    ("fp16", None),
    ("codec", None),
    ("syncbn", None),
    ("overlap", "1000"),    # reductions start while backward runs (3 buckets of 2 parameters)
])
def test_training_matches_ddp(mode, fusion):
    extra = {"GRADWIRE_FUSION_THRESHOLD": fusion} if fusion is not None else None
    p = launch(2, worker("hvd_train.py"), mode, "5", timeout=120, extra_env=extra)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count(f"hvd train {mode} ok") == 2


@pytest.mark.slow
def test_example_script_learns():
    p = launch(2, str(ROOT / "examples" / "train_horovod.py"), "--epochs", "2",
               "--batches-per-epoch", "15", "--min-accuracy", "0.9", timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "epoch 1:" in p.stdout


def test_refusals_on_one_rank():
    # Adasum, a bad backward_passes_per_step and duplicate names are refused with clear errors.
    import subprocess

    from conftest import env
    from gradwire._ports import free_ports
    port = free_ports(1, "127.0.0.1")[0]
    code = (
        "import torch, gradwire, gradwire.torch as hvd\n"
        f"hvd.init(gradwire.Comm(rank=0, world_size=1, store_addr='127.0.0.1:{port}'))\n"
        "assert hvd.size() == 1 and hvd.local_rank() == 0 and hvd.cross_size() == 1\n"
        "m = torch.nn.Linear(2, 2)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for kw, exc in [(dict(op=hvd.Adasum), NotImplementedError),\n"
        "                (dict(backward_passes_per_step=0), ValueError),\n"
        "                (dict(named_parameters=[('a', m.weight), ('a', m.bias)]), ValueError),\n"
        "                (dict(named_parameters=[('a', m.weight)]), ValueError)]:\n"
        "    try:\n"
        "        hvd.DistributedOptimizer(opt, **kw)\n"
        "        raise AssertionError(kw)\n"
        "    except exc:\n"
        "        pass\n"
        "o = hvd.DistributedOptimizer(opt, named_parameters=m.named_parameters())\n"
        "m(torch.ones(1, 2)).sum().backward()\n"
        "o.step()\n"
        "assert torch.equal(hvd.allreduce(torch.ones(2)), torch.ones(2))\n"
        "print('refusals ok')\n"
    )
    p = subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=env(), capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "refusals ok" in p.stdout
