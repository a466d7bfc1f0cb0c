"""ProcessGroupGradwire: the torch.distributed ProcessGroup written in Python over gradwire.Comm,
with torch 1.13's and 2.x's spellings of its methods, and comm_of for the DDP hooks.

Supported: all_reduce (sum, product, min, max, avg), broadcast, all_gather (equal sizes),
all_gather_into_tensor, reduce_scatter (equal sizes), reduce_scatter_tensor, barrier; reduce,
gather, scatter, all_to_all and all_to_all_single (_rooted_ops: uneven where the library has
gw_alltoallv); send, recv, recv_anysource (_p2p). Bitwise reductions and several tensors per call
raise Unsupported.
Reductions take gradwire's dtypes (others raise InvalidArgument at the call); broadcast,
all_gather, all_to_all, gather and scatter move bytes, so they take any dtype. Work.wait()
raises the operation's error."""

from __future__ import annotations

import threading
import warnings
from datetime import timedelta
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

from .._buffer import gw_dtype
from ..comm import Comm, Op
from ..errors import InvalidArgument, Unsupported
from ._checks import (_blocks, _cuda_devices, _cuda_fence, _equal, _flat, _gw_op, _movable, _one,
                      _raw, _unstack, _writable)
from ._p2p import PointToPointOps
from ._rendezvous import comm_over_store
from ._rooted_ops import RootedOps
from ._work import GradwireWork, _KeepAlive
from ._worker import _submit

BACKEND_NAME = "gradwire"


