"""Horovod's PyTorch API over gradwire: a Horovod script runs with `import gradwire.torch as hvd`.

    import gradwire.torch as hvd
    hvd.init()                                       # rank and size from the launcher
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

One gradwire.Comm per process (made by init() from the launcher's environment). Every operation
runs on that communicator's worker thread (gradwire.torch._worker) in submission order: the *_async
forms return an integer handle at once, synchronize(handle) waits for it and poll(handle) asks.
The library's collectives are matched by order, not by name (Horovod negotiates by name): every
rank must submit its operations in the same order. DistributedOptimizer keeps that order itself
(optimizer.py); direct calls must be made in the same order on every rank, as with any collective.

Not built: Adasum (raises NotImplementedError), process sets, sparse tensors, grouped_* calls.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import socket
import threading
import time
from typing import Any, Callable, Optional

import torch

from ..comm import Comm, Op
from ..errors import InvalidArgument
from . import _worker

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "allgather", "allgather_async", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "alltoall", "alltoall_async", "synchronize", "poll", "join",
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object",
    "Compression", "Compressor", "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "nccl_built", "mpi_built", "gloo_built", "cuda_built", "rocm_built", "mpi_enabled",
    "gloo_enabled", "mpi_threads_supported", "comm",
]

# Reduction operations, with Horovod's values.
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5
_OPS = {Average: Op.AVG, Sum: Op.SUM, Min: Op.MIN, Max: Op.MAX, Product: Op.PROD}
_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
             Product: "Product"}


class _State:
    def __init__(self) -> None:
        self.comm: Optional[Comm] = None
        self.local_rank = 0
        self.local_size = 1
        self.cross_rank = 0
        self.cross_size = 1
        self.lock = threading.Lock()
        self.next_handle = 1
        self.handles: dict[int, tuple] = {}  # handle -> (future, finish(value) -> result)


_st = _State()


# ---- lifetime and topology -------------------------------------------------------------------
def init(comm: Optional[Comm] = None, process_sets: Any = None) -> None:
    """Joins the job (collective; a second call does nothing). comm: an existing gradwire.Comm to
    use; by default one is made from the launcher's environment (gradwire-run, torchrun, mpirun,
    srun). local_rank/local_size/cross_rank/cross_size come from the ranks' host names."""
    if _st.comm is not None:
        return
    if comm is not None and not isinstance(comm, Comm):
        raise ValueError(f"init: comm must be a gradwire.Comm (MPI communicators and rank lists "
                         f"are not supported), got {type(comm).__name__}")
    if process_sets not in (None, [], ()):
        raise NotImplementedError("init: process sets are not built in gradwire's Horovod API")
    c = comm if comm is not None else Comm()
    _st.comm = c
    _topology(c)


def _topology(c: Comm) -> None:
    # Every rank's host (hashed to an int64), gathered once: local ranks are the ranks sharing this
    # host in rank order, cross ranks number the hosts in the order of their lowest rank.
    # GW_HVD_HOST overrides the host name (tests place ranks on pretend hosts).
    host = os.environ.get("GW_HVD_HOST") or socket.gethostname()
    digest = hashlib.blake2b(host.encode(), digest_size=8).digest()
    h = torch.tensor([int.from_bytes(digest, "little") >> 1, len(host)], dtype=torch.int64)
    hosts = [tuple(x) for x in c.allgather(h).tolist()]
    mine = hosts[c.rank]
    same = [r for r, x in enumerate(hosts) if x == mine]
    order: list[tuple] = []
    for x in hosts:
        if x not in order:
            order.append(x)
    _st.local_rank, _st.local_size = same.index(c.rank), len(same)
    _st.cross_rank, _st.cross_size = order.index(mine), len(order)


def shutdown() -> None:
    """Waits for outstanding handles, then closes the communicator (init() may be called again)."""
    for h in list(_st.handles):
        try:
            synchronize(h)
        except Exception:  # noqa: BLE001 (shutting down; the error was the caller's to fetch)
            pass
    c, _st.comm = _st.comm, None
    if c is not None:
        c.close()


