"""GradwireWork: the torch Work of one operation, a view of the future its worker completes."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any, Optional

import torch
from torch._C._distributed_c10d import Work

from ..errors import TimeoutError as GwTimeoutError
from ._worker import _Failed


class GradwireWork(Work):
    """The Work handed to torch for one operation: a view of its torch.futures.Future.

    torch's own future-wrapping Work (_create_work_from_future, torch 1.13) returns True from
    wait() even when the future failed, so a synchronous dist.broadcast whose peer died would
    leave the tensor unchanged and say nothing. wait() here raises the operation's error.
    C++ callers (DDP's reducer) reach get_future() through pybind11's trampoline, which finds
    the Python object only while it is alive; the group keeps it alive until the operation
    has finished and its outcome has been collected (wait, get_future or result)."""

    def __init__(self, fut: torch.futures.Future, keep: "_KeepAlive",
                 inner: Optional[torch.futures.Future] = None) -> None:
        super().__init__()
        self._fut = fut
        self._inner = inner  # the future the worker completes: the operation's own exception
        self._keep = keep
        self._collected = False
        keep.add(self)
        fut.then(lambda _f: keep.settle(self))

    def _collect(self) -> None:
        self._collected = True
        self._keep.settle(self)

    def _outcome(self) -> Any:
        """The future's value; raises the operation's own exception (a gradwire.GradwireError
        such as PeerError), not the RuntimeError torch wraps a failed callback in."""
        try:
            return self._fut.wait()
        except Exception:
            inner = self._inner
            if inner is not None and inner.done():
                v = inner.wait()
                if isinstance(v, _Failed):
                    raise v.error from None
            raise

    def wait(self, timeout: Any = None) -> bool:
        """Blocks until the operation ends; raises its error (gradwire.GradwireError). With a
        timeout (a timedelta, or seconds as torch's binding reads a number) that passes first:
        gradwire.TimeoutError, the operation going on."""
        self._collect()
        secs = None
        if isinstance(timeout, timedelta):
            secs = timeout.total_seconds()
        elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0:
            secs = float(timeout)
        if secs is not None and secs > 0 and not self._fut.done():
            ended = threading.Event()
            self._fut.then(lambda _f: ended.set())
            if not ended.wait(secs):
                raise GwTimeoutError(f"gradwire: the operation did not end within {secs:g} s "
                                     "(Work.wait timeout); it goes on")
        self._outcome()
        return True

    def get_future(self) -> torch.futures.Future:
        self._collect()
        return self._fut

    def is_completed(self) -> bool:
        return self._fut.done()

    def is_success(self) -> bool:
        if not self._fut.done():
            return False
        try:
            self._fut.wait()
            return True
        except Exception:  # noqa: BLE001
            return False

    def exception(self) -> Optional[BaseException]:
        try:
            self._outcome()
            return None
        except Exception as e:  # noqa: BLE001
            return e

    def result(self) -> list:
        self._collect()
        return self._outcome()

    def synchronize(self) -> None:
        pass


class _KeepAlive:
    """References to the Works torch may still call into from C++."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set = set()

    def add(self, w: GradwireWork) -> None:
        with self._lock:
            self._live.add(w)

    def settle(self, w: GradwireWork) -> None:
        if w._collected and w._fut.done():
            with self._lock:
                self._live.discard(w)
