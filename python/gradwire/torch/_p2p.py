"""Point-to-point for the process group: send, recv, recv_anysource (and so isend, irecv,
batch_isend_irecv), each a P2PWork over gradwire's own isend/irecv requests.

Sends and receives are posted at the call on the caller's thread (gw_isend/gw_irecv return at
once), not queued behind the group's collectives on its worker: a rank's send does not wait for
its earlier asynchronous collectives, so a peer that receives before joining them cannot
deadlock (as with gloo). A tensor an asynchronous collective is still writing must therefore be
waited for before it is sent. CUDA tensors are staged through pinned host memory: a send copies
at the call, a receive copies back when its Work is waited for or found completed.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any, Optional

import torch
from torch._C._distributed_c10d import Work

from .._p2p import ANY_SOURCE, P2PRequest
from ..comm import Comm
from ..errors import InvalidArgument
from ._checks import _movable, _one, _raw, _writable


class P2PWork(Work):
    """The Work of one send or receive (or of a coalesced batch of them): wait() blocks until
    every request ends and raises the first error; is_completed() polls without blocking;
    _source_rank() gives a receive's sender (what dist.recv(src=None) returns)."""

    def __init__(self, reqs: list, tensors: list) -> None:
        super().__init__()
        self._reqs = reqs
        self._tensors = tensors
        self._lock = threading.Lock()  # one thread inside the C wait/test of these requests
        self._error: Optional[BaseException] = None
        self._future: Optional[torch.futures.Future] = None

    def _settle(self, timeout: Optional[float]) -> None:
        for r in self._reqs:
            try:
                r.wait(timeout)
            except Exception as e:  # noqa: BLE001 (kept: every later wait raises it too)
                if isinstance(e, TimeoutError) and timeout is not None and not r.done:
                    raise  # the deadline of this wait only; the request goes on
                if self._error is None:
                    self._error = e

    def wait(self, timeout: Any = None) -> bool:
        """Blocks until the operation ends (at most the communicator's deadline, or the given
        timeout: a timedelta or seconds, then gradwire.TimeoutError with the request going on);
        raises its error (gradwire.GradwireError)."""
        secs = None
        if isinstance(timeout, timedelta):
            secs = timeout.total_seconds()
        elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0:
            secs = float(timeout)
        with self._lock:
            self._settle(secs if secs and secs > 0 else None)
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        if not self._lock.acquire(blocking=False):
            return False  # another thread is waiting for it
        try:
            for r in self._reqs:
                try:
                    if not r.test():
                        return False
                except Exception as e:  # noqa: BLE001
                    if self._error is None:
                        self._error = e
            return True
        finally:
            self._lock.release()

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> Optional[BaseException]:
        return self._error if self.is_completed() else None

    def _source_rank(self) -> int:
        recvs = [r for r in self._reqs if r._what == "irecv"]
        if len(recvs) != 1 or recvs[0].source is None:
            raise InvalidArgument("gradwire: _source_rank() is for the Work of one receive, "
                                  "after it completed")
        return recvs[0].source

    sourceRank = _source_rank  # noqa: N815 (the C++ spelling)

    def result(self) -> list:
        self.wait()
        return self._tensors

    def get_future(self) -> torch.futures.Future:
        """A future completed (on a thread of its own, made on first call) when this ends."""
        with self._lock:
            if self._future is None:
                fut: torch.futures.Future = torch.futures.Future()
                self._future = fut

                def waiter() -> None:
                    try:
                        self.wait()
                        fut.set_result(self._tensors)
                    except Exception as e:  # noqa: BLE001
                        fut.set_exception(e)
                threading.Thread(target=waiter, name="gradwire-p2p-future", daemon=True).start()
        return self._future

    def synchronize(self) -> None:
        pass


class PointToPointOps:
    """send / recv / recv_anysource and the coalescing hooks of ProcessGroupGradwire."""

    comm: Comm
    _p2p_batch: Optional[list] = None

    def _p2p(self, tensors: list, peer: int, tag: int, recv: bool) -> P2PWork:
        what = "recv" if recv else "send"
        if getattr(self, "_shut", False):
            raise InvalidArgument("gradwire: the process group was shut down "
                                  "(destroy_process_group)")
        t = _one(tensors, what)
        _movable(t, what)
        if not t.is_contiguous():
            raise InvalidArgument(f"gradwire {what}: the tensor is not contiguous")
        if recv:
            _writable(t, what)
        if not isinstance(tag, int) or tag < 0:
            raise InvalidArgument(f"gradwire {what}: tag {tag!r} must be >= 0")
        raw = _raw(t)
        req: P2PRequest = (self.comm.irecv(raw, peer, tag) if recv
                           else self.comm.isend(raw, peer, tag))
        work = P2PWork([req], tensors)
        if self._p2p_batch is not None:
            self._p2p_batch.append(req)
        return work

    def send(self, tensors: list, dst: int, tag: int = 0) -> P2PWork:
        return self._p2p(tensors, dst, tag, recv=False)

    def recv(self, tensors: list, src: int, tag: int = 0) -> P2PWork:
        return self._p2p(tensors, src, tag, recv=True)

    def recv_anysource(self, tensors: list, tag: int = 0) -> P2PWork:
        return self._p2p(tensors, ANY_SOURCE, tag, recv=True)

    # batch_isend_irecv: torch 1.13 brackets the isend/irecv calls with these (its base class
    # refuses to end a non-empty batch); torch 2.x only for CUDA tensors, taking a device and
    # expecting one Work for the batch from _end_coalescing. Every call was posted already.
    def _start_coalescing(self, *args: Any) -> None:
        self._p2p_batch = []

    def _end_coalescing(self, *args: Any) -> Optional[P2PWork]:
        reqs, self._p2p_batch = self._p2p_batch or [], None
        if args and isinstance(args[0], list):  # torch 1.13: the Works are the caller's list
            return None
        return P2PWork(reqs, [])