def is_initialized() -> bool:
    return _st.comm is not None


def comm() -> Comm:
    """The gradwire.Comm that init() made (for gradwire's own calls: stats(), codecs)."""
    if _st.comm is None:
        raise ValueError("gradwire.torch (Horovod API): call hvd.init() first")
    return _st.comm


def rank() -> int:
    return comm().rank


def size() -> int:
    return comm().size


def local_rank() -> int:
    comm()
    return _st.local_rank


def local_size() -> int:
    comm()
    return _st.local_size


def cross_rank() -> int:
    comm()
    return _st.cross_rank


def cross_size() -> int:
    comm()
    return _st.cross_size


def nccl_built() -> bool:
    return False  # collectives here run on gradwire's transports, never through NCCL


def mpi_built() -> bool:
    return False


def gloo_built() -> bool:
    return False


def cuda_built() -> bool:
    return torch.cuda.is_available()  # CUDA tensors are accepted (staged through host memory)


def rocm_built() -> bool:
    return False


def mpi_enabled() -> bool:
    return False


def gloo_enabled() -> bool:
    return False


def mpi_threads_supported() -> bool:
    return False


# ---- compression -----------------------------------------------------------------------------
class Compressor:
    """Horovod's interface: compress(tensor) -> (tensor, ctx); decompress(tensor, ctx) -> tensor.
    A compressor with a `spec` (Compression.codec) is instead run inside the library
    (gw_allreduce_compressed, with error feedback per tensor name)."""

    spec: Optional[str] = None

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class _NoneCompressor(Compressor):
    pass


class _FP16Compressor(Compressor):
    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple:
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor if ctx is None else tensor.to(ctx)


class _CodecCompressor(Compressor):
    def __init__(self, spec: str) -> None:
        if not isinstance(spec, str) or not spec:
            raise InvalidArgument("Compression.codec: spec must be a non-empty codec spec string")
        self.spec = spec

    def __repr__(self) -> str:
        return f"Compression.codec({self.spec!r})"


class Compression:
    """Compression.none, Compression.fp16 (Horovod's), and Compression.codec(spec): one of
    gradwire's codecs ("topk:0.01", "sign", "powersgd:4", "qsgd:16", ... docs/compression.md),
    with its error-feedback residual kept in the library under the tensor's name."""

    none = _NoneCompressor
    fp16 = _FP16Compressor

    @staticmethod
    def codec(spec: str) -> Compressor:
        return _CodecCompressor(spec)


# ---- handles ---------------------------------------------------------------------------------
def _cuda_ready(t: torch.Tensor) -> None:
    if t.is_cuda:  # the worker reads the tensor from another thread: finish its pending writes
        torch.cuda.current_stream(t.device).synchronize()


def _submit(fn: Callable[[], Any], finish: Callable[[Any], Any] = lambda v: v,
            what: str = "operation") -> int:
    # The inner future carries the operation's own exception (the outer one would wrap it).
    _, fut = _worker._submit(comm(), fn)
    with _st.lock:
        h = _st.next_handle
        _st.next_handle += 1
        _st.handles[h] = (fut, finish, what, time.monotonic())
    return h


def poll(handle: int) -> bool:
    """True when the operation of handle has finished (synchronize() then returns at once)."""
    try:
        fut = _st.handles[handle][0]
    except KeyError:
        raise ValueError(f"poll: handle {handle!r} is unknown or already synchronized") from None
    return fut.done()


def _stall_s() -> float:
    try:
        return float(os.environ.get("GW_STALL_WARN_S", "60"))
    except ValueError:
        return 60.0


