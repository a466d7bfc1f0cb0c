"""gradwire.kv: the parameter server (issue 30) from Python, over the C ABI's gw_kv_* calls.

    import gradwire, gradwire.kv, numpy as np
    comm = gradwire.init()
    kv = gradwire.kv.KVStore(comm, mode="ssp:2", update="sgd:0.1,momentum=0.9")
    kv.init(0, weights)                  # every worker, the same value
    kv.push(0, grads); kv.clock()        # this worker finished its clock
    kv.pull(0, weights)                  # as fresh as the mode guarantees

Keys are integers 0 .. 2**64-1; values numpy arrays or torch tensors, C-contiguous, on the CPU,
of a gradwire dtype. The servers are GW_KV_SERVERS processes started with GW_ROLE=server (they
call serve(); `gradwire-run --servers S` starts them), or with GW_KV_SERVERS unset or 0 one
server thread inside every worker. Modes, update rules and what each call waits for:
docs/parameter-server.md; the C API and the wire: docs/wire-kv.md.
"""

from __future__ import annotations

import atexit
import ctypes
import math
import os
import sys
import weakref
from dataclasses import dataclass
from typing import Any, Optional

from . import _buffer, _lib
from ._request import Request
from .errors import InvalidArgument, Unsupported, check

Array = Any  # numpy.ndarray or torch.Tensor

MODES = ("bsp", "ssp:S", "asp", "sync:K")
UPDATES = ("sum", "sgd:LR[,momentum=M]")
_MAX_KEY = 2**64 - 1


def _require_library() -> None:
    if not _lib.has("gw_kv_create"):
        raise Unsupported(
            f"gradwire.kv: the loaded libgradwire.so ({_lib.version}, {_lib.path}) has no "
            "parameter server (gw_kv_create); rebuild it from a gradwire with issue 30"
        )


def _count(text: str, what: str, spec: str, lo: int) -> int:
    try:
        n = int(text)
    except ValueError:
        raise InvalidArgument(f"mode {spec!r}: {what} {text!r} is not an integer") from None
    if n < lo:
        raise InvalidArgument(f"mode {spec!r}: {what} must be >= {lo}, got {n}")
    return n


def parse_mode(spec: str, workers: Optional[int] = None) -> tuple[int, int, int]:
    """"bsp" | "ssp:S" | "asp" | "sync:K" -> (gw_kv_mode_t, staleness, sync_k).

    S >= 0 (ssp:0 is bsp's rule), 1 <= K <= workers (when workers is given)."""
    if not isinstance(spec, str):
        raise InvalidArgument(f"mode must be a string ({', '.join(MODES)}), got "
                              f"{type(spec).__name__}")
    s = spec.strip().lower()
    name, sep, arg = s.partition(":")
    if name == "bsp" and not sep:
        return _lib.GW_KV_BSP, 0, 0
    if name == "asp" and not sep:
        return _lib.GW_KV_ASP, 0, 0
    if name == "ssp":
        if not sep or not arg:
            raise InvalidArgument(f"mode {spec!r}: ssp needs its staleness bound, e.g. ssp:2")
        return _lib.GW_KV_SSP, _count(arg, "staleness", spec, 0), 0
    if name == "sync":
        if not sep or not arg:
            raise InvalidArgument(f"mode {spec!r}: sync needs K, the workers that close a clock, "
                                  "e.g. sync:3")
        k = _count(arg, "K", spec, 1)
        if workers is not None and k > workers:
            raise InvalidArgument(f"mode {spec!r}: K={k} exceeds the {workers} workers")
        return _lib.GW_KV_SYNC, 0, k
    if name in ("bsp", "asp"):
        raise InvalidArgument(f"mode {spec!r}: {name} takes no argument")
    raise InvalidArgument(f"mode {spec!r} is not one of {', '.join(MODES)}")


