"""Free TCP ports for a rendezvous, chosen below the kernel's ephemeral range.

A port found free by binding port 0 comes from the ephemeral range (net.ipv4.ip_local_port_range),
where any connection the host opens may take it as its local port before the rendezvous server
binds it, which then fails with "Address already in use" (seen in CI: torch's TCPStore on a
MASTER_PORT that gradwire-run had found free, beside tests opening thousands of connections).
Ports below that range are taken only by explicit binds, so they are drawn at random there and
checked by binding; where the range leaves no room below it, the kernel's choice is used."""

from __future__ import annotations

import random
import socket

_LOWEST = 10000  # below: well-known and registered services


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (32768-60999 if unreadable)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(n: int, host: str = "") -> list[int]:
    """n distinct TCP ports free on `host` (all interfaces by default) at the time of the call,
    below the ephemeral range where it leaves room (see the module's docstring)."""
    lo, _ = ephemeral_range()
    ports: list[int] = []
    socks: list[socket.socket] = []
    try:
        if lo - 1 - _LOWEST >= 1000:
            rng = random.SystemRandom()
            for _ in range(100 * n):
                if len(ports) == n:
                    break
                p = rng.randint(_LOWEST, lo - 1)
                if p in ports:
                    continue
                s = socket.socket()
                try:
                    s.bind((host, p))
                except OSError:
                    s.close()
                    continue
                socks.append(s)
                ports.append(p)
        while len(ports) < n:
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
        return ports
    finally:
        for s in socks:
            s.close()