def _wait(fut: Any, what: str, since: float) -> Any:
    """fut's value; while it waits longer than GW_STALL_WARN_S, logs the tensors this rank has
    submitted and not finished (the library's own warning names the ranks missing)."""
    period = _stall_s()
    if period > 0 and not fut.done():
        done = threading.Event()
        fut.add_done_callback(lambda _: done.set())
        start = since
        while not done.wait(max(0.0, since + period - time.monotonic())):
            with _st.lock:
                pending = [w for f, _, w, _ in _st.handles.values() if not f.done()]
            logging.getLogger("gradwire.torch").warning(
                "stall: rank %d: waited %.1f s for %s; submitted on this rank and not finished: "
                "%s (another rank may not have submitted them, or submitted others first)",
                comm().rank, time.monotonic() - start, what, ", ".join([what] + pending))
            since = time.monotonic()
    return fut.wait()


def synchronize(handle: int) -> Any:
    """Waits for the operation of handle and returns its output (raises its error)."""
    with _st.lock:
        item = _st.handles.pop(handle, None)
    if item is None:
        raise ValueError(f"synchronize: handle {handle!r} is unknown or already synchronized")
    fut, finish, what, since = item
    value = _wait(fut, what, since)
    if isinstance(value, _worker._Failed):
        raise value.error
    return finish(value)


def _op_of(op: Optional[int], average: Optional[bool], what: str) -> int:
    if op is not None and average is not None:
        raise ValueError(f"{what}: give op or average, not both")
    if op is None:
        op = Sum if average is False else Average
    if op == Adasum:
        raise NotImplementedError(
            f"{what}: Adasum is not built in gradwire; use op=hvd.Average or hvd.Sum")
    if op not in _OPS:
        raise ValueError(f"{what}: op {op!r} is not one of Average, Sum, Min, Max, Product")
    return op


# ---- allreduce -------------------------------------------------------------------------------
def _allreduce_run(t: torch.Tensor, op: int, name: Optional[str], compression: Any,
                   prescale: float, postscale: float) -> Callable[[], torch.Tensor]:
    """fn for the worker: reduces t (contiguous, ours to write) in place and returns it."""
    c = comm()
    spec = getattr(compression, "spec", None)

    def run() -> torch.Tensor:
        with torch.no_grad():
            if prescale != 1.0:
                t.mul_(prescale)
            if spec is not None and op in (Average, Sum) and t.dtype in (
                    torch.float32, torch.float16, torch.bfloat16):
                key = f"hvd.{name or 'noname'}.n{t.numel()}.{t.dtype}"
                c.allreduce_compressed(t, spec, key)
                if op == Average:
                    t.div_(c.size)
            else:
                c.allreduce(t, op=_OPS[op])
            if postscale != 1.0:
                t.mul_(postscale)
            if t.is_cuda:
                torch.cuda.current_stream(t.device).synchronize()
        return t
    return run


def allreduce_async_(tensor: torch.Tensor, average: Optional[bool] = None,
                     name: Optional[str] = None, op: Optional[int] = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: Any = None, compression: Any = Compression.none) -> int:
    """Starts reducing tensor in place across ranks; returns a handle for synchronize()."""
    op = _op_of(op, average, "allreduce_async_")
    _no_process_set(process_set)
    if not tensor.is_contiguous():
        raise InvalidArgument("allreduce_async_: the tensor is not contiguous")
    _cuda_ready(tensor)
    wire, ctx = compression.compress(tensor) if getattr(compression, "spec", None) is None \
        else (tensor, None)
    run = _allreduce_run(wire, op, name, compression, prescale_factor, postscale_factor)

    def finish(out: torch.Tensor) -> torch.Tensor:
        if out is not tensor:
            with torch.no_grad():
                tensor.copy_(compression.decompress(out, ctx))
        return tensor
    return _submit(run, finish, f"allreduce {name or '(unnamed)'}")


