"""The rooted collectives (reduce, gather, scatter) and the all-to-all with uneven counts
(alltoallv) of a Comm, and the non-blocking form of every collective but iallreduce (comm.py):
a mixin of Comm.

Each needs a call a library of C ABI 0.3 does not have (gw_reduce, gw_gather, gw_scatter,
gw_alltoallv, gw_i*); has_collective() says whether the loaded one exports it, and a call without
it raises Unsupported.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable, Optional, Sequence

from . import _buffer, _lib
from ._request import Request
from .errors import InvalidArgument, Unsupported, check

Array = Any  # numpy.ndarray or torch.Tensor


def has_collective(name: str) -> bool:
    """Whether the loaded libgradwire.so exports gw_<name> (e.g. "reduce", "ialltoallv")."""
    return _lib.has("gw_" + name)


def _need(name: str) -> Any:
    if not has_collective(name):
        raise Unsupported(f"{name}: the loaded libgradwire.so ({_lib.version}, {_lib.path}) has "
                          f"no gw_{name}; rebuild it from a newer gradwire")
    return getattr(_lib.lib, "gw_" + name)


def _sizes(values: Sequence[int], n: int, what: str) -> Any:
    if len(values) != n:
        raise InvalidArgument(f"alltoallv: {what} has {len(values)} entries for {n} ranks")
    if any((not isinstance(v, int)) or isinstance(v, bool) or v < 0 for v in values):
        raise InvalidArgument(f"alltoallv: {what} {list(values)} must be ints >= 0")
    return (ctypes.c_size_t * n)(*values)


def _displs(counts: Sequence[int]) -> list:
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return out


class Rooted:
    """reduce, gather, scatter, alltoallv, and ireduce, igather, iscatter, ialltoallv, ibarrier,
    ibroadcast, iallgather, ireduce_scatter, ialltoall (Comm supplies handle, size, rank, _pending
    and _check_rank). An i-form returns a Request; its arrays stay untouched until it is done."""

    handle: ctypes.c_void_p
    size: int
    rank: int
    _pending: set
    _check_rank: Callable[[int, str], None]

    # Each _prepare_* checks the arguments and returns (C function arguments before the request,
    # the Buffers to finish, the result); the blocking and non-blocking forms share them.
    def _prepare_reduce(self, send: Array, recv: Optional[Array], op: Any, root: int) -> tuple:
        from .comm import _op, _same_size

        self._check_rank(root, "reduce root")
        s = _buffer.view(send, "reduce send")
        if recv is None and self.rank != root:  # recvbuf is unused there
            return [s.ptr, None, s.count, s.dtype, _op(op), root], [s], None
        if recv is None:
            recv = _buffer.empty_like(send, tuple(send.shape))
        r = _buffer.view(recv, "reduce recv", writable=True)
        _same_size(s, r, "reduce")
        return [s.ptr, r.ptr, s.count, s.dtype, _op(op), root], [s, r], recv

    def _prepare_gather(self, send: Array, recv: Optional[Array], root: int) -> tuple:
        from .comm import _same_dtype

        self._check_rank(root, "gather root")
        s = _buffer.view(send, "gather send")
        if recv is None:
            shape = (self.size,) + tuple(send.shape) if self.rank == root else (0,)
            recv = _buffer.empty_like(send, shape)
        r = _buffer.view(recv, "gather recv", writable=True)
        _same_dtype(s, r, "gather")
        if self.rank == root and r.count != s.count * self.size:
            raise InvalidArgument(f"gather: recv has {r.count} elements, expected size * send = "
                                  f"{self.size} * {s.count}")
        return [s.ptr, r.ptr if r.count else None, s.count, s.dtype, root], [s, r], recv

    def _prepare_scatter(self, send: Optional[Array], recv: Array, root: int) -> tuple:
        from .comm import _same_dtype

        self._check_rank(root, "scatter root")
        r = _buffer.view(recv, "scatter recv", writable=True)
        ptr, bufs = None, [r]
        if self.rank == root:
            if send is None:
                raise InvalidArgument("scatter: the root must pass send")
            s = _buffer.view(send, "scatter send")
            _same_dtype(s, r, "scatter")
            if s.count != r.count * self.size:
                raise InvalidArgument(f"scatter: send has {s.count} elements, expected size * "
                                      f"recv = {self.size} * {r.count}")
            ptr, bufs = s.ptr, [s, r]
        return [ptr, r.ptr, r.count, r.dtype, root], bufs, recv

    def _prepare_alltoallv(self, send: Array, send_counts: Sequence[int], recv: Array,
                           recv_counts: Sequence[int]) -> tuple:
        from .comm import _same_dtype

        s = _buffer.view(send, "alltoallv send")
        r = _buffer.view(recv, "alltoallv recv", writable=True)
        _same_dtype(s, r, "alltoallv")
        sc = _sizes(send_counts, self.size, "send_counts")
        rc = _sizes(recv_counts, self.size, "recv_counts")
        if sum(send_counts) > s.count or sum(recv_counts) > r.count:
            raise InvalidArgument(f"alltoallv: counts sum to {sum(send_counts)} (send) and "
                                  f"{sum(recv_counts)} (recv), the arrays hold {s.count} and "
                                  f"{r.count} elements")
        sd = _sizes(_displs(send_counts), self.size, "send displacements")
        rd = _sizes(_displs(recv_counts), self.size, "recv displacements")
        # The i-form's request keeps the count arrays (the call's arguments) until it ends.
        return [s.ptr, sc, sd, r.ptr, rc, rd, s.dtype], [s, r], recv

    def _blocking(self, name: str, prepared: tuple) -> Array:
        fn = _need(name)
        args, bufs, result = prepared
        check(fn(self.handle, *args), name)
        for b in bufs:
            b.done()
        return result

    def _started(self, name: str, prepared: tuple) -> Request:
        fn = _need(name)
        args, bufs, result = prepared
        h = ctypes.c_void_p()
        check(fn(self.handle, *args, ctypes.byref(h)), name)
        req = Request(self, h, bufs, result, name)  # type: ignore[arg-type]
        req._args = args  # type: ignore[attr-defined]  # count arrays live until it ends
        self._pending.add(req)
        return req

    def reduce(self, send: Array, recv: Optional[Array] = None, op: Any = "sum",
               root: int = 0) -> Array:
        """Reduces send across ranks into root's recv (default: a new array; recv may be send:
        in place); returns it on root, None elsewhere (where recv is not written)."""
        return self._blocking("reduce", self._prepare_reduce(send, recv, op, root))

    def gather(self, send: Array, recv: Optional[Array] = None, root: int = 0) -> Array:
        """Every rank's send stacked into root's recv (size * send.size elements, rank r's block
        at r * send.size; default a new (size, *send.shape) array on root, empty elsewhere)."""
        return self._blocking("gather", self._prepare_gather(send, recv, root))

    def scatter(self, send: Optional[Array], recv: Array, root: int = 0) -> Array:
        """Root's send holds size blocks of recv's size; rank r receives block r in recv."""
        return self._blocking("scatter", self._prepare_scatter(send, recv, root))

    def alltoallv(self, send: Array, send_counts: Sequence[int], recv: Array,
                  recv_counts: Sequence[int]) -> Array:
        """send holds send_counts[j] elements for rank j, one block after another; recv gets
        recv_counts[j] elements from rank j the same way. Each rank's send_counts[j] must equal
        rank j's recv_counts[this rank]."""
        return self._blocking("alltoallv",
                              self._prepare_alltoallv(send, send_counts, recv, recv_counts))

    def ireduce(self, send: Array, recv: Optional[Array] = None, op: Any = "sum",
                root: int = 0) -> Request:
        return self._started("ireduce", self._prepare_reduce(send, recv, op, root))

    def igather(self, send: Array, recv: Optional[Array] = None, root: int = 0) -> Request:
        return self._started("igather", self._prepare_gather(send, recv, root))

    def iscatter(self, send: Optional[Array], recv: Array, root: int = 0) -> Request:
        return self._started("iscatter", self._prepare_scatter(send, recv, root))

    def ialltoallv(self, send: Array, send_counts: Sequence[int], recv: Array,
                   recv_counts: Sequence[int]) -> Request:
        return self._started("ialltoallv",
                             self._prepare_alltoallv(send, send_counts, recv, recv_counts))

    def ibarrier(self) -> Request:
        return self._started("ibarrier", ([], [], None))

    # The i-forms of the older collectives: explicit recv arrays of the blocking call's sizes.
    def _pair(self, send: Array, recv: Array, what: str, recv_blocks: int,
              send_blocks: int) -> tuple:
        from .comm import _same_dtype

        s = _buffer.view(send, f"{what} send")
        r = _buffer.view(recv, f"{what} recv", writable=True)
        _same_dtype(s, r, what)
        if s.count * recv_blocks != r.count * send_blocks or s.count % send_blocks:
            raise InvalidArgument(f"{what}: send has {s.count} elements and recv {r.count}; "
                                  f"expected recv = send x {recv_blocks} / {send_blocks}")
        return s, r

    def ibroadcast(self, buf: Array, root: int = 0) -> Request:
        self._check_rank(root, "ibroadcast root")
        b = _buffer.view(buf, "ibroadcast buf", writable=True)
        return self._started("ibroadcast", ([b.ptr, b.count, b.dtype, root], [b], buf))

    def iallgather(self, send: Array, recv: Array) -> Request:
        s, r = self._pair(send, recv, "iallgather", self.size, 1)
        return self._started("iallgather", ([s.ptr, r.ptr, s.count, s.dtype], [s, r], recv))

    def ireduce_scatter(self, send: Array, recv: Array, op: Any = "sum") -> Request:
        from .comm import _op

        s, r = self._pair(send, recv, "ireduce_scatter", 1, self.size)
        return self._started("ireduce_scatter",
                             ([s.ptr, r.ptr, r.count, s.dtype, _op(op)], [s, r], recv))

    def ialltoall(self, send: Array, recv: Array) -> Request:
        s, r = self._pair(send, recv, "ialltoall", self.size, self.size)
        return self._started("ialltoall",
                             ([s.ptr, r.ptr, s.count // self.size, s.dtype], [s, r], recv))
