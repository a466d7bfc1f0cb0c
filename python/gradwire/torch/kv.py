"""PSOptimizer: train any torch model through gradwire's parameter server with one changed line.

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = gradwire.torch.kv.PSOptimizer(opt, model.named_parameters(), mode="ssp:2")
    ...  loss.backward(); opt.step()   # as before

Every parameter is one key of a gradwire.kv.KVStore (keys 0..n-1 in named_parameters' order,
names checked alike on every worker). step():

- update="sum" (the default), the wrapped optimizer steps on the workers, so every optimizer works:
  under bsp and sync:K the servers sum each clock's gradients (push_pull), and step() divides the
  sum by the workers that contributed (N; K) before the local step, so that every worker applies
  the same mean gradient; under ssp and asp (where the servers add every push to the value) the
  servers hold the parameters: the worker steps locally, pushes the change it made, closes the
  clock and pulls the parameters. Under sync:K a straggler whose pushes were dropped still steps
  on the clock's sum, so its copy drifts from the others': prefer a server update there.
- update="server" or "sgd:LR[,momentum=M]": the servers own the parameters and run SGD on them
  (the mean of the clock's pushes under bsp and sync:K, each push as it comes under ssp and asp).
  step() pushes the gradients, closes the clock and pulls the parameters; the wrapped optimizer
  is not stepped ("server" takes lr and momentum from a torch.optim.SGD).

Then it closes this worker's clock (KVStore.clock). What each pull may return is the mode's rule
(docs/parameter-server.md). Tensors may live on any device: they are staged through CPU buffers.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

import gradwire
from gradwire import kv as _kv


class PSOptimizer:
    """Wraps optimizer so that step() goes through a parameter-server store (see the module).

    named_parameters: model.named_parameters() (or None: the optimizer's parameters, unnamed).
    kv: an existing gradwire.kv.KVStore (its mode and update rule are used); otherwise one is
    made on comm (default: gradwire.init() from the launcher's environment) with mode, update,
    codec and partition_bytes. zero_grad, param_groups, state_dict and the rest are the wrapped
    optimizer's (give an LR scheduler the wrapped optimizer).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters: Any = None,
                 kv: Optional[_kv.KVStore] = None, *, mode: str = "bsp", update: str = "sum",
                 codec: Optional[str] = None, partition_bytes: Optional[int] = None,
                 comm: Optional[gradwire.Comm] = None, key_offset: int = 0) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"PSOptimizer wraps a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        self.optimizer = optimizer
        params = [p for g in optimizer.param_groups for p in g["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(x, tuple) or len(x) != 2 for x in named):
                raise ValueError("named_parameters should be a sequence of (name, parameter), "
                                 "usually model.named_parameters()")
            by_id = {id(p): n for n, p in named}
            missing = [i for i, p in enumerate(params) if id(p) not in by_id]
            if missing:
                raise ValueError(f"named_parameters lacks {len(missing)} of the optimizer's "
                                 "parameters")
            self.names = [by_id[id(p)] for p in params]
        else:
            self.names = [f"param{i}" for i in range(len(params))]
        self.params = params
        if isinstance(update, str) and update.strip().lower() == "server":
            update = self._server_update(optimizer)
        self._owns_comm = kv is None and comm is None
        self._owns_kv = kv is None
        if kv is None:
            comm = comm if comm is not None else gradwire.init()
            kv = _kv.KVStore(comm, mode=mode, update=update, codec=codec,
                             partition_bytes=partition_bytes)
        self.kv = kv
        self.comm = kv.comm
        m, _, k = _kv.parse_mode(kv.mode)
        self.server_sgd = kv.update.startswith("sgd")
        # The servers hold the parameters with sgd, and with sum where they add every push.
        self.server_owns_params = self.server_sgd or m in (gradwire._lib.GW_KV_SSP,
                                                           gradwire._lib.GW_KV_ASP)
        self._divisor = float(k if m == gradwire._lib.GW_KV_SYNC else self.comm.size)
        self._keys = [key_offset + i for i in range(len(params))]
        self._check_names()
        # One CPU buffer per parameter: gradients go out of it, the pulled values come into it.
        self._bufs = [torch.empty(p.numel(), dtype=p.dtype) for p in params]
        with torch.no_grad():
            for key, p, b in zip(self._keys, params, self._bufs):
                b.copy_(p.detach().reshape(-1))
                self.comm.broadcast(b, root=0)  # every worker starts from rank 0's model
                p.copy_(b.view_as(p))
                if not self.server_owns_params:
                    b.zero_()  # the values are the clocks' gradient sums
                self.kv.init(key, b)
        self.steps = 0

    @staticmethod
    def _server_update(optimizer: torch.optim.Optimizer) -> str:
        if not isinstance(optimizer, torch.optim.SGD):
            raise ValueError("update='server' takes lr and momentum from a torch.optim.SGD; "
                             f"give update='sgd:LR,momentum=M' for a {type(optimizer).__name__}")
        g = optimizer.param_groups[0]
        if g.get("weight_decay", 0) or g.get("nesterov", False):
            raise ValueError("update='server': the servers' SGD has no weight_decay or nesterov")
        return f"sgd:{g['lr']!r},momentum={g.get('momentum', 0.0)!r}"

    def _check_names(self) -> None:
        # Every worker must map the same names to the same keys: compare a checksum of the names
        # and sizes with rank 0's.
        import zlib

        text = ";".join(f"{n}:{p.numel()}:{p.dtype}" for n, p in zip(self.names, self.params))
        mine = torch.tensor([zlib.crc32(text.encode()), len(self.params)], dtype=torch.int64)
        theirs = mine.clone()
        self.comm.broadcast(theirs, root=0)
        if not torch.equal(mine, theirs):
            raise ValueError(f"PSOptimizer: rank {self.comm.rank}'s parameters (names, sizes, "
                             "dtypes) differ from rank 0's")

    # ---- the step ---------------------------------------------------------------------------
    def step(self, closure: Any = None) -> Any:
        """Pushes the gradients, closes the clock and takes the new parameters (see the module)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        n = len(self.params)
        with torch.no_grad():
            # The first layers first (forward needs them first), as BytePS orders by priority.
            if self.server_owns_params and not self.server_sgd:
                # ssp/asp with sum: push the change the local step made to the parameters.
                for b, p in zip(self._bufs, self.params):
                    b.copy_(p.detach().reshape(-1))
                self.optimizer.step()
                for b, p in zip(self._bufs, self.params):
                    torch.sub(p.detach().reshape(-1).cpu(), b, out=b)
            else:
                for b, p in zip(self._bufs, self.params):
                    if p.grad is None:
                        b.zero_()
                    else:
                        b.copy_(p.grad.detach().reshape(-1))
            if self.server_owns_params:
                reqs = [self.kv.ipush(k, b, priority=n - i)
                        for i, (k, b) in enumerate(zip(self._keys, self._bufs))]
                for r in reqs:
                    r.wait()
                self.kv.clock()
                reqs = [self.kv.ipull(k, b, priority=n - i)
                        for i, (k, b) in enumerate(zip(self._keys, self._bufs))]
                for r in reqs:
                    r.wait()
                for b, p in zip(self._bufs, self.params):
                    p.copy_(b.view_as(p))
            else:
                reqs = [self.kv.ipushpull(k, b, priority=n - i)
                        for i, (k, b) in enumerate(zip(self._keys, self._bufs))]
                for r in reqs:
                    r.wait()
                self.kv.clock()
                for b, p in zip(self._bufs, self.params):
                    g = b.view_as(p).div(self._divisor).to(p.device)
                    if p.grad is None:
                        p.grad = g
                    else:
                        p.grad.copy_(g)
                self.optimizer.step()
        self.steps += 1
        return loss

    def stats(self) -> _kv.KVStats:
        return self.kv.stats()

    def close(self) -> None:
        """Destroys the store (and the communicator) this wrapper made; the servers then count
        this worker as finished."""
        if self._owns_kv:
            self.kv.close()
        if self._owns_comm:
            self.comm.close()

    # ---- the wrapped optimizer --------------------------------------------------------------
    def zero_grad(self, *args: Any, **kwargs: Any) -> Any:
        return self.optimizer.zero_grad(*args, **kwargs)

    @property
    def param_groups(self) -> list:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)

    def __getattr__(self, name: str) -> Any:
        if name == "optimizer":
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def __repr__(self) -> str:
        return f"PSOptimizer({self.kv!r}, {self.optimizer!r})"
