"""The rendezvous over torch.distributed's own store: rank 0 hosts gradwire's store on a free
port and publishes its address and a job token there, so nothing beyond what torch already needs
(MASTER_ADDR/MASTER_PORT or an init_method) has to be set."""

from __future__ import annotations

import os
import secrets
from datetime import timedelta
from typing import Any, Optional

from .._ports import free_ports
from ..comm import Comm


def comm_over_store(store: Any, rank: int, size: int, timeout: Optional[timedelta] = None,
                    prefix: str = "gradwire") -> Comm:
    """A gradwire Comm for these ranks, its rendezvous arranged through a torch.distributed Store.

    Collective over the ranks. Rank 0 hosts gradwire's store on a free port of MASTER_ADDR (else
    127.0.0.1; GW_STORE_HOST overrides) and publishes the address and a job token."""
    timeout_ms = 0
    if timeout is not None and "GW_TIMEOUT_MS" not in os.environ:
        timeout_ms = max(1, int(timeout.total_seconds() * 1000))
    if size == 1:
        return Comm(0, 1, store_addr=None, timeout_ms=timeout_ms)
    # The same store and prefix may serve again (torch 2.x re-creating a group after
    # destroy_process_group on torchrun's lasting store): each rendezvous takes keys of its own
    # generation, counted by every rank joining (all `size` joins of one precede any of the next,
    # since the Comm they make is collective), so no rank reads a previous one's address.
    # Counted per world size: torch may reuse a group's name (the prefix) for another size.
    generation = (store.add(f"{prefix}/joins/{size}", 1) - 1) // size
    key = f"{prefix}/{size}/{generation}"
    if rank == 0:
        host = os.environ.get("GW_STORE_HOST") or os.environ.get("MASTER_ADDR") or "127.0.0.1"
        addr = f"{host}:{free_ports(1)[0]}"
        token = secrets.token_hex(16)
        store.set(f"{key}/addr", addr)
        store.set(f"{key}/token", token)
    else:
        addr = store.get(f"{key}/addr").decode()
        token = store.get(f"{key}/token").decode()
    return Comm(rank, size, store_addr=addr, job_token=token, timeout_ms=timeout_ms)
