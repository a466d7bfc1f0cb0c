"""Turning numpy arrays and torch tensors into (pointer, count, gw_dtype_t), with the checks.

Only numpy and torch are understood; torch is imported only if the caller passed a tensor, so the
package works (for numpy) where torch is absent.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional

from . import _lib
from .errors import InvalidArgument

_NUMPY_DTYPES = {
    "float32": _lib.GW_FLOAT32,
    "float64": _lib.GW_FLOAT64,
    "float16": _lib.GW_FLOAT16,
    "int32": _lib.GW_INT32,
    "int64": _lib.GW_INT64,
    "uint8": _lib.GW_UINT8,
}
_TORCH_DTYPES = {  # str(torch.dtype) -> gw dtype
    "torch.float32": _lib.GW_FLOAT32,
    "torch.float64": _lib.GW_FLOAT64,
    "torch.float16": _lib.GW_FLOAT16,
    "torch.bfloat16": _lib.GW_BFLOAT16,
    "torch.int32": _lib.GW_INT32,
    "torch.int64": _lib.GW_INT64,
    "torch.uint8": _lib.GW_UINT8,
}
ITEMSIZE = {
    _lib.GW_FLOAT32: 4,
    _lib.GW_FLOAT64: 8,
    _lib.GW_FLOAT16: 2,
    _lib.GW_BFLOAT16: 2,
    _lib.GW_INT32: 4,
    _lib.GW_INT64: 8,
    _lib.GW_UINT8: 1,
}
SUPPORTED = "float32, float64, float16, bfloat16 (torch only), int32, int64, uint8"


def is_torch(x: Any) -> bool:
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


def is_cuda(x: Any) -> bool:
    return is_torch(x) and x.is_cuda


@dataclass
class Buffer:
    """A host-addressable view of an array: what the C ABI gets."""

    ptr: int
    count: int
    dtype: int
    obj: Any  # the array the pointer belongs to (kept alive while the call runs)
    finish: Optional[Callable[[], None]] = None  # copies a staged result back (CUDA tensors)

    def done(self) -> None:
        if self.finish is not None:
            self.finish()
            self.finish = None


def gw_dtype(x: Any, name: str) -> int:
    if is_torch(x):
        d = _TORCH_DTYPES.get(str(x.dtype))
    else:
        d = _NUMPY_DTYPES.get(str(getattr(x, "dtype", None)))
    if d is None:
        raise InvalidArgument(
            f"{name}: dtype {getattr(x, 'dtype', type(x).__name__)} is not supported "
            f"(supported: {SUPPORTED})"
        )
    return d


def refuse_leaf_write(x: Any, name: str) -> None:
    """Refuses an in-place write that autograd forbids: a torch leaf tensor that requires grad,
    outside torch.no_grad()."""
    if x.requires_grad and x.is_leaf and _grad_enabled():
        raise InvalidArgument(
            f"{name}: a leaf tensor that requires grad cannot be written in place; "
            "use torch.no_grad() or tensor.detach()"
        )


def view(x: Any, name: str, writable: bool = False, device_ok: bool = False) -> Buffer:
    """Checks x (type, dtype, contiguity, writability) and returns its Buffer.

    A CUDA tensor is staged through pinned host memory unless device_ok (the C ABI call takes
    device memory itself); the staged copy is written back by Buffer.done() when writable.
    """
    if is_torch(x):
        dtype = gw_dtype(x, name)
        if str(x.layout) != "torch.strided":
            raise InvalidArgument(f"{name}: layout {x.layout} is not supported (dense tensors only)")
        if not x.is_contiguous():
            raise InvalidArgument(
                f"{name}: the tensor is not contiguous (shape {tuple(x.shape)}, stride "
                f"{tuple(x.stride())}); pass tensor.contiguous()"
            )
        if writable:
            refuse_leaf_write(x, name)
        if x.is_cuda and not device_ok:
            return _staged(x, dtype, writable)
        if not x.is_cuda and x.device.type != "cpu":
            raise InvalidArgument(f"{name}: device {x.device} is not supported (cpu or cuda)")
        return Buffer(x.data_ptr(), x.numel(), dtype, x)
    np = sys.modules.get("numpy")
    if np is None or not isinstance(x, np.ndarray):
        raise InvalidArgument(
            f"{name}: expected a numpy.ndarray or a torch.Tensor, got {type(x).__name__}"
        )
    dtype = gw_dtype(x, name)
    if not x.flags.c_contiguous:
        raise InvalidArgument(
            f"{name}: the array is not C-contiguous (shape {x.shape}, strides {x.strides}); "
            "pass numpy.ascontiguousarray(a)"
        )
    if writable and not x.flags.writeable:
        raise InvalidArgument(f"{name}: the array is read-only")
    return Buffer(x.ctypes.data, x.size, dtype, x)


def _grad_enabled() -> bool:
    import torch

    return torch.is_grad_enabled()


def _staged(x: Any, dtype: int, writable: bool) -> Buffer:
    import torch

    host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    host.copy_(x)  # synchronous: the device's pending writes to x are finished first
    finish = None
    if writable:

        def finish() -> None:
            x.copy_(host)

    return Buffer(host.data_ptr(), host.numel(), dtype, host, finish)


def empty_like(x: Any, shape: tuple) -> Any:
    """A new array of x's kind, dtype and device with the given shape."""
    if is_torch(x):
        import torch

        return torch.empty(shape, dtype=x.dtype, device=x.device)
    import numpy

    return numpy.empty(shape, dtype=x.dtype)
