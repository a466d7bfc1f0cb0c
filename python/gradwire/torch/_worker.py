"""The worker thread: runs a communicator's operations in submission order, off the caller's
thread (ctypes releases the GIL during the C call, so backward keeps computing), and completes a
torch.futures.Future with each one's value or exception."""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from typing import Any, Callable, Optional

import torch

# Imported before the atexit registration below: gradwire.comm's exit handler is registered
# first, so this module's runs before it (see _stop_workers).
from ..comm import Comm
from ..errors import InvalidArgument


def _unwrap(fut: torch.futures.Future) -> Any:
    v = fut.value()
    if isinstance(v, _Failed):
        raise v.error
    return v


class _Failed:
    """What the worker completes a future with when the operation raised."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _refused() -> tuple:
    """(outer, inner) as _Worker.submit returns them, failed already: no worker takes work now."""
    inner: torch.futures.Future = torch.futures.Future()
    outer = inner.then(_unwrap)
    inner.set_result(_Failed(InvalidArgument(
        "gradwire: the communicator's worker was stopped (the process group was shut down, or "
        "the interpreter is exiting)")))
    return outer, inner


class _Worker:
    """One thread that runs a communicator's operations in submission order.

    A failure must reach C++ consumers (DDP's reducer) as a future error: torch.futures.Future's
    set_exception only stores the exception as the future's value (C++ would read it as the
    result), so the worker completes an inner future and hands out inner.then(_unwrap), whose
    raising callback marks the outer future failed for Python and C++ alike."""

    # How long stop() waits for what was submitted before it (teardown must end).
    STOP_WAIT_S = 10.0

    def __init__(self, name: str) -> None:
        self._q: "queue.SimpleQueue[Optional[tuple]]" = queue.SimpleQueue()
        # Held while deciding whether a submission goes in: nothing is queued after the stop.
        self._lock = threading.Lock()
        self.stopped = False
        self._then: Optional[Callable[[], None]] = None
        self._t = threading.Thread(target=self._loop, name=name, daemon=True)
        self._t.start()

    def alive(self) -> bool:
        return self._t.is_alive()

    def on_thread(self) -> bool:
        return threading.current_thread() is self._t

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                if self._then is not None:  # stop(then=...): after everything queued before it
                    try:
                        self._then()
                    except Exception:  # noqa: BLE001 (teardown must go on)
                        pass
                return
            fn, fut = item
            try:
                value = fn()
            except BaseException as e:  # noqa: BLE001 (the future carries it to the waiter)
                value = _Failed(e)
            fut.set_result(value)

    def submit(self, fn: Callable[[], Any]) -> tuple:
        """Queues fn; returns (outer, inner): the future to hand out, and the one the worker
        completes (GradwireWork re-raises the operation's own exception from it)."""
        with self._lock:
            if not self.stopped:
                inner: torch.futures.Future = torch.futures.Future()
                self._q.put((fn, inner))
                return inner.then(_unwrap), inner
        return _refused()

    def stop(self, then: Optional[Callable[[], None]] = None) -> bool:
        """Lets what was submitted run, then `then()` on the worker's thread, then ends the
        thread; later submissions fail at once. Waits up to STOP_WAIT_S (not at all on the
        worker's own thread, from a callback). Returns whether the thread has ended."""
        with self._lock:
            if not self.stopped:
                self.stopped = True
                self._then = then
                self._q.put(None)
        if self.on_thread():
            return False
        self._t.join(timeout=self.STOP_WAIT_S)
        return not self._t.is_alive()


_workers: "weakref.WeakSet[_Worker]" = weakref.WeakSet()
_workers_lock = threading.Lock()  # one worker per comm, even when two threads submit at once
_exiting = False


@atexit.register
def _stop_workers() -> None:
    # Ends the worker threads before the interpreter finalises; registered after gradwire.comm's
    # handler, so it runs first and the communicators close with no thread inside them. No new
    # worker starts after it.
    global _exiting
    with _workers_lock:
        _exiting = True
    for w in list(_workers):
        w.stop()


def run_async(comm: Comm, fn: Callable[[], Any]) -> torch.futures.Future:
    """Runs fn() on comm's worker thread (after everything submitted before it); returns a
    Future completed with fn's value or its exception."""
    return _submit(comm, fn)[0]


def _submit(comm: Comm, fn: Callable[[], Any]) -> tuple:
    with _workers_lock:
        w = getattr(comm, "_torch_worker", None)
        # A stopped worker whose thread has ended is replaced (a comm= shared with a group that
        # was shut down); one still running its last call refuses, so two threads never share a
        # comm. At exit the stopped worker refuses too.
        if not _exiting and (w is None or (w.stopped and not w.alive())):
            w = comm._torch_worker = _Worker(f"gradwire-rank{comm.rank}")
            _workers.add(w)
    if w is None:
        return _refused()
    return w.submit(fn)