class ProcessGroupGradwire(PointToPointOps, RootedOps, ProcessGroup):
    """A torch.distributed ProcessGroup running its collectives on a gradwire.Comm."""

    # torch 2.x asks a group's backend whether it can split before eager init
    # (init_process_group(device_id=...)); a Python ProcessGroup is its own backend.
    supports_splitting = False

    def __init__(self, store: Any, rank: int, size: int, timeout: Optional[timedelta] = None,
                 comm: Optional[Comm] = None) -> None:
        super().__init__(rank, size)
        self.comm: Comm = comm if comm is not None else comm_over_store(store, rank, size, timeout)
        self._own_comm = comm is None  # shutdown() closes only a communicator it made
        self._shut = False
        self._submit_lock = threading.Lock()  # a submission and shutdown() do not interleave
        self._rank = rank
        self._size = size
        self._keep = _KeepAlive()
        self._gw_group_name: Optional[str] = None  # see _set_group_name
        self._gw_group_desc = "undefined"

    # torch calls these
    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND_NAME

    def _get_backend_name(self) -> str:
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    # torch 2.x keeps a group's name in the backends registered with its ProcessGroup, and a
    # Python ProcessGroup has none: torch's own _set_group_name was a no-op on it and the
    # group_name property raised "ProcessGroup name not set" (destroy_process_group reads it).
    # The name (and description) live here instead.
    def _set_group_name(self, name: str) -> None:
        self._gw_group_name = name

    @property
    def group_name(self) -> str:
        if self._gw_group_name is None:
            raise RuntimeError("ProcessGroup name not set")
        return self._gw_group_name

    def _set_group_desc(self, desc: str) -> None:
        self._gw_group_desc = desc

    @property
    def group_desc(self) -> str:
        return self._gw_group_desc

    # The C++ spellings: newer torch's PyProcessGroup trampoline forwards getGroupName() and
    # friends to Python methods of exactly these names (C++ callers); without them a C++
    # caller still gets "ProcessGroup name not set".
    def getGroupName(self) -> str:  # noqa: N802
        return self.group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._set_group_name(name)

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._gw_group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._set_group_desc(desc)

    def _get_backend(self, device: Any) -> "ProcessGroupGradwire":
        # torch 2.x's init_process_group(device_id=...) asks the new group for its C++ backend
        # (pg._get_backend(device_id).supports_splitting); the base raises "No backend type
        # associated with device type".
        return self

    def shutdown(self) -> None:
        """torch 2.x's destroy_process_group calls this on each group it destroys (the base is a
        no-op for a Python group). Lets what was submitted run, for up to 10 s in all, then frees
        the communicator this group made (Comm.close is local, not collective; a call still
        running ends with an abort error); one passed in as comm= stays the caller's. Called from
        the worker's own thread (a future's callback), it does not wait. Later collectives on
        the group raise InvalidArgument, and so do those submitted while it runs. Idempotent;
        never raises (it runs in teardown)."""
        with self._submit_lock:
            if self._shut:
                return
            self._shut = True
        problems = []
        w = getattr(self.comm, "_torch_worker", None)
        if w is not None:
            try:
                # The worker closes a comm this group made once what was queued has run (from a
                # callback on the worker's own thread this returns at once, and that still holds).
                w.stop(then=self.comm.close if self._own_comm else None)
            except Exception as e:  # noqa: BLE001 (teardown must go on)
                problems.append(e)
        if self._own_comm and not (w is not None and w.on_thread()):
            # Closed already by the worker (idempotent), or no worker, or one that outlived the
            # wait: then a call still running ends aborted.
            try:
                self.comm.close()
            except Exception as e:  # noqa: BLE001
                problems.append(e)
        for e in problems:
            try:
                warnings.warn(f"gradwire: shutting the process group down: {e}")
            except Exception:  # noqa: BLE001 (-W error must not make teardown raise)
                pass

    def abort(self) -> None:
        """Ends every operation of this group at once with an abort error (torch's
        _abort_process_group; also for a hung job). Thread-safe; the group is unusable after."""
        self.comm.abort()

    def _work(self, fn: Callable[[], Any], *tensors: Any) -> Any:
        flat = [x for t in tensors for x in (t if isinstance(t, (list, tuple)) else [t])]
        devices = _cuda_devices(flat)
        fence = _cuda_fence(devices)
        # Grad mode is per thread and always on in the worker: the caller's (torch.no_grad()
        # around a parameter's all_reduce or broadcast) governs the in-place writes there.
        grad = torch.is_grad_enabled()

        def run() -> Any:
            if fence is not None:
                fence()
            with torch.set_grad_enabled(grad):
                value = fn()
            # Outputs written by a device-to-device copy (reduce_scatter_tensor, all_to_all,
            # all_gather into a list, ...) were only queued on the worker's stream, which no
            # caller stream waits for: finish them before the Work completes.
            for d in devices:
                torch.cuda.current_stream(d).synchronize()
            return value
        with self._submit_lock:
            if self._shut:
                raise InvalidArgument("gradwire: the process group was shut down "
                                      "(destroy_process_group)")
            fut, inner = _submit(self.comm, run)
        return GradwireWork(fut, self._keep, inner)

    def _run(self, step: Callable[[], Any], result: Any, *tensors: Any) -> Any:
        """A Work that runs step() on the worker and completes with result."""
        def run() -> Any:
            step()
            return result
        return self._work(run, *tensors)

    def allreduce(self, tensors: list, opts: Any = None) -> Any:
        return self.allreduce_coalesced([_one(tensors, "all_reduce")], opts, "all_reduce")

    def allreduce_coalesced(self, tensors: list, opts: Any = None,
                            what: str = "all_reduce_coalesced") -> Any:
        op = _gw_op(opts.reduceOp) if opts is not None else Op.SUM
        for t in tensors:
            self._check(t, what)
            _writable(t, what)
        return self._run(lambda: [self.comm.allreduce(t, op=op) for t in tensors], tensors,
                         tensors)

    def broadcast(self, tensors: list, opts: Any = None) -> Any:
        t = _one(tensors, "broadcast")
        root = opts.rootRank if opts is not None else 0
        _movable(t, "broadcast")
        if not t.is_contiguous():
            raise InvalidArgument("gradwire broadcast: the tensor is not contiguous")
        _writable(t, "broadcast")  # on the root too, which does not write: all refuse alike
        return self._run(lambda: self.comm.broadcast(_raw(t), root), tensors, tensors)

    def allgather(self, output_lists: list, inputs: list, opts: Any = None) -> Any:
        t = _one(inputs, "all_gather")
        outs = _one(output_lists, "all_gather")
        if len(outs) != self._size:
            raise InvalidArgument(f"gradwire all_gather: {len(outs)} output tensors for "
                                  f"{self._size} ranks")
        _movable(t, "all_gather")
        _equal(outs, t, "all_gather")

        def run() -> None:
            flat = torch.empty(self._size * t.numel(), dtype=t.dtype, device=t.device)
            self.comm.allgather(_raw(_flat(t)), _raw(flat))
            _unstack(flat, outs)
        return self._run(run, output_lists, inputs, outs)

    def _gather_into(self, output: torch.Tensor, input: torch.Tensor) -> Callable[[], None]:
        """Checks one all_gather_into_tensor at the call; returns what runs it."""
        _blocks(output, input, self._size, "all_gather_into_tensor", "output")
        _movable(input, "all_gather_into_tensor")

        def run() -> None:
            if output.is_contiguous():
                self.comm.allgather(_raw(_flat(input)), _raw(output))
            else:
                flat = torch.empty(output.numel(), dtype=output.dtype, device=output.device)
                self.comm.allgather(_raw(_flat(input)), _raw(flat))
                output.copy_(flat.view(output.shape))
        return run

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        return self._run(self._gather_into(output, input), [output], input, output)

    def _coalesced(self, outputs: list, inputs: list, what: str,
                   step_of: Callable[[torch.Tensor, torch.Tensor], Callable[[], None]]) -> Any:
        """torch 2.x's coalesced tensor collectives (_coalescing_manager, FSDP): every pair checked
        at the call by step_of, then one Work running them one after another."""
        if len(outputs) != len(inputs):
            raise InvalidArgument(f"gradwire {what} (coalesced): {len(outputs)} outputs for "
                                  f"{len(inputs)} inputs")
        steps = [step_of(o, i) for o, i in zip(outputs, inputs)]
        return self._run(lambda: [step() for step in steps], outputs, inputs, outputs)

    def allgather_into_tensor_coalesced(self, outputs: list, inputs: list,
                                        opts: Any = None) -> Any:
        return self._coalesced(outputs, inputs, "all_gather_into_tensor", self._gather_into)

    def reduce_scatter(self, outputs: list, input_lists: list, opts: Any = None) -> Any:
        out = _one(outputs, "reduce_scatter")
        ins = _one(input_lists, "reduce_scatter")
        op = _gw_op(opts.reduceOp) if opts is not None else Op.SUM
        if len(ins) != self._size:
            raise InvalidArgument(f"gradwire reduce_scatter: {len(ins)} input tensors for "
                                  f"{self._size} ranks")
        gw_dtype(out, "gradwire reduce_scatter")
        _equal(ins, out, "reduce_scatter")

        def run() -> None:
            res = self.comm.reduce_scatter(torch.cat([_flat(i) for i in ins]), op=op)
            out.copy_(res.view(out.shape))
        return self._run(run, outputs, ins, out)

    def _scatter_from(self, output: torch.Tensor, input: torch.Tensor,
                      op: Op) -> Callable[[], None]:
        """Checks one reduce_scatter_tensor at the call; returns what runs it."""
        _blocks(output, input, self._size, "reduce_scatter_tensor", "input")
        gw_dtype(input, "gradwire reduce_scatter_tensor")

        def run() -> None:
            res = self.comm.reduce_scatter(_flat(input), op=op)
            output.copy_(res.view(output.shape))
        return run

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,
                             opts: Any = None) -> Any:
        op = _gw_op(opts.reduceOp) if opts is not None else Op.SUM
        return self._run(self._scatter_from(output, input, op), [output], input, output)

    def reduce_scatter_tensor_coalesced(self, outputs: list, inputs: list,
                                        opts: Any = None) -> Any:
        op = _gw_op(opts.reduceOp) if opts is not None else Op.SUM
        return self._coalesced(outputs, inputs, "reduce_scatter_tensor",
                               lambda o, i: self._scatter_from(o, i, op))

    def barrier(self, opts: Any = None) -> Any:
        return self._run(self.comm.barrier, [])

    # Newer torch spells the C++ single-tensor collectives all_gather_single and
    # reduce_scatter_single and its trampoline looks for Python methods of those names (C++
    # callers such as functional collectives); dist.* still calls the underscored ones.
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base

    def allgather_coalesced(self, *args: Any) -> Any:
        raise Unsupported("gradwire: all_gather_coalesced is not supported")

    def monitored_barrier(self, *args: Any, **kw: Any) -> Any:
        raise Unsupported("gradwire: monitored_barrier is not supported (use barrier)")

    def _check(self, t: torch.Tensor, what: str) -> None:
        """Refuses, before anything is queued, what the worker would refuse later."""
        gw_dtype(t, f"gradwire {what}")
        if not t.is_contiguous():
            raise InvalidArgument(f"gradwire {what}: the tensor is not contiguous")


_comms: dict = {}


def comm_of(group: Any = None) -> Comm:
    """The gradwire Comm for a process group (default: the default group).

    A gradwire group's own Comm; for another group (gloo, nccl) a Comm made once per group over
    the default store (collective over the group the first time)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if isinstance(pg, ProcessGroupGradwire):
        return pg.comm
    # Keyed by the group's id, the group kept alive beside its Comm: a later group (after
    # destroy_process_group and a new init) cannot take the id of one still cached.
    held = _comms.get(id(pg))
    if held is None or held[0] is not pg:
        if pg is not dist.distributed_c10d._get_default_group():
            raise Unsupported("gradwire: comm_of works for gradwire groups and the default group")
        store = dist.distributed_c10d._get_default_store()
        held = (pg, comm_over_store(store, pg.rank(), pg.size(), None, prefix="gradwire-hooks"))
        _comms[id(pg)] = held
    return held[1]
