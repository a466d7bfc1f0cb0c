"""PyTorch's own distributed test suite (torch/testing/_internal/distributed/distributed_test.py)
run against the "gradwire" torch.distributed backend.

A third-party backend takes part through the suite's "plugin" feature set
(DistTestCases.backend_feature["plugin"] in common_distributed.py, as torch-ucc does): BACKEND is
set to "gradwire" before the suite is imported, the backend is registered by importing
gradwire.torch, and "gradwire" is added to the plugin, ddp and subgroup sets so the tests for those
features run. torch's MultiProcessTestCase spawns WORLD_SIZE processes per test (they import this
module again, which registers the backend in each of them) and rendezvous through a file.

Run it through tests/python/run_torch_distributed_test.sh, which sets the environment and prints
passed / skipped / failed.
"""
import os
import sys
from pathlib import Path

os.environ.setdefault("BACKEND", "gradwire")  # BACKEND=gloo runs the same tests on gloo
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", "/tmp")  # the suite reads it at import; setUp makes its own
# gradwire comes from tests/python/pytest.ini's pythonpath (the source tree's python/), or from
# an installed package.
try:
    import expecttest  # noqa: F401
except ImportError:  # not packaged by Debian; common_utils only needs its TestCase
    sys.path.append(str(Path(__file__).resolve().parent / "shim"))

import gradwire.torch  # noqa: E402,F401  (registers the backend)
# TestDistBackend._run (torch 1.13) switches DDP to its experimental ReplicatedTensor mode, which
# imports torch.distributed._shard; on Debian's torch 1.13 under Python 3.11 that import fails
# (dataclasses: "mutable default ... TensorProperties"), for every backend, gloo included. DDP
# runs in its ordinary mode instead. (torch 2.x has no such mode.)
try:
    import torch.nn.parallel._replicated_tensor_ddp_utils as _rt
    _rt._set_ddp_with_replicated_tensor = lambda value: None
except ImportError:
    pass
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

for feature in ("plugin", "ddp", "subgroup"):
    DistTestCases.backend_feature[feature].add("gradwire")
# Ops the backend refuses with gradwire.Unsupported: the suite's own skip lists for them.
DistTestCases.skip_collective["allgather_coalesced"].add("gradwire")

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