def allreduce_async(tensor: torch.Tensor, average: Optional[bool] = None,
                    name: Optional[str] = None, op: Optional[int] = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: Any = None, compression: Any = Compression.none) -> int:
    """Starts reducing a copy of tensor; synchronize(handle) returns the result."""
    op = _op_of(op, average, "allreduce_async")
    _no_process_set(process_set)
    out = tensor.detach().clone(memory_format=torch.contiguous_format)
    return allreduce_async_(out, name=name, op=op, prescale_factor=prescale_factor,
                            postscale_factor=postscale_factor, compression=compression)


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[int] = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, process_set: Any = None,
               compression: Any = Compression.none) -> torch.Tensor:
    """Reduces tensor in place across ranks (default op: Average) and returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set, compression))


class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: Optional[str], op: int, pre: float,
                post: float, compression: Any) -> torch.Tensor:
        ctx.args = (op, pre, post)
        return synchronize(allreduce_async(tensor, name=name, op=op, prescale_factor=pre,
                                           postscale_factor=post, compression=compression))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        op, pre, post = ctx.args
        if op not in (Average, Sum):
            raise NotImplementedError("allreduce: the gradient of Min, Max or Product is not built")
        g = synchronize(allreduce_async(grad.contiguous(), op=op, prescale_factor=pre,
                                        postscale_factor=post))
        return g, None, None, None, None, None


def allreduce(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
              compression: Any = Compression.none, op: Optional[int] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: Any = None) -> torch.Tensor:
    """A new tensor: tensor reduced across ranks (default op: Average). Differentiable (the
    gradient is the same reduction of the output's gradient) for Average and Sum."""
    op = _op_of(op, average, "allreduce")
    _no_process_set(process_set)
    return _AllreduceFn.apply(tensor, name, op, prescale_factor, postscale_factor, compression)


# ---- allgather -------------------------------------------------------------------------------
def _gather_rows(c: Comm, t: torch.Tensor) -> torch.Tensor:
    """Concatenates every rank's t along dim 0 (first dimensions may differ; the rest must not)."""
    if t.dim() == 0:
        t = t.reshape(1)
    shape = torch.tensor([t.dim(), *t.shape, *([0] * (8 - t.dim()))][:9], dtype=torch.int64)
    if t.dim() > 8:
        raise InvalidArgument("allgather: tensors of more than 8 dimensions are not supported")
    shapes = c.allgather(shape)
    rows = shapes[:, 1].tolist()
    for r in range(c.size):
        if shapes[r, 0] != t.dim() or not torch.equal(shapes[r, 2:t.dim() + 1],
                                                     shape[2:t.dim() + 1]):
            raise InvalidArgument(
                f"allgather: rank {r} has shape {shapes[r, 1:shapes[r, 0] + 1].tolist()}, "
                f"this rank {list(t.shape)}: only the first dimension may differ")
    src = t.contiguous()
    if src.is_cuda:
        src = src.cpu()
    most = max(rows)
    if most != t.shape[0]:
        pad = torch.zeros((most,) + tuple(t.shape[1:]), dtype=t.dtype)
        pad[: t.shape[0]] = src
        src = pad
    out = c.allgather(src)  # (size, most, ...)
    parts = [out[r, : rows[r]] for r in range(c.size)]
    return torch.cat(parts, 0).to(t.device)


def allgather_async(tensor: torch.Tensor, name: Optional[str] = None,
                    process_set: Any = None) -> int:
    """Starts gathering every rank's tensor, concatenated along dim 0; returns a handle."""
    _no_process_set(process_set)
    _cuda_ready(tensor)
    t = tensor.detach()
    c = comm()
    return _submit(lambda: _gather_rows(c, t), what=f"allgather {name or '(unnamed)'}")


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: Optional[str]) -> torch.Tensor:
        c = comm()
        ctx.rows = synchronize(allgather_async(
            torch.tensor([tensor.shape[0] if tensor.dim() else 1]), name=name)).tolist()
        ctx.rank = c.rank
        return synchronize(allgather_async(tensor, name=name))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        g = synchronize(allreduce_async(grad.contiguous(), op=Sum))
        start = sum(ctx.rows[: ctx.rank])
        return g[start: start + ctx.rows[ctx.rank]], None


