"""Comm: one gradwire communicator, and Request: a non-blocking operation in flight.

Point-to-point (send/recv) is in _p2p, the rooted and uneven collectives in _rooted: mixins of
Comm, kept apart by concern."""

from __future__ import annotations

import atexit
import ctypes
import enum
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

from . import _buffer, _lib
from ._p2p import PointToPoint
from ._request import Request
from ._rooted import Rooted
from .errors import InvalidArgument, Unsupported, check

Array = Any  # numpy.ndarray or torch.Tensor


class Op(enum.IntEnum):
    """Reduction operations (gw_op_t). Functions also take their names: "sum", "avg", ..."""

    SUM = _lib.GW_SUM
    PROD = _lib.GW_PROD
    MIN = _lib.GW_MIN
    MAX = _lib.GW_MAX
    AVG = _lib.GW_AVG  # sum / ranks (integers truncated)


OpLike = Union[Op, str, int]


def _op(op: OpLike) -> int:
    if isinstance(op, str):
        try:
            return int(Op[op.upper()])
        except KeyError:
            raise InvalidArgument(
                f"op {op!r} is not one of {', '.join(o.name.lower() for o in Op)}"
            ) from None
    try:
        return int(Op(int(op)))
    except ValueError:
        raise InvalidArgument(f"op {op!r} is not a gradwire.Op") from None


@dataclass(frozen=True)
class Stats:
    """Byte counters of the compressed allreduces of one communicator on this rank."""

    bytes_sent: int
    bytes_uncompressed: int
    calls: int

    @property
    def ratio(self) -> float:
        """bytes_uncompressed / bytes_sent (1.0 when nothing was sent)."""
        return self.bytes_uncompressed / self.bytes_sent if self.bytes_sent else 1.0


def _same_dtype(a: _buffer.Buffer, b: _buffer.Buffer, what: str) -> None:
    if a.dtype != b.dtype:
        raise InvalidArgument(f"{what}: send and recv dtypes differ ({a.obj.dtype} vs {b.obj.dtype})")


def _same_size(s: _buffer.Buffer, r: _buffer.Buffer, what: str) -> None:
    """recv r must have send s's dtype and element count."""
    _same_dtype(s, r, what)
    if r.count != s.count:
        raise InvalidArgument(f"{what}: recv has {r.count} elements, send has {s.count}")


_live: "weakref.WeakSet[Comm]" = weakref.WeakSet()


_exiting = False


@atexit.register
def _close_all() -> None:
    # A communicator still open when the interpreter exits is closed before the library's static
    # objects are destroyed (its threads must be joined while everything they use still exists),
    # even one whose mem_empty() arrays are still alive, and one closed while some were.
    global _exiting
    _exiting = True
    for c in list(_live):
        c.close()
        h, c._deferred = c._deferred, None
        if h is not None:
            _lib.lib.gw_comm_destroy(h)


