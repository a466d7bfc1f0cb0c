"""The process group's rooted collectives (reduce, gather, scatter) and all-to-alls, a mixin of
ProcessGroupGradwire.

Where the loaded libgradwire.so exports gw_reduce, gw_gather, gw_scatter and gw_alltoallv
(gradwire.has_collective), reduce, gather and scatter run on them and all_to_all /
all_to_all_single take uneven sizes and splits. With an older library reduce, gather and scatter
run on allreduce, allgather and broadcast (each rank moves more bytes, the results are the same),
and uneven all-to-alls raise Unsupported.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from .._rooted import has_collective
from ..comm import Comm, Op
from ..errors import InvalidArgument, Unsupported
from ._checks import _equal, _flat, _gw_op, _movable, _one, _raw, _unstack, _writable


def _elems(t: torch.Tensor) -> int:
    """Elements of _raw(t) per element of t (its size when _raw moves bytes)."""
    return t.element_size() // _raw(t[:0] if t.dim() else t.reshape(1)[:0]).element_size()


def _split_counts(t: torch.Tensor, splits: list, n: int, what: str) -> list:
    """Elements (of _raw(t)) per rank for dim-0 splits of t; no splits: dim 0 split evenly."""
    rows = t.size(0) if t.dim() else 1
    if not splits:
        if rows % n:
            raise InvalidArgument(f"gradwire all_to_all_single: the {what} has no splits and its "
                                  f"dim 0 ({rows}) does not divide by {n} ranks")
        splits = [rows // n] * n
    if len(splits) != n or sum(splits) != rows or any(s < 0 for s in splits):
        raise InvalidArgument(f"gradwire all_to_all_single: {what} splits {list(splits)} do not "
                              f"split dim 0 ({rows}) over {n} ranks")
    per_row = (t.numel() // rows if rows else 0) * _elems(t)
    return [s * per_row for s in splits]


def _need_alltoallv(what: str, detail: str) -> None:
    if not has_collective("alltoallv"):
        raise Unsupported(f"gradwire {what}: {detail} are not supported (the loaded "
                          "libgradwire.so has no gw_alltoallv)")


class RootedOps:
    """reduce, gather, scatter, all_to_all, all_to_all_single of ProcessGroupGradwire (which
    supplies comm, _rank, _size, _run and _check)."""

    comm: Comm
    _rank: int
    _size: int
    _run: Callable[..., Any]
    _check: Callable[[torch.Tensor, str], None]

    def alltoall(self, outputs: list, inputs: list, opts: Any = None) -> Any:
        if len(inputs) != self._size or len(outputs) != self._size:
            raise InvalidArgument(f"gradwire all_to_all: {len(inputs)} inputs and {len(outputs)} "
                                  f"outputs for {self._size} ranks")
        _movable(inputs[0], "all_to_all")
        like = inputs[0]
        if any(t.numel() != like.numel() for t in inputs + outputs) and has_collective("alltoallv"):
            for t in inputs + outputs:
                if t.dtype != like.dtype:
                    raise InvalidArgument(f"gradwire all_to_all: every tensor must have the "
                                          f"dtype {like.dtype}; one has {t.dtype}")
            k = _elems(like)
            sc, rc = [t.numel() * k for t in inputs], [t.numel() * k for t in outputs]

            def uneven() -> None:
                send = torch.cat([_flat(i) for i in inputs])
                res = torch.empty(sum(t.numel() for t in outputs), dtype=like.dtype,
                                  device=like.device)
                self.comm.alltoallv(_raw(send), sc, _raw(res), rc)
                _unstack(res, outputs)
            return self._run(uneven, outputs, inputs, outputs)
        _equal(inputs, like, "all_to_all")
        _equal(outputs, like, "all_to_all")

        def run() -> None:
            send = torch.cat([_flat(i) for i in inputs])
            res = torch.empty_like(send)
            self.comm.alltoall(_raw(send), _raw(res))
            _unstack(res, outputs)
        return self._run(run, outputs, inputs, outputs)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_splits: list,
                      input_splits: list, opts: Any = None) -> Any:
        _movable(input, "all_to_all_single")
        if output.dtype != input.dtype:
            raise InvalidArgument(f"gradwire all_to_all_single: output dtype {output.dtype} "
                                  f"differs from the input's {input.dtype}")
        # Checked as gloo does: splits must split dim 0; a side without splits is split evenly
        # and its dim 0 must divide by the ranks (or blocks would cut rows).
        sc = _split_counts(input, list(input_splits), self._size, "input")
        rc = _split_counts(output, list(output_splits), self._size, "output")
        if len(set(sc)) > 1 or len(set(rc)) > 1 or sc != rc:
            _need_alltoallv("all_to_all_single", f"uneven splits (input {list(input_splits)}, "
                                                 f"output {list(output_splits)})")

            def uneven() -> None:
                res = torch.empty(output.numel(), dtype=output.dtype, device=output.device)
                self.comm.alltoallv(_raw(_flat(input)), sc, _raw(res), rc)
                output.copy_(res.view(output.shape))
            return self._run(uneven, [output], input, output)

        def run() -> None:
            send = _flat(input)
            res = torch.empty_like(send)
            self.comm.alltoall(_raw(send), _raw(res))
            output.copy_(res.view(output.shape))
        return self._run(run, [output], input, output)

    def reduce(self, tensors: list, opts: Any = None) -> Any:
        t = _one(tensors, "reduce")
        op = _gw_op(opts.reduceOp) if opts is not None else Op.SUM
        root = opts.rootRank if opts is not None else 0
        self._check(t, "reduce")
        _writable(t, "reduce")  # on every rank, though only root writes: all refuse alike

        def run() -> None:
            if not has_collective("reduce"):
                # An allreduce; ranks other than root reduce a copy and keep their tensor.
                self.comm.allreduce(t if self._rank == root else t.clone(), op=op)
                return
            self.comm.reduce(t, t if self._rank == root else None, op=op, root=root)
        return self._run(run, tensors, tensors)

    def gather(self, output_lists: list, inputs: list, opts: Any = None) -> Any:
        t = _one(inputs, "gather")
        root = opts.rootRank if opts is not None else 0
        outs = output_lists[0] if self._rank == root else []
        _movable(t, "gather")
        if self._rank == root:
            _equal(outs, t, "gather")

        def run() -> None:
            flat = _flat(t)
            if not has_collective("gather"):
                res = torch.empty(self._size * flat.numel(), dtype=t.dtype, device=t.device)
                self.comm.allgather(_raw(flat), _raw(res))
            else:
                n = self._size * flat.numel() if self._rank == root else 0
                res = torch.empty(n, dtype=t.dtype, device=t.device)
                self.comm.gather(_raw(flat), _raw(res), root)
            _unstack(res, outs)
        return self._run(run, output_lists, t, outs)

    def scatter(self, outputs: list, input_lists: list, opts: Any = None) -> Any:
        out = _one(outputs, "scatter")
        root = opts.rootRank if opts is not None else 0
        _movable(out, "scatter")
        ins: Optional[list] = _one(input_lists, "scatter") if self._rank == root else None
        if ins is not None:
            _equal(ins, out, "scatter")

        def run() -> None:
            n = out.numel()
            send = torch.cat([_flat(i) for i in ins]) if ins is not None else None
            if not has_collective("scatter"):
                flat = send if send is not None else torch.empty(self._size * n, dtype=out.dtype,
                                                                 device=out.device)
                self.comm.broadcast(_raw(flat), root)
                res = flat[self._rank * n:(self._rank + 1) * n]
            else:
                res = torch.empty(n, dtype=out.dtype, device=out.device)
                self.comm.scatter(_raw(send) if send is not None else None, _raw(res), root)
            out.copy_(res.view(out.shape))
        return self._run(run, outputs, out, ins or [])