def allgather(tensor: torch.Tensor, name: Optional[str] = None,
              process_set: Any = None) -> torch.Tensor:
    """Every rank's tensor concatenated along dim 0 in rank order; the first dimension may differ
    between ranks. Differentiable (the gradient is the summed output gradient's own rows)."""
    _no_process_set(process_set)
    if tensor.dim() == 0:
        tensor = tensor.reshape(1)
    return _AllgatherFn.apply(tensor, name)


# ---- broadcast -------------------------------------------------------------------------------
def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                     process_set: Any = None) -> int:
    """Starts overwriting tensor with root_rank's, in place; returns a handle."""
    _no_process_set(process_set)
    c = comm()
    if not isinstance(root_rank, int) or not 0 <= root_rank < c.size:
        raise ValueError(f"broadcast: root_rank {root_rank!r} is not a rank (0..{c.size - 1})")
    if not tensor.is_contiguous():
        raise InvalidArgument("broadcast_async_: the tensor is not contiguous")
    _cuda_ready(tensor)
    t = tensor.detach()

    def run() -> torch.Tensor:
        c.broadcast(t, root_rank)
        return tensor
    return _submit(run, what=f"broadcast {name or '(unnamed)'}")


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                    process_set: Any = None) -> int:
    """Starts broadcasting a copy of tensor; synchronize(handle) returns root_rank's value."""
    out = tensor.detach().clone(memory_format=torch.contiguous_format)
    return broadcast_async_(out, root_rank, name, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set: Any = None) -> torch.Tensor:
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: Optional[str]) -> Any:
        ctx.root = root_rank
        return synchronize(broadcast_async(tensor, root_rank, name))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        g = synchronize(allreduce_async(grad.contiguous(), op=Sum))
        if rank() != ctx.root:
            g.zero_()
        return g, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set: Any = None) -> torch.Tensor:
    """A new tensor holding root_rank's tensor. Differentiable (the root gets the summed
    gradient, the others zero)."""
    _no_process_set(process_set)
    return _BroadcastFn.apply(tensor, root_rank, name)


# ---- alltoall --------------------------------------------------------------------------------
def _alltoall_rows(c: Comm, t: torch.Tensor, splits: Optional[list]) -> tuple:
    n = c.size
    rows = t.shape[0]
    if splits is None:
        if rows % n:
            raise InvalidArgument(f"alltoall: the first dimension ({rows}) is not a multiple of "
                                  f"the {n} ranks; pass splits")
        splits = [rows // n] * n
    if len(splits) != n or any(s < 0 for s in splits) or sum(splits) != rows:
        raise InvalidArgument(f"alltoall: splits {splits} must be {n} counts >= 0 summing to "
                              f"the first dimension {rows}")
    recv_splits = c.alltoall(torch.tensor(splits, dtype=torch.int64))
    most = int(c.allreduce(torch.tensor([max(splits)], dtype=torch.int64), op=Op.MAX)[0])
    inner = tuple(t.shape[1:])
    src = t.contiguous().cpu()
    send = torch.zeros((n, most) + inner, dtype=t.dtype)
    at = 0
    for j, s in enumerate(splits):
        send[j, :s] = src[at: at + s]
        at += s
    out = c.alltoall(send)
    got = recv_splits.tolist()
    parts = [out[j, : got[j]] for j in range(n)]
    return torch.cat(parts, 0).to(t.device), recv_splits


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: Optional[str] = None,
                   process_set: Any = None) -> int:
    """Starts an alltoall (see alltoall); synchronize(handle) returns (tensor, received_splits)."""
    _no_process_set(process_set)
    if tensor.dim() == 0:
        raise InvalidArgument("alltoall: the tensor needs at least one dimension")
    sp = None if splits is None else [int(s) for s in
                                      (splits.tolist() if torch.is_tensor(splits) else splits)]
    _cuda_ready(tensor)
    t = tensor.detach()
    c = comm()
    return _submit(lambda: _alltoall_rows(c, t, sp), what=f"alltoall {name or '(unnamed)'}")