class Comm(PointToPoint, Rooted):
    """A communicator: the ranks of a job, connected, and the collectives among them.

    Make one with gradwire.init() (from the launcher's environment) or Comm(rank=, world_size=,
    ...). Collectives must be called by every rank in the same order with matching arguments;
    they block (at most GW_TIMEOUT_MS) and raise a GradwireError subclass on failure. After a
    PeerError or TimeoutError the communicator is unusable: close it and make a new one.

    Arrays are numpy arrays or torch tensors (CPU; CUDA tensors are staged through pinned host
    memory), C-contiguous, of float32, float64, float16, bfloat16 (torch), int32, int64 or uint8.
    Calls on one Comm must come from one thread at a time.
    """

    def __init__(self, rank: Optional[int] = None, world_size: Optional[int] = None, *,
                 store_addr: Optional[str] = None, transport: Optional[str] = None,
                 timeout_ms: int = 0, job_token: Optional[str] = None,
                 _handle: Optional[int] = None) -> None:
        """Joins a communicator; blocks until every rank has joined (or the deadline).

        With no arguments everything comes from the environment (GW_RANK/GW_WORLD_SIZE/GW_STORE,
        torchrun, Open MPI or Slurm). Otherwise rank and world_size are required and
        store_addr ("host:port", hosted by rank 0), transport ("auto", "tcp", "shm", "dpdk"),
        timeout_ms and job_token fall back to their GW_* variables when not given.
        """
        self._pending: set[Request] = set()
        self._lock = threading.Lock()
        self._mem_live = 0  # arrays from mem_empty not yet freed
        self._deferred: Optional[ctypes.c_void_p] = None  # closed while some were alive
        h = ctypes.c_void_p()
        if _handle is not None:
            h.value = _handle
        elif rank is None and world_size is None and store_addr is None and transport is None \
                and not timeout_ms and job_token is None:
            check(_lib.lib.gw_comm_init_from_env(ctypes.byref(h)), "init")
        else:
            if world_size is None:
                raise InvalidArgument("Comm: world_size is required when rank or options are given")
            cfg = _lib.make_config(rank or 0, world_size, store_addr, transport, timeout_ms,
                                   job_token)
            check(_lib.lib.gw_comm_init(ctypes.byref(h), ctypes.byref(cfg)), "init")
        self._h: Optional[ctypes.c_void_p] = h
        r, s = ctypes.c_int(), ctypes.c_int()
        check(_lib.lib.gw_comm_rank(h, ctypes.byref(r)))
        check(_lib.lib.gw_comm_size(h, ctypes.byref(s)))
        self.rank: int = r.value
        self.size: int = s.value
        _live.add(self)

    # ---- lifetime ---------------------------------------------------------------------------
    @property
    def handle(self) -> ctypes.c_void_p:
        if self._h is None:
            raise InvalidArgument("the communicator is closed")
        return self._h

    def close(self) -> None:
        """Frees the communicator (not collective; waits, bounded, for pending operations).

        While arrays from mem_empty() are alive the communicator is closed at once (no more
        calls) but freed only when the last of them goes, so their memory stays valid."""
        # gradwire.kv stores on this communicator are destroyed first (they use it).
        for store in list(getattr(self, "_kv_stores", ())):
            store.close()
        h, self._h = self._h, None
        if h is None:
            return
        self._pending.clear()
        if self._mem_live > 0 and not _exiting:
            self._deferred = h
            return
        _lib.lib.gw_comm_destroy(h)

    def mem_empty(self, shape: Union[int, Sequence[int]], dtype: str = "float32", *,
                  torch: bool = False) -> Array:
        """A new, uninitialised array in memory from gw_mem_alloc: in daemon mode (GW_DAEMON) it
        lies in the daemon's shared arena, so collectives on it are zero-copy (any other array is
        copied into the arena and back); in direct mode, among ranks of one host over shm, shared
        memory the ranks map into each other (a large allreduce, reduce-scatter, allgather,
        broadcast or alltoall on it has no kernel copy), else
        ordinary host memory.

        dtype: a numpy dtype name (float32, float64, float16, int32, int64, uint8), or bfloat16
        with torch=True. torch=True returns a CPU torch.Tensor sharing the memory. The memory is
        freed (gw_mem_free) once the array and every view of it are gone. Raises OutOfMemory when
        the arena has no room (GW_DAEMON_ARENA)."""
        import numpy

        dims = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
        if any(d < 0 for d in dims):
            raise InvalidArgument(f"mem_empty: negative dimension in shape {dims}")
        if dtype == "bfloat16" and not torch:
            raise InvalidArgument("mem_empty: bfloat16 needs torch=True (numpy has no bfloat16)")
        itemsize = 2 if dtype == "bfloat16" else numpy.dtype(dtype).itemsize
        if dtype != "bfloat16" and str(numpy.dtype(dtype)) not in _buffer._NUMPY_DTYPES:
            raise InvalidArgument(f"mem_empty: dtype {dtype} is not supported "
                                  f"(supported: {_buffer.SUPPORTED})")
        n = 1
        for d in dims:
            n *= d
        nbytes = max(n * itemsize, 1)
        ptr = ctypes.c_void_p()
        check(_lib.lib.gw_mem_alloc(self.handle, nbytes, ctypes.byref(ptr)), "mem_empty")
        raw = (ctypes.c_uint8 * nbytes).from_address(ptr.value)
        self._mem_live += 1
        weakref.finalize(raw, self._mem_free, ptr.value)
        flat = numpy.frombuffer(raw, dtype=numpy.uint8)[: n * itemsize]
        if not torch:
            return flat.view(numpy.dtype(dtype)).reshape(dims)
        import torch as _torch

        t = _torch.from_numpy(flat)  # keeps flat (and so raw) alive
        return t.view(getattr(_torch, dtype)).reshape(dims)

    def _mem_free(self, ptr: int) -> None:
        h = self._h if self._h is not None else self._deferred
        if h is not None:
            _lib.lib.gw_mem_free(h, ctypes.c_void_p(ptr))
        self._mem_live -= 1
        if self._mem_live == 0 and self._deferred is not None:
            h, self._deferred = self._deferred, None
            _lib.lib.gw_comm_destroy(h)

    def abort(self) -> None:
        """Makes every pending and later call on this communicator raise Aborted, promptly.
        Thread-safe. close() is still needed."""
        if self._h is not None:
            _lib.lib.gw_comm_abort(self._h)

    def __enter__(self) -> "Comm":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self._h is None else f"rank {self.rank} of {self.size}"
        return f"<gradwire.Comm {state}>"

    # ---- collectives ------------------------------------------------------------------------
    def allreduce(self, send: Array, recv: Optional[Array] = None, op: OpLike = Op.SUM) -> Array:
        """Reduces send across ranks into recv (default: in place into send); returns recv."""
        s = _buffer.view(send, "allreduce send", writable=recv is None)
        r = s if recv is None else _buffer.view(recv, "allreduce recv", writable=True)
        _same_size(s, r, "allreduce")
        check(_lib.lib.gw_allreduce(self.handle, s.ptr, r.ptr, s.count, s.dtype, _op(op)),
              "allreduce")
        r.done()
        return send if recv is None else recv

    def broadcast(self, buf: Array, root: int = 0) -> Array:
        """Copies root's buf into every rank's buf (same size and dtype everywhere)."""
        self._check_rank(root, "broadcast root")
        b = _buffer.view(buf, "broadcast buf", writable=True)
        check(_lib.lib.gw_broadcast(self.handle, b.ptr, b.count, b.dtype, root), "broadcast")
        b.done()
        return buf

    def allgather(self, send: Array, recv: Optional[Array] = None) -> Array:
        """Every rank's send, stacked: recv has size * send.size elements (rank r's block at
        r * send.size). Default recv: a new array of shape (size, *send.shape)."""
        s = _buffer.view(send, "allgather send")
        if recv is None:
            recv = _buffer.empty_like(send, (self.size,) + tuple(send.shape))
        r = _buffer.view(recv, "allgather recv", writable=True)
        _same_dtype(s, r, "allgather")
        if r.count != s.count * self.size:
            raise InvalidArgument(
                f"allgather: recv has {r.count} elements, expected size * send = "
                f"{self.size} * {s.count} = {s.count * self.size}"
            )
        check(_lib.lib.gw_allgather(self.handle, s.ptr, r.ptr, s.count, s.dtype), "allgather")
        r.done()
        return recv

    def reduce_scatter(self, send: Array, recv: Optional[Array] = None,
                       op: OpLike = Op.SUM) -> Array:
        """send holds size blocks; rank r gets the reduction of block r in recv. Default recv: a
        new array of shape send.shape[1:] when send.shape[0] == size, else flat."""
        s = _buffer.view(send, "reduce_scatter send")
        if s.count % self.size != 0:
            raise InvalidArgument(
                f"reduce_scatter: send has {s.count} elements, not a multiple of {self.size} ranks"
            )
        if recv is None:
            shape = tuple(send.shape[1:]) if len(send.shape) >= 1 and send.shape[0] == self.size \
                else (s.count // self.size,)
            recv = _buffer.empty_like(send, shape)
        r = _buffer.view(recv, "reduce_scatter recv", writable=True)
        _same_dtype(s, r, "reduce_scatter")
        if r.count * self.size != s.count:
            raise InvalidArgument(
                f"reduce_scatter: send has {s.count} elements, expected size * recv = "
                f"{self.size} * {r.count} = {r.count * self.size}"
            )
        check(_lib.lib.gw_reduce_scatter(self.handle, s.ptr, r.ptr, r.count, s.dtype, _op(op)),
              "reduce_scatter")
        r.done()
        return recv

    def alltoall(self, send: Array, recv: Optional[Array] = None) -> Array:
        """send holds size equal blocks, block j for rank j; recv block j comes from rank j.
        Default recv: a new array shaped like send."""
        s = _buffer.view(send, "alltoall send")
        if s.count % self.size != 0:
            raise InvalidArgument(
                f"alltoall: send has {s.count} elements, not a multiple of {self.size} ranks"
            )
        if recv is None:
            recv = _buffer.empty_like(send, tuple(send.shape))
        r = _buffer.view(recv, "alltoall recv", writable=True)
        _same_size(s, r, "alltoall")
        check(_lib.lib.gw_alltoall(self.handle, s.ptr, r.ptr, s.count // self.size, s.dtype),
              "alltoall")
        r.done()
        return recv

    def barrier(self) -> None:
        """Returns once every rank has entered the barrier."""
        check(_lib.lib.gw_barrier(self.handle), "barrier")

    def split(self, color: int, key: Optional[int] = None) -> Optional["Comm"]:
        """Collective: ranks passing the same color >= 0 form a new Comm, ordered by key (default:
        this rank) and then rank; color < 0 joins none and returns None."""
        if not _lib.has_split:
            raise Unsupported(
                f"split: the loaded libgradwire.so ({_lib.version}, {_lib.path}) has no "
                "gw_comm_split; rebuild it from a newer gradwire"
            )
        out = ctypes.c_void_p()
        k = self.rank if key is None else key
        check(_lib.lib.gw_comm_split(self.handle, int(color), int(k), ctypes.byref(out)), "split")
        if not out.value:
            return None
        return Comm(_handle=out.value)

    def iallreduce(self, send: Array, recv: Optional[Array] = None,
                   op: OpLike = Op.SUM) -> Request:
        """Starts an allreduce (default in place) and returns a Request; the arrays must stay
        untouched until Request.wait() returns. Requests complete in issue order."""
        s = _buffer.view(send, "iallreduce send", writable=recv is None)
        r = s if recv is None else _buffer.view(recv, "iallreduce recv", writable=True)
        _same_size(s, r, "iallreduce")
        h = ctypes.c_void_p()
        check(_lib.lib.gw_iallreduce(self.handle, s.ptr, r.ptr, s.count, s.dtype, _op(op),
                                     ctypes.byref(h)), "iallreduce")
        req = Request(self, h, [s, r] if r is not s else [s], send if recv is None else recv)
        self._pending.add(req)
        return req

    # ---- compression ------------------------------------------------------------------------
    def allreduce_compressed(self, tensor: Array, spec: str, key: str) -> Array:
        """Sums tensor across ranks through a codec, in place, and returns it.

        spec: "none", "fp16", "bf16", "topk:RATIO", "randomk:RATIO", "sign", "qsgd:LEVELS",
        "powersgd:RANK", optionally with ",ef=0|1,seed=N,..." (docs/compression.md).
        key: names the tensor; its error-feedback residual and codec state live under it. Reusing
        a key with another spec, size or dtype raises InvalidArgument. dtype float32, float16 or
        bfloat16; CUDA tensors are passed to the library as device memory.
        """
        if not isinstance(spec, str) or not spec:
            raise InvalidArgument("allreduce_compressed: spec must be a non-empty string")
        if not isinstance(key, str) or not key:
            raise InvalidArgument("allreduce_compressed: key must be a non-empty string")
        b = _buffer.view(tensor, "allreduce_compressed tensor", writable=True, device_ok=True)
        if b.dtype not in (_lib.GW_FLOAT32, _lib.GW_FLOAT16, _lib.GW_BFLOAT16):
            raise InvalidArgument(
                f"allreduce_compressed: dtype {tensor.dtype} is not supported "
                "(float32, float16, bfloat16)"
            )
        check(_lib.lib.gw_allreduce_compressed(self.handle, b.ptr, b.count, b.dtype,
                                               spec.encode(), key.encode()),
              "allreduce_compressed")
        b.done()
        return tensor

    def stats(self) -> Stats:
        """The byte counters of this rank's compressed allreduces on this communicator."""
        s = _lib.CommStats()
        check(_lib.lib.gw_comm_stats(self.handle, ctypes.byref(s)), "stats")
        return Stats(int(s.bytes_sent), int(s.bytes_uncompressed), int(s.calls))

    def reset_stats(self) -> None:
        """Sets the byte counters to 0."""
        check(_lib.lib.gw_comm_reset_stats(self.handle), "reset_stats")

    def release_compression(self) -> None:
        """Frees the residuals and codec state of every key now (e.g. when the model changes)."""
        check(_lib.lib.gw_comm_release_compression(self.handle), "release_compression")

    def _check_rank(self, r: int, what: str) -> None:
        if not isinstance(r, int) or not 0 <= r < self.size:
            raise InvalidArgument(f"{what} {r!r} is not a rank of this communicator (0..{self.size - 1})")
