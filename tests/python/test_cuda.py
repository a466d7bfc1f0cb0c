"""The package on CUDA tensors (a GPU host; scripts/gpu_check.sh python runs it there).

Skipped where the interpreter's torch sees no GPU, as on the CI machine.
"""
import subprocess

import pytest

from conftest import PYTHON, launch, worker


def _has_cuda() -> bool:
    p = subprocess.run([PYTHON, "-c", "import torch; print(torch.cuda.is_available())"],
                       capture_output=True, text=True, timeout=120)
    return p.returncode == 0 and p.stdout.strip() == "True"


@pytest.mark.slow
@pytest.mark.parametrize("np_", [2])
def test_cuda_collectives_compression_and_ddp(np_):
    # Asked here, not in a skipif: collecting the file (the quick run too) starts no torch.
    if not _has_cuda():
        pytest.skip("no CUDA device visible to the test interpreter's torch")
    p = launch(np_, worker("cuda_ops.py"), timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("cuda ok") == np_, p.stdout + p.stderr
