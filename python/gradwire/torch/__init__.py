"""gradwire for PyTorch: the "gradwire" torch.distributed backend and DDP communication hooks.

    import torch.distributed as dist, gradwire.torch   # the import registers the backend
    dist.init_process_group("gradwire")                # under gradwire-run, torchrun, ...
    dist.all_reduce(t)                                 # runs on gradwire

The process group (process_group.ProcessGroupGradwire) is written in Python over gradwire.Comm:
every operation is checked at the call (_checks), queued to one worker thread per communicator
(_worker), which runs the blocking C call and completes a torch.futures.Future, and handed to
torch as a Work wrapping that future (_work). The rendezvous goes through torch's own store
(_rendezvous). Supported operations and refusals: docs/python.md.

Horovod's PyTorch API is here too (`import gradwire.torch as hvd`; horovod.py, optimizer.py,
sync_batch_norm.py): docs/horovod.md.
"""

from __future__ import annotations

import inspect
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ._rendezvous import comm_over_store
from ._work import GradwireWork
from ._worker import run_async
from .process_group import BACKEND_NAME, ProcessGroupGradwire, comm_of

# Horovod's API (`import gradwire.torch as hvd`): docs/horovod.md.
from .horovod import *  # noqa: E402,F401,F403
from .horovod import __all__ as _hvd_all  # noqa: E402
from .optimizer import DistributedOptimizer  # noqa: E402
from .sync_batch_norm import SyncBatchNorm  # noqa: E402

# The parameter server's optimizer wrapper (gradwire.torch.kv.PSOptimizer): docs/parameter-server.md.
from . import kv  # noqa: E402,F401

__all__ = ["ProcessGroupGradwire", "GradwireWork", "comm_of", "comm_over_store", "run_async",
           "BACKEND_NAME", "DistributedOptimizer", "SyncBatchNorm", *_hvd_all]


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> ProcessGroupGradwire:
    return ProcessGroupGradwire(store, rank, size, timeout)


if not hasattr(dist.Backend, BACKEND_NAME.upper()):
    # torch 2.x asks which devices a backend serves (CUDA tensors are staged through pinned host
    # memory here); torch 1.13's register_backend has no such argument.
    if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
        dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])
    else:
        dist.Backend.register_backend(BACKEND_NAME, _create)
