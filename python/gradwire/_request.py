"""Request: a non-blocking operation in flight (iallreduce, isend, irecv, the i-collectives)."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Optional

from . import _buffer, _lib
from .errors import GradwireError, error_for

if TYPE_CHECKING:
    from .comm import Comm

Array = Any  # numpy.ndarray or torch.Tensor


class Request:
    """An operation started by a non-blocking call (Comm.iallreduce, isend, irecv, ...). Wait for
    it before touching its buffers."""

    def __init__(self, comm: "Comm", handle: ctypes.c_void_p, keep: list[_buffer.Buffer],
                 result: Array, what: str = "iallreduce") -> None:
        self._comm = comm
        self._handle = handle
        self._keep = keep
        self._result = result
        self._what = what
        self._done = False
        self._error: Optional[GradwireError] = None

    def _c_wait(self, ms: int) -> int:
        return _lib.lib.gw_wait(self._handle, ms)

    def _c_test(self, done: ctypes.c_int) -> int:
        return _lib.lib.gw_test(self._handle, ctypes.byref(done))

    def _finish(self, status: int) -> None:
        self._done = True
        self._comm._pending.discard(self)
        if status != _lib.GW_OK:
            self._error = error_for(status, self._what)
            raise self._error
        for b in self._keep:
            b.done()
        self._keep = []

    def wait(self, timeout: Optional[float] = None) -> Array:
        """Waits for completion and returns the result array.

        timeout: seconds; None waits up to the communicator's deadline (GW_TIMEOUT_MS). When the
        timeout passes first, gradwire.TimeoutError is raised and the request stays valid (wait
        again). A failed operation raises its error (on every later wait too).
        """
        if self._error is not None:
            raise self._error
        if self._done:
            return self._result
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        st = self._c_wait(ms)
        if st == _lib.GW_ERR_TIMEOUT and timeout is not None:
            # Still running (gw_wait's contract): the request remains ours.
            from .errors import TimeoutError as GwTimeout

            raise GwTimeout(f"{self._what}: not finished within {timeout} s", st)
        self._finish(st)
        return self._result

    def test(self) -> bool:
        """True when the operation has finished (raises its error if it failed)."""
        if self._error is not None:
            raise self._error
        if self._done:
            return True
        done = ctypes.c_int(0)
        st = self._c_test(done)
        if done.value or st != _lib.GW_OK:
            self._finish(st)
            return True
        return False

    @property
    def done(self) -> bool:
        return self._done
