"""The checks the process group makes at the call, before anything is queued (so every rank
refuses alike), the tensor reshaping its operations share, and the CUDA stream fence."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from .._buffer import gw_dtype, refuse_leaf_write
from ..comm import Op
from ..errors import InvalidArgument, Unsupported


def _gw_op(reduce_op: Any) -> Op:
    R = dist.ReduceOp
    for torch_op, op in ((R.SUM, Op.SUM), (R.PRODUCT, Op.PROD), (R.MIN, Op.MIN),
                         (R.MAX, Op.MAX), (R.AVG, Op.AVG)):
        if reduce_op == torch_op:
            return op
    raise Unsupported(f"gradwire: reduce op {reduce_op} is not supported (sum, product, min, max, "
                      "avg)")


def _one(tensors: list, what: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise Unsupported(f"gradwire {what}: exactly one tensor per call is supported, got "
                          f"{len(tensors)}")
    return tensors[0]


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1) if t.is_contiguous() else t.contiguous().reshape(-1)


def _raw(t: torch.Tensor) -> torch.Tensor:
    """t (contiguous) as the Comm can move it: itself where its dtype is one gradwire reduces,
    else its bytes (int8, int16, bool, complex, ...): broadcast, gather and all-to-all only copy
    bytes, so any dtype works for them."""
    try:
        gw_dtype(t, "")
        return t
    except InvalidArgument:
        return t.reshape(-1).view(torch.uint8)


def _movable(t: torch.Tensor, what: str) -> None:
    """Refuses a tensor whose bytes cannot be viewed (non-strided layouts, ...)."""
    if str(t.layout) != "torch.strided":
        raise InvalidArgument(f"gradwire {what}: layout {t.layout} is not supported (dense "
                              "tensors only)")


def _equal(ts: list, like: torch.Tensor, what: str) -> None:
    for i, t in enumerate(ts):
        if t.numel() != like.numel() or t.dtype != like.dtype:
            raise Unsupported(
                f"gradwire {what}: every tensor must have the input's size and dtype "
                f"({like.numel()} x {like.dtype}); tensor {i} has {t.numel()} x {t.dtype} "
                "(uneven sizes are not supported)")


def _writable(t: torch.Tensor, what: str) -> None:
    """Refuses at the call, on every rank alike, what the worker's in-place write would refuse
    (checked in the worker only, one rank could refuse while the others wait for it, or pair
    their call with its next one)."""
    refuse_leaf_write(t, f"gradwire {what}")


def _cuda_devices(tensors: list) -> set:
    return {t.device for t in tensors if isinstance(t, torch.Tensor) and t.is_cuda}


def _cuda_fence(devices: set) -> Optional[Callable[[], None]]:
    """Orders the worker after the caller's CUDA work. The worker thread stages CUDA tensors on
    its own current stream (the legacy default stream), which does not wait for torch's
    non-blocking streams (DDP/FSDP side streams, `with torch.cuda.stream(s)`): record an event
    on the caller's current stream of each CUDA device involved and wait for it in the worker."""
    events = []
    for d in devices:
        ev = torch.cuda.Event(blocking=True)  # the worker sleeps in synchronize(), not spins
        ev.record(torch.cuda.current_stream(d))
        events.append(ev)
    if not events:
        return None

    def wait() -> None:
        for e in events:
            e.synchronize()
    return wait


def _blocks(output: torch.Tensor, input: torch.Tensor, n: int, what: str, whole: str) -> None:
    """Refuses a pair where the one named whole ("output" or "input") is not n blocks of the
    other's size, or whose dtypes differ."""
    big, small = (output, input) if whole == "output" else (input, output)
    if big.numel() != small.numel() * n:
        raise InvalidArgument(f"gradwire {what}: {whole} has {big.numel()} elements, expected "
                              f"{n} x {small.numel()}")
    if output.dtype != input.dtype:
        raise InvalidArgument(f"gradwire {what}: output dtype {output.dtype} differs from the "
                              f"input's {input.dtype}")


def _unstack(flat: torch.Tensor, outs: list) -> None:
    """Copies consecutive blocks of flat into outs (each its own size, in order)."""
    at = 0
    for o in outs:
        o.copy_(flat[at:at + o.numel()].view(o.shape))
        at += o.numel()
