"""hvd.DistributedOptimizer: reduces gradients across ranks as backward produces them.

A hook on each parameter's gradient accumulator marks the parameter ready (after
backward_passes_per_step backward passes). Parameters are grouped, in reverse of their order in
the optimizer (roughly the order backward produces them), into fusion buckets of one dtype and
device, each closed once it reaches GRADWIRE_FUSION_THRESHOLD bytes (default 25 MiB, the first
bucket 1 MiB; 0: one bucket per parameter), as DDP's reducer cuts them. A bucket
whose parameters are all ready is copied into one flat buffer and reduced as one collective on
the communicator's worker thread while backward goes on. Buckets are started strictly in bucket
order, as DDP's reducer does: the library matches collectives by order, and backward may finish
parameters in a different order on different ranks, so this is what keeps the ranks in step
without Horovod's per-tensor negotiation. After the first step the buckets are rebuilt in the
order rank 0's hooks fired (broadcast, so every rank uses the same). step() (or synchronize())
starts the buckets not started yet (missing gradients count as zero), waits for all of them and
copies the results back into the gradients.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import torch

from . import horovod as _h

DEFAULT_FUSION_THRESHOLD = 25 * 1024 * 1024
# The first bucket (the first gradients backward produces) is kept small so that the first
# reduction starts early in backward, as DDP's first bucket is.
FIRST_BUCKET_BYTES = 1024 * 1024


def _fusion_threshold() -> int:
    v = os.environ.get("GRADWIRE_FUSION_THRESHOLD")
    if v is None or v == "":
        return DEFAULT_FUSION_THRESHOLD
    try:
        n = int(v)
    except ValueError:
        raise ValueError(f"GRADWIRE_FUSION_THRESHOLD={v!r} is not a byte count") from None
    if n < 0:
        raise ValueError(f"GRADWIRE_FUSION_THRESHOLD={v!r} must be >= 0")
    return n


class _Bucket:
    def __init__(self, index: int, params: list) -> None:
        self.index = index
        self.params = params
        self.pending = len(params)
        self.handle: Optional[int] = None
        self.flat: Optional[torch.Tensor] = None
        self.ctx: Any = None


class _DistributedOptimizer(torch.optim.Optimizer):
    # Methods of this class are copied into a subclass of the wrapped optimizer's class (see
    # DistributedOptimizer), so step() runs the original optimizer's update.

    def __init__(self, params: Any, named_parameters: Any, compression: Any,
                 backward_passes_per_step: int, op: int, gradient_predivide_factor: float,
                 state: Any) -> None:
        super(self.__class__, self).__init__(params)
        self.state = state  # keep what the wrapped optimizer held already
        self._compression = compression
        self._op = op
        self._predivide = gradient_predivide_factor
        self._passes = backward_passes_per_step
        all_params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(x, tuple) or len(x) != 2 for x in named):
                raise ValueError("named_parameters should be a sequence of (name, parameter), "
                                 "usually model.named_parameters()")
            names = [n for n, _ in named]
            dups = sorted({n for n in names if names.count(n) > 1})
            if dups:
                raise ValueError(f"named_parameters has duplicate names: {', '.join(dups)}")
            self._names = {p: n for n, p in named}
            unnamed = [p for p in all_params if p not in self._names]
            if unnamed:
                raise ValueError(f"{len(unnamed)} parameters of the optimizer are not in "
                                 "named_parameters; pass model.named_parameters() of the model "
                                 "the optimizer trains")
        else:
            self._names = {p: f"allreduce.noname.{i}" for i, p in enumerate(all_params)}
        seen: set = set()
        self._params = []
        for p in all_params:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                self._params.append(p)
        self._threshold = _fusion_threshold()
        self._lock = threading.Lock()
        self._delay = {p: self._passes for p in self._params}
        self._fired: list = []  # the order hooks fired in (rank 0's rebuilds the buckets)
        self._rebuilt = False
        self._synchronized = False
        self._should_sync = True
        self._build(list(reversed(self._params)))
        self._grad_accs = []
        if _h.size() > 1:
            self._register_hooks()

    # ---- buckets ------------------------------------------------------------------------------
    def _build(self, order: list) -> None:
        self._buckets: list[_Bucket] = []
        self._bucket_of: dict = {}
        cur: list = []
        nbytes = 0
        for p in order:
            b = p.numel() * p.element_size()
            cap = min(self._threshold, FIRST_BUCKET_BYTES) if not self._buckets \
                else self._threshold
            if cur and (cur[0].dtype != p.dtype or cur[0].device != p.device):
                self._buckets.append(_Bucket(len(self._buckets), cur))
                cur, nbytes = [], 0
            cur.append(p)
            nbytes += b
            # DDP's rule: a bucket closes once it reaches its cap (its last parameter may take it
            # past), not before it would pass it. Closing before left a lone first bucket of a
            # few bytes (a model's last bias, before a large weight) and a larger last bucket,
            # which starts only when backward ends (docs/perf.md, Horovod API vs DDP).
            if nbytes >= cap:
                self._buckets.append(_Bucket(len(self._buckets), cur))
                cur, nbytes = [], 0
        if cur:
            self._buckets.append(_Bucket(len(self._buckets), cur))
        for bk in self._buckets:
            for p in bk.params:
                self._bucket_of[p] = bk
        self._next = 0

    def _register_hooks(self) -> None:
        with torch.enable_grad():  # the accumulator is reached through a graph node
            for p in self._params:
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(self._make_hook(p))
                self._grad_accs.append(acc)

    def _make_hook(self, p: torch.Tensor) -> Any:
        def hook(*_: Any) -> None:
            with self._lock:
                if self._delay[p] <= 0:
                    raise AssertionError(
                        "gradients were computed more than backward_passes_per_step times "
                        "before step(); raise backward_passes_per_step to accumulate them")
                self._delay[p] -= 1
                if self._delay[p] == 0:
                    if not self._rebuilt:
                        self._fired.append(p)
                    bk = self._bucket_of[p]
                    bk.pending -= 1
                    self._start_ready()
        return hook

    def _start_ready(self) -> None:
        # Under self._lock: start every bucket that is complete and next in order.
        while self._next < len(self._buckets) and self._buckets[self._next].pending == 0:
            self._start(self._buckets[self._next])
            self._next += 1

    def _start(self, bk: _Bucket) -> None:
        grads = []
        for p in bk.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad.detach().reshape(-1))
        flat = torch.cat(grads) if len(grads) > 1 else grads[0].clone()
        if self._op == _h.Average:
            pre, post = 1.0 / self._predivide, self._predivide
        else:
            pre = post = 1.0
        name = f"b{bk.index}.{self._names[bk.params[0]]}" + (f"+{len(bk.params) - 1}" if len(bk.params) > 1 else "")
        bk.flat = flat
        bk.handle = _h.allreduce_async_(flat, name=name, op=self._op, prescale_factor=pre,
                                        postscale_factor=post, compression=self._compression)

    # ---- Horovod's optimizer methods ---------------------------------------------------------
    def synchronize(self) -> None:
        """Starts what backward has not (in bucket order), waits for every bucket and writes the
        reduced gradients back. Called by step() unless skip_synchronize() is in effect."""
        if _h.size() == 1:
            self._synchronized = True
            return
        with self._lock:
            for bk in self._buckets[self._next:]:
                bk.pending = 0
            self._start_ready()
        with torch.no_grad():
            for bk in self._buckets:
                _h.synchronize(bk.handle)
                at = 0
                for p in bk.params:
                    n = p.numel()
                    p.grad.copy_(bk.flat[at: at + n].view_as(p.grad))
                    at += n
                bk.handle = bk.flat = None
                bk.pending = len(bk.params)
        self._next = 0
        for p in self._params:
            self._delay[p] = self._passes
        if not self._rebuilt:
            self._rebuild()
        self._synchronized = True

    def _rebuild(self) -> None:
        # Rank 0's firing order (as parameter indices, the rest appended in reverse) decides
        # everyone's buckets from now on.
        self._rebuilt = True
        index = {p: i for i, p in enumerate(self._params)}
        fired = [index[p] for p in self._fired]
        got = set(fired)
        rest = [i for i in reversed(range(len(self._params))) if i not in got]
        order = torch.tensor(fired + rest, dtype=torch.int64)
        _h.broadcast_(order, 0)
        self._fired = []
        self._build([self._params[i] for i in order.tolist()])

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """step() inside this block does not synchronize (call synchronize() before it)."""
        self._should_sync = False
        try:
            yield
        finally:
            self._should_sync = True

    def step(self, closure: Any = None) -> Any:
        if self._should_sync:
            if self._synchronized:
                import warnings

                warnings.warn("optimizer.step() after optimizer.synchronize() without "
                              "skip_synchronize(): the gradients are reduced again")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args: Any, **kwargs: Any) -> Any:
        if any(bk.handle is not None for bk in self._buckets):
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize()")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Any = None,
                         compression: Any = None, backward_passes_per_step: int = 1,
                         op: int = _h.Average, gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0, groups: Any = None,
                         sparse_as_dense: bool = False, process_set: Any = None) -> Any:
    """Wraps optimizer so that step() applies the gradients averaged (op) over all ranks.

    named_parameters: model.named_parameters() (names the reductions; checked complete).
    compression: hvd.Compression.none (default), .fp16, or .codec("topk:0.01") etc.
    backward_passes_per_step: backward passes accumulated locally before each reduction.
    op: hvd.Average (default), Sum, Min, Max or Product; Adasum raises NotImplementedError.
    gradient_predivide_factor: with Average, gradients are divided by it before the sum and by
    size / it after. num_groups/groups: ignored (fusion is by GRADWIRE_FUSION_THRESHOLD)."""
    _h._op_of(op, None, "DistributedOptimizer")
    _h._no_process_set(process_set)
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be an int >= 1, "
                         f"got {backward_passes_per_step!r}")
    if gradient_predivide_factor != 1.0 and op != _h.Average:
        raise ValueError("gradient_predivide_factor is for op=Average only")
    if gradient_predivide_factor <= 0:
        raise ValueError("gradient_predivide_factor must be > 0")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters,
               compression if compression is not None else _h.Compression.none,
               backward_passes_per_step, op, gradient_predivide_factor, optimizer.state)