def alltoall(tensor: torch.Tensor, splits: Any = None, name: Optional[str] = None,
             process_set: Any = None) -> Any:
    """Sends rows of tensor to the ranks: splits[j] rows (default: equal shares) to rank j, and
    returns the rows received, concatenated in rank order. With splits, returns
    (tensor, received_splits) as Horovod does."""
    out, got = synchronize(alltoall_async(tensor, splits, name, process_set))
    return out if splits is None else (out, got)


# ---- join, objects, state --------------------------------------------------------------------
def join(device: int = -1) -> int:
    """Waits until every rank has called join(); returns the rank that called it last (by its
    wall clock). Unlike Horovod, ranks that joined early do not take part in other ranks' later
    allreduces: every rank must run the same collectives before joining."""
    for h in list(_st.handles):
        synchronize(h)
    c = comm()
    times = synchronize(_submit(lambda: c.allgather(torch.tensor([time.time()],
                                                                 dtype=torch.float64))))
    return int(torch.argmax(times.reshape(-1)).item())


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: Any = None) -> Any:
    """root_rank's obj (pickled with torch.save) on every rank."""
    c = comm()
    buf = io.BytesIO()
    if c.rank == root_rank:
        torch.save(obj, buf)
    data = buf.getvalue()
    n = broadcast_(torch.tensor([len(data)], dtype=torch.int64), root_rank)
    payload = torch.zeros(int(n[0]), dtype=torch.uint8)
    if c.rank == root_rank:
        payload.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    broadcast_(payload, root_rank)
    if c.rank == root_rank:
        return obj
    return torch.load(io.BytesIO(payload.numpy().tobytes()))


def allgather_object(obj: Any, name: Optional[str] = None, process_set: Any = None) -> list:
    """Every rank's obj, in rank order."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    sizes = allgather(torch.tensor([data.numel()], dtype=torch.int64)).tolist()
    flat = allgather(data)
    out, at = [], 0
    for s in sizes:
        out.append(torch.load(io.BytesIO(flat[at: at + s].numpy().tobytes())))
        at += s
    return out


def broadcast_parameters(params: Any, root_rank: int) -> None:
    """Overwrites params with root_rank's: a state_dict, or an iterable of (name, tensor) such as
    model.named_parameters(). Tensors are fused into one broadcast per dtype and device."""
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = list(params)
        if items and not (isinstance(items[0], tuple) and len(items[0]) == 2):
            raise ValueError("broadcast_parameters: expected a state_dict or (name, tensor) pairs")
    groups: dict = {}
    for name, p in items:
        if p is None:
            continue
        if not torch.is_tensor(p):
            raise ValueError(f"broadcast_parameters: {name!r} is a {type(p).__name__}, "
                             "not a tensor")
        groups.setdefault((p.dtype, p.device), []).append(p)
    with torch.no_grad():
        for (dtype, device), ps in groups.items():
            flat = torch.cat([p.detach().reshape(-1) for p in ps])
            broadcast_(flat, root_rank)
            at = 0
            for p in ps:
                p.copy_(flat[at: at + p.numel()].view_as(p))
                at += p.numel()


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int) -> None:
    """Makes every rank's optimizer state (its state_dict: per-parameter buffers, step counts,
    hyper-parameters such as lr) root_rank's."""
    state = broadcast_object(optimizer.state_dict(), root_rank)
    if comm().rank != root_rank:
        optimizer.load_state_dict(state)


def _no_process_set(ps: Any) -> None:
    if ps is not None and getattr(ps, "process_set_id", 0) != 0:
        raise NotImplementedError("process sets are not built in gradwire's Horovod API")