def _number(text: str, what: str, spec: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise InvalidArgument(f"update {spec!r}: {what} {text!r} is not a number") from None
    if not math.isfinite(v):
        raise InvalidArgument(f"update {spec!r}: {what} must be finite")
    return v


def parse_update(spec: str) -> tuple[int, float, float]:
    """"sum" | "sgd:LR[,momentum=M]" (also "sgd:lr=LR,momentum=M") -> (gw_kv_update_t, lr,
    momentum). LR > 0, 0 <= M < 1."""
    if not isinstance(spec, str):
        raise InvalidArgument(f"update must be a string ({', '.join(UPDATES)}), got "
                              f"{type(spec).__name__}")
    s = spec.strip().lower()
    if s == "sum":
        return _lib.GW_KV_UPDATE_SUM, 0.0, 0.0
    name, sep, args = s.partition(":")
    if name != "sgd":
        raise InvalidArgument(f"update {spec!r} is not one of {', '.join(UPDATES)}")
    if not sep or not args:
        raise InvalidArgument(f"update {spec!r}: sgd needs a learning rate, e.g. sgd:0.1")
    lr: Optional[float] = None
    momentum = 0.0
    for i, part in enumerate(p.strip() for p in args.split(",")):
        key, eq, val = part.partition("=")
        if not eq and i == 0:
            key, val = "lr", key
        elif not eq:
            raise InvalidArgument(f"update {spec!r}: {part!r} is not name=value "
                                  "(lr, momentum)")
        if key == "lr":
            lr = _number(val, "lr", spec)
        elif key == "momentum":
            momentum = _number(val, "momentum", spec)
        else:
            raise InvalidArgument(f"update {spec!r}: unknown option {key!r} (lr, momentum)")
    if lr is None:
        raise InvalidArgument(f"update {spec!r}: sgd needs a learning rate, e.g. sgd:0.1")
    if lr <= 0:
        raise InvalidArgument(f"update {spec!r}: lr must be > 0, got {lr:g}")
    if not 0 <= momentum < 1:
        raise InvalidArgument(f"update {spec!r}: momentum must be in [0, 1), got {momentum:g}")
    return _lib.GW_KV_UPDATE_SGD, lr, momentum


@dataclass(frozen=True)
class KVStats:
    """gw_kv_stats_t: this worker's clock, the slowest live worker's, the pushes dropped (sync:K,
    pushes of a closed clock) and the workers lost (died or left before the end)."""

    clock: int
    min_clock: int
    dropped_pushes: int
    lost_workers: int

    @property
    def lag(self) -> int:
        """How many clocks the slowest live worker is behind this one."""
        return max(0, self.clock - self.min_clock)


def _check_key(key: Any, what: str) -> int:
    if isinstance(key, bool) or not isinstance(key, int):
        raise InvalidArgument(f"{what}: key must be an int, got {type(key).__name__}")
    if not 0 <= key <= _MAX_KEY:
        raise InvalidArgument(f"{what}: key {key} is outside 0 .. 2**64-1")
    return key


def _check_priority(priority: Any, what: str) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidArgument(f"{what}: priority must be an int, got {type(priority).__name__}")
    if not -(2**31) <= priority < 2**31:
        raise InvalidArgument(f"{what}: priority {priority} does not fit a C int")
    return priority


def _host_view(x: Any, what: str, writable: bool = False) -> _buffer.Buffer:
    if _buffer.is_torch(x) and x.device.type != "cpu":
        raise InvalidArgument(f"{what}: the store takes CPU tensors, got one on {x.device}; "
                              "pass tensor.cpu() (and copy the result back)")
    return _buffer.view(x, what, writable=writable)


_live: "weakref.WeakSet[KVStore]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    # Registered after gradwire.comm's handler, so it runs first: a store is destroyed while its
    # communicator still exists.
    for s in list(_live):
        s.close()


class KVStore:
    """A key-value store of tensors on the parameter servers, shared by the communicator's ranks.

    mode: "bsp", "ssp:S", "asp" or "sync:K"; update: "sum" or "sgd:LR[,momentum=M]"; codec: a
    codec spec ("fp16", "topk:0.01", ... as Comm.allreduce_compressed takes; not powersgd) for the
    pushes of floating keys (float16/bfloat16/float64 converted to float32 at the worker), error
    feedback kept on the worker per (key, partition);
    partition_bytes: the largest piece of a value on one server (default GW_KV_PARTITION_BYTES,
    4 MiB). Collective: every rank of comm creates it with the same arguments. Calls on one store
    come from one thread at a time. The C library states what each call waits for in each mode
    (gradwire.h, docs/parameter-server.md).
    """

    def __init__(self, comm: Any, mode: str = "bsp", update: str = "sum",
                 codec: Optional[str] = None, partition_bytes: Optional[int] = None) -> None:
        self._h: Optional[ctypes.c_void_p] = None
        if os.environ.get("GW_ROLE", "") == "server":
            raise InvalidArgument("KVStore: this process has GW_ROLE=server; a server calls "
                                  "gradwire.kv.serve() (python3 -m gradwire.kv), workers make "
                                  "stores")
        from .comm import Comm

        if not isinstance(comm, Comm):
            raise InvalidArgument(f"KVStore: comm must be a gradwire.Comm, got "
                                  f"{type(comm).__name__}")
        m, staleness, sync_k = parse_mode(mode, comm.size)
        u, lr, momentum = parse_update(update)
        if codec is not None and (not isinstance(codec, str) or not codec.strip()):
            raise InvalidArgument("KVStore: codec must be None or a non-empty codec spec string")
        if partition_bytes is not None:
            if isinstance(partition_bytes, bool) or not isinstance(partition_bytes, int) \
                    or partition_bytes <= 0:
                raise InvalidArgument(f"KVStore: partition_bytes must be a positive int, got "
                                      f"{partition_bytes!r}")
        _require_library()
        cfg = _lib.KVConfig()
        cfg.size = ctypes.sizeof(_lib.KVConfig)
        cfg.mode, cfg.staleness, cfg.sync_k = m, staleness, sync_k
        cfg.update, cfg.lr, cfg.momentum = u, lr, momentum
        cfg.partition_bytes = partition_bytes or 0
        cfg.codec = codec.strip().encode() if codec and codec.strip() != "none" else None
        h = ctypes.c_void_p()
        check(_lib.lib.gw_kv_create(comm.handle, ctypes.byref(cfg), ctypes.byref(h)),
              "kv create")
        self._h = h
        self.comm = comm
        self.mode = mode.strip().lower()
        self.update = update.strip().lower()
        self.codec = codec
        # key -> (count, dtype, shape, a template array) of what init gave, for the local
        # checks and pull's default output.
        self._keys: dict[int, tuple[int, int, tuple, Any]] = {}
        _live.add(self)
        # Comm.close() destroys the stores made on it first.
        comm.__dict__.setdefault("_kv_stores", weakref.WeakSet()).add(self)

    # ---- lifetime ---------------------------------------------------------------------------
    @property
    def handle(self) -> ctypes.c_void_p:
        if self._h is None:
            raise InvalidArgument("the store is closed")
        if self.comm._h is None:
            raise InvalidArgument("the store's communicator is closed")
        return self._h

    def close(self) -> None:
        """Destroys this worker's store (gw_kv_destroy): the servers count this worker as
        finished. Idempotent."""
        h, self._h = self._h, None
        if h is None:
            return
        _lib.lib.gw_kv_destroy(h)

    def __enter__(self) -> "KVStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self._h is None else f"{self.mode}, {self.update}"
        return f"<gradwire.kv.KVStore {state}>"

    # ---- checks -----------------------------------------------------------------------------
    def _known(self, key: int, b: _buffer.Buffer, what: str) -> None:
        k = self._keys.get(key)
        if k is None:
            return  # the servers refuse a key nobody initialised, with their own error
        if b.count != k[0] or b.dtype != k[1]:
            raise InvalidArgument(
                f"{what}: key {key} holds {k[0]} elements of {k[3].dtype}, got {b.count} of "
                f"{b.obj.dtype}"
            )

    def _out(self, key: int, out: Optional[Array], what: str) -> Array:
        if out is not None:
            return out
        k = self._keys.get(key)
        if k is None:
            raise InvalidArgument(f"{what}: key {key} was not initialised here; pass out=")
        return _buffer.empty_like(k[3], k[2])

    # ---- calls ------------------------------------------------------------------------------
    def init(self, key: int, value: Array) -> None:
        """Declares key with its initial value (every worker, the same size and dtype); see the
        header for who waits for whom."""
        key = _check_key(key, "kv init")
        b = _host_view(value, "kv init value")
        check(_lib.lib.gw_kv_init(self.handle, key, b.ptr, b.count, b.dtype), "kv init")
        self._keys[key] = (b.count, b.dtype, tuple(value.shape), value)

    def push(self, key: int, value: Array, priority: int = 0) -> None:
        """Sends value into key's clock on the servers (the update rule applies it)."""
        key, priority = _check_key(key, "kv push"), _check_priority(priority, "kv push")
        b = _host_view(value, "kv push value")
        self._known(key, b, "kv push")
        check(_lib.lib.gw_kv_push(self.handle, key, b.ptr, b.count, b.dtype, priority), "kv push")

    def pull(self, key: int, out: Optional[Array] = None, priority: int = 0) -> Array:
        """Reads key into out (default: a new array shaped like init's value) as fresh as the
        mode guarantees; returns out."""
        key, priority = _check_key(key, "kv pull"), _check_priority(priority, "kv pull")
        out = self._out(key, out, "kv pull")
        b = _host_view(out, "kv pull out", writable=True)
        self._known(key, b, "kv pull")
        check(_lib.lib.gw_kv_pull(self.handle, key, b.ptr, b.count, b.dtype, priority), "kv pull")
        return out

    def pushpull(self, key: int, value: Array, out: Optional[Array] = None,
                 priority: int = 0) -> Array:
        """push then pull in one call (BytePS's push_pull); out defaults to value itself (in
        place). Returns out."""
        key, priority = _check_key(key, "kv pushpull"), _check_priority(priority, "kv pushpull")
        v, o, out = self._pair(key, value, out, "kv pushpull")
        check(_lib.lib.gw_kv_pushpull(self.handle, key, v.ptr, o.ptr, v.count, v.dtype, priority),
              "kv pushpull")
        return out

    def _pair(self, key: int, value: Array, out: Optional[Array], what: str):
        v = _host_view(value, f"{what} value", writable=out is None)
        o = v if out is None else _host_view(out, f"{what} out", writable=True)
        self._known(key, v, what)
        if o.dtype != v.dtype or o.count != v.count:
            raise InvalidArgument(f"{what}: out has {o.count} elements of {o.obj.dtype}, value "
                                  f"{v.count} of {v.obj.dtype}")
        return v, o, value if out is None else out

    def _request(self, st: int, h: ctypes.c_void_p, keep: list, result: Array,
                 what: str) -> Request:
        check(st, what)
        req = Request(self.comm, h, keep, result, what)
        self.comm._pending.add(req)
        return req

    def ipush(self, key: int, value: Array, priority: int = 0) -> Request:
        """push, non-blocking: value stays untouched until the Request's wait() returns."""
        key, priority = _check_key(key, "kv ipush"), _check_priority(priority, "kv ipush")
        b = _host_view(value, "kv ipush value")
        self._known(key, b, "kv ipush")
        h = ctypes.c_void_p()
        st = _lib.lib.gw_kv_ipush(self.handle, key, b.ptr, b.count, b.dtype, priority,
                                  ctypes.byref(h))
        return self._request(st, h, [b], value, "kv ipush")

    def ipull(self, key: int, out: Optional[Array] = None, priority: int = 0) -> Request:
        """pull, non-blocking: wait() returns out."""
        key, priority = _check_key(key, "kv ipull"), _check_priority(priority, "kv ipull")
        out = self._out(key, out, "kv ipull")
        b = _host_view(out, "kv ipull out", writable=True)
        self._known(key, b, "kv ipull")
        h = ctypes.c_void_p()
        st = _lib.lib.gw_kv_ipull(self.handle, key, b.ptr, b.count, b.dtype, priority,
                                  ctypes.byref(h))
        return self._request(st, h, [b], out, "kv ipull")

    def ipushpull(self, key: int, value: Array, out: Optional[Array] = None,
                  priority: int = 0) -> Request:
        """pushpull, non-blocking: wait() returns out (default value, in place)."""
        key, priority = _check_key(key, "kv ipushpull"), _check_priority(priority, "kv ipushpull")
        v, o, out = self._pair(key, value, out, "kv ipushpull")
        h = ctypes.c_void_p()
        st = _lib.lib.gw_kv_ipushpull(self.handle, key, v.ptr, o.ptr, v.count, v.dtype, priority,
                                      ctypes.byref(h))
        return self._request(st, h, [v] if o is v else [v, o], out, "kv ipushpull")

    def clock(self) -> None:
        """This worker finished its clock (its pushes of the clock are all issued)."""
        check(_lib.lib.gw_kv_clock(self.handle), "kv clock")

    def stats(self) -> KVStats:
        """This worker's view of the store: clocks, dropped pushes, lost workers."""
        s = _lib.KVStats()
        s.size = ctypes.sizeof(_lib.KVStats)
        check(_lib.lib.gw_kv_stats(self.handle, ctypes.byref(s)), "kv stats")
        return KVStats(int(s.clock), int(s.min_clock), int(s.dropped_pushes),
                       int(s.lost_workers))


def serve() -> None:
    """The server role: serves the job this process's environment names (MASTER_ADDR,
    MASTER_PORT / GW_STORE, GW_JOB_TOKEN, GW_KV_SERVERS, GW_KV_SERVER_RANK) until every worker
    has destroyed its stores, or the deadline without workers passes (gw_kv_serve). Raises the
    GradwireError of a failure."""
    _require_library()
    check(_lib.lib.gw_kv_serve(None), "kv serve")


def _main() -> int:
    # python3 -m gradwire.kv: what gradwire-run --servers starts in every server process.
    from .errors import GradwireError

    try:
        serve()
    except GradwireError as e:
        sys.stderr.write(f"gradwire.kv serve: {e}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main())
