"""gradwire: gradient transport for data-parallel training, from Python.

    import gradwire, numpy as np
    comm = gradwire.init()                      # rank and size from the launcher's variables
    grads = np.ones(1000, dtype=np.float32)
    comm.allreduce(grads, op="avg")             # in place, every rank gets the mean
    comm.allreduce_compressed(grads, "topk:0.01", key="layer1.weight")
    print(comm.stats())

Launch with ``gradwire-run -np 4 -- python3 train.py`` (or ``python3 -m gradwire.run``), torchrun,
mpirun or srun. ``import gradwire.torch`` registers the "gradwire" torch.distributed backend and
the DDP communication hooks (gradwire.torch.hooks).

Arrays are numpy arrays or torch tensors, C-contiguous, of float32, float64, float16, bfloat16
(torch), int32, int64 or uint8; others are refused with InvalidArgument saying why. Failures raise
a GradwireError subclass (PeerError, TimeoutError, InvalidArgument, ...) whose message is the
library's (it names the operation and the peer rank).

Why ctypes and not a compiled extension: the C ABI (include/gradwire/gradwire.h) is plain C with
opaque handles and a handful of scalar arguments, which is exactly what ctypes binds without a
build step. The package is then pure Python: it works from the source tree with only
PYTHONPATH=python, with any Python 3 (Debian's /usr/bin/python3 and its torch 1.13, torch 2.x
elsewhere) without compiling against a particular interpreter or libtorch ABI, and ctypes
releases the GIL during every call, so a blocking collective does not stall other threads. The
per-call overhead of ctypes (a few microseconds) is small next to a collective's latency over a
network (tens of microseconds at least); a pybind11 extension would add a compiler and Python
headers to the build and tie the binary to one interpreter and one torch version.

The library is found at GRADWIRE_LIBRARY, else beside this package (an installed copy), else in
build/release/capi (or build/debug/capi) of the source tree this package sits in or of the
current directory.
"""

from __future__ import annotations

from typing import Optional

from . import _lib
from ._p2p import ANY_SOURCE, P2PRequest, Received
from ._rooted import has_collective
from .comm import Comm, Op, Request, Stats
from .errors import (Aborted, GradwireError, InternalError, InvalidArgument, OutOfMemory,
                     PeerError, SystemCallError, TimeoutError, Unsupported)

__version__: str = _lib.version  # the loaded library's version
library_path: str = _lib.path

__all__ = [
    "init", "Comm", "Op", "Request", "Stats", "GradwireError", "InvalidArgument", "TimeoutError",
    "PeerError", "SystemCallError", "Unsupported", "OutOfMemory", "Aborted", "InternalError",
    "version", "library_path", "ANY_SOURCE", "P2PRequest", "Received", "has_collective",
]


def init(rank: Optional[int] = None, world_size: Optional[int] = None, **options) -> Comm:
    """Creates a Comm. With no arguments rank, size and the rendezvous store come from the
    launcher's environment (GW_RANK/GW_WORLD_SIZE/GW_STORE, torchrun, Open MPI, Slurm), as
    gw_comm_init_from_env does; otherwise see Comm(). Collective: blocks until every rank has
    joined, at most GW_TIMEOUT_MS."""
    return Comm(rank, world_size, **options)


def __getattr__(name: str) -> type:
    # gradwire.SystemError, SystemCallError's former name (see errors.__getattr__).
    if name == "SystemError":
        return SystemCallError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def version() -> str:
    """The loaded libgradwire.so's version ("0.1.0")."""
    return _lib.version
