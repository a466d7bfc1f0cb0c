"""Exceptions: one class per gw_status_t, all under GradwireError.

GradwireError derives from RuntimeError (what torch.distributed's own backends raise), so code
written for gloo or nccl that catches RuntimeError keeps working. The message is the library's
gw_last_error(): it names the operation and, where one is involved, the peer rank.
"""

from __future__ import annotations

import builtins

from . import _lib


class GradwireError(RuntimeError):
    """A gradwire call failed. ``status`` is the gw_status_t code (0 for checks made in Python)."""

    status: int = 0

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class InvalidArgument(GradwireError, ValueError):
    """GW_ERR_INVALID_ARG, or an argument refused in Python (dtype, contiguity, size)."""

    status = _lib.GW_ERR_INVALID_ARG


class TimeoutError(GradwireError, builtins.TimeoutError):  # noqa: A001 (gradwire.TimeoutError)
    """GW_ERR_TIMEOUT: a deadline (GW_TIMEOUT_MS, or wait's timeout) passed."""

    status = _lib.GW_ERR_TIMEOUT


class PeerError(GradwireError):
    """GW_ERR_PEER: a peer closed, died or sent something unexpected."""

    status = _lib.GW_ERR_PEER


class SystemCallError(GradwireError):
    """GW_ERR_SYSTEM: a system call failed. Formerly SystemError, which shadowed the builtin; that
    name still resolves to this class (see __getattr__)."""

    status = _lib.GW_ERR_SYSTEM


class Unsupported(GradwireError, NotImplementedError):
    """GW_ERR_UNSUPPORTED: not available in this build, on this host or in this binding."""

    status = _lib.GW_ERR_UNSUPPORTED


class OutOfMemory(GradwireError, MemoryError):
    """GW_ERR_NO_MEMORY."""

    status = _lib.GW_ERR_NO_MEMORY


class Aborted(GradwireError):
    """GW_ERR_ABORTED: the communicator was aborted (Comm.abort)."""

    status = _lib.GW_ERR_ABORTED


class InternalError(GradwireError):
    """GW_ERR_INTERNAL: a bug in gradwire; please report it with the message."""

    status = _lib.GW_ERR_INTERNAL


_BY_STATUS = {
    cls.status: cls
    for cls in (InvalidArgument, TimeoutError, PeerError, SystemCallError, Unsupported,
                OutOfMemory, Aborted, InternalError)
}


def error_for(status: int, what: str = "") -> GradwireError:
    """The exception for a failed call's status, with gw_last_error()'s message (this thread)."""
    msg = _lib.lib.gw_last_error().decode(errors="replace")
    if not msg:
        msg = _lib.lib.gw_status_string(status).decode(errors="replace")
    if what and what not in msg:
        msg = f"{what}: {msg}"
    cls = _BY_STATUS.get(status, GradwireError)
    return cls(msg, status)


def check(status: int, what: str = "") -> None:
    """Raises the status's exception unless it is GW_OK."""
    if status != _lib.GW_OK:
        raise error_for(status, what)


def __getattr__(name: str) -> type:
    # The old name, kept for code written against it (`except gradwire.SystemError`), without a
    # module-level SystemError shadowing the builtin here or in a star import.
    if name == "SystemError":
        return SystemCallError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
