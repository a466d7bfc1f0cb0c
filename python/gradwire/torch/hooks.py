"""DDP communication hooks that move the gradients with gradwire.

    import gradwire.torch.hooks as gh
    ddp.register_comm_hook(None, gh.allreduce_hook)                 # plain average
    ddp.register_comm_hook(None, gh.compressed_hook("powersgd:4"))  # compressed, error feedback

The process group of the DDP model may be gradwire, gloo or nccl: the hooks use the gradwire
communicator of the state passed to register_comm_hook (a gradwire.Comm, or a process group) or,
with None, that of the default group (gradwire.torch.comm_of; over a gloo or nccl default group it
is made once, collectively, at the first bucket). Each bucket's operation runs on the
communicator's worker thread, so backward keeps computing while buckets are reduced.

compressed_hook keeps gradwire's error-feedback residual per bucket: the key names the bucket's
index, size and dtype, so DDP's bucket rebuild after the first step starts fresh residuals.
"""

# No "from __future__ import annotations": DDP compares the hooks' annotations with the real
# dist.GradBucket and torch.futures.Future[torch.Tensor] objects.
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..comm import Comm, Op
from ..errors import InvalidArgument
from . import comm_of, run_async

__all__ = ["allreduce_hook", "compressed_hook"]

Hook = Callable[[Any, Any], torch.futures.Future]


def _comm(state: Any) -> Comm:
    if isinstance(state, Comm):
        return state
    return comm_of(state)


def allreduce_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket's gradients over the ranks with gradwire's allreduce."""
    comm = _comm(state)
    buf = bucket.buffer()
    if buf.is_cuda:
        torch.cuda.current_stream(buf.device).synchronize()

    def run() -> torch.Tensor:
        comm.allreduce(buf, op=Op.AVG)
        return buf
    return run_async(comm, run)


def compressed_hook(spec: str) -> Hook:
    """A hook that sums each bucket through gradwire's codec spec ("fp16", "bf16", "topk:0.01",
    "sign", "powersgd:4", ... with error feedback per bucket) and divides by the ranks."""
    if not isinstance(spec, str) or not spec:
        raise InvalidArgument("compressed_hook: spec must be a non-empty codec spec string")

    def hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        comm = _comm(state)
        buf = bucket.buffer()
        if buf.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            # Compression is for floating gradients; anything else is averaged exactly.
            return allreduce_hook(state, bucket)
        if buf.is_cuda:
            torch.cuda.current_stream(buf.device).synchronize()
        key = f"ddp.{spec}.b{bucket.index()}.n{buf.numel()}.{buf.dtype}"

        def run() -> torch.Tensor:
            comm.allreduce_compressed(buf, spec, key)
            buf.div_(comm.size)
            if buf.is_cuda:  # the division was queued on this thread's stream: finish it first
                torch.cuda.current_stream(buf.device).synchronize()
            return buf
        return run_async(comm, run)

    hook.__name__ = f"compressed_hook({spec!r})"
    hook.__qualname__ = hook.__name__
    return hook
