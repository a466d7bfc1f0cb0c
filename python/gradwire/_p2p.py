"""Point-to-point messages of a Comm (gw_send/gw_recv/gw_isend/gw_irecv): a mixin of Comm.

The rules are the header's: tag >= 0; a receive names a rank or ANY_SOURCE; messages from one
sender to one receiver with one tag arrive in the order sent; a receive larger than the message
takes it and reports its real count, a smaller one fails (and its sender too when the message is
larger than 16 KiB); a send of at most 16 KiB completes once its bytes are handed to the transport,
a larger one once the receiver matched it (so two ranks that both send a large message first must
use isend).
"""

from __future__ import annotations

import ctypes
from typing import Any, NamedTuple, Optional

from . import _buffer, _lib
from ._request import Request
from .errors import InvalidArgument, Unsupported, check

Array = Any  # numpy.ndarray or torch.Tensor

ANY_SOURCE = _lib.GW_ANY_SOURCE


class Received(NamedTuple):
    """What a receive got: the sender's rank and the elements it sent (in the buffer's dtype)."""

    source: int
    count: int


class P2PRequest(Request):
    """A send or receive in flight (Comm.isend / Comm.irecv). After wait() or a test() that
    returned True: .source (the sender's rank; for a send this rank) and .count (elements
    moved, the message's real size)."""

    source: Optional[int] = None
    count: Optional[int] = None

    def _c_wait(self, ms: int) -> int:
        n, src = ctypes.c_size_t(0), ctypes.c_int(-1)
        st = _lib.lib.gw_wait_recv(self._handle, ms, ctypes.byref(n), ctypes.byref(src))
        if st == _lib.GW_OK:
            self.count, self.source = int(n.value), int(src.value)
        return st

    def _c_test(self, done: ctypes.c_int) -> int:
        n, src = ctypes.c_size_t(0), ctypes.c_int(-1)
        st = _lib.lib.gw_test_recv(self._handle, ctypes.byref(done), ctypes.byref(n),
                                   ctypes.byref(src))
        if st == _lib.GW_OK and done.value:
            self.count, self.source = int(n.value), int(src.value)
        return st

    def received(self, timeout: Optional[float] = None) -> Received:
        """Waits (as wait()) and returns Received(source, count)."""
        self.wait(timeout)
        return Received(int(self.source if self.source is not None else -1),
                        int(self.count or 0))


def _need_p2p() -> None:
    if not _lib.has("gw_isend"):
        raise Unsupported(f"send/recv: the loaded libgradwire.so ({_lib.version}, {_lib.path}) "
                          "has no point-to-point calls; rebuild it from a newer gradwire")


class PointToPoint:
    """send, recv, isend, irecv of Comm (it supplies handle, size, rank and _pending)."""

    handle: ctypes.c_void_p
    size: int
    rank: int
    _pending: set

    def _p2p_args(self, buf: Array, peer: int, tag: int, what: str, recv: bool) -> _buffer.Buffer:
        _need_p2p()
        lowest = ANY_SOURCE if recv else 0
        if not isinstance(peer, int) or isinstance(peer, bool) or not lowest <= peer < self.size:
            extra = " nor ANY_SOURCE (-1)" if recv else ""
            raise InvalidArgument(f"{what}: peer {peer!r} is not a rank of this communicator "
                                  f"(0..{self.size - 1}){extra}")
        if not isinstance(tag, int) or isinstance(tag, bool) or tag < 0:
            raise InvalidArgument(f"{what}: tag {tag!r} must be an int >= 0")
        return _buffer.view(buf, f"{what} buf", writable=recv)

    def send(self, buf: Array, peer: int, tag: int = 0) -> None:
        """Sends buf to rank peer; returns once buf is free: at most 16 KiB, once copied out; larger,
        once peer's receive has matched it (or raises at the deadline: PeerError, TimeoutError)."""
        b = self._p2p_args(buf, peer, tag, "send", recv=False)
        check(_lib.lib.gw_send(self.handle, b.ptr, b.count, b.dtype, peer, tag), "send")

    def recv(self, buf: Array, peer: int = ANY_SOURCE, tag: int = 0) -> Received:
        """Receives a message from rank peer (default: any rank) with this tag into buf; returns
        Received(source, count). A message larger than buf raises InvalidArgument ("message
        truncated") here, and at its sender when it is larger than 16 KiB."""
        return self.irecv(buf, peer, tag).received()

    def isend(self, buf: Array, peer: int, tag: int = 0) -> P2PRequest:
        """Starts a send; buf must stay unmodified until the request is done."""
        b = self._p2p_args(buf, peer, tag, "isend", recv=False)
        return self._start(_lib.lib.gw_isend, b, buf, peer, tag, "isend")

    def irecv(self, buf: Array, peer: int = ANY_SOURCE, tag: int = 0) -> P2PRequest:
        """Starts a receive into buf (peer default: any rank); its request's source and count
        say what came once it is done."""
        b = self._p2p_args(buf, peer, tag, "irecv", recv=True)
        return self._start(_lib.lib.gw_irecv, b, buf, peer, tag, "irecv")

    def _start(self, fn: Any, b: _buffer.Buffer, buf: Array, peer: int, tag: int,
               what: str) -> P2PRequest:
        h = ctypes.c_void_p()
        check(fn(self.handle, b.ptr, b.count, b.dtype, peer, tag, ctypes.byref(h)), what)
        req = P2PRequest(self, h, [b], buf, what)  # type: ignore[arg-type]
        self._pending.add(req)
        return req

