"""Worker: DDP on the gradwire backend; the last rank dies (SIGKILL) at step 3 and the others must
raise (not hang) within GW_TIMEOUT_MS. Prints "raised <exception> after <s> s" on survivors.
With the argument "sync", the ranks run synchronous dist.broadcast calls from the last rank
instead of DDP: the call itself (work.wait() inside torch) must raise, not return with the
tensor unchanged."""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import gradwire.torch  # noqa: F401

dist.init_process_group("gradwire")
r, n = dist.get_rank(), dist.get_world_size()
sync = sys.argv[1:] == ["sync"]
model = torch.nn.Linear(64, 64)
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
t0 = None
try:
    for step in range(8 if sync else 1000):
        if step == 3:
            if r == n - 1:
                os.kill(os.getpid(), signal.SIGKILL)
            t0 = time.monotonic()
        if sync:
            t = torch.full((4,), float(step)) if r == n - 1 else torch.zeros(4)
            dist.broadcast(t, src=n - 1)
            assert torch.all(t == step), t
            continue
        loss = ddp(torch.randn(8, 64)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
except Exception as e:  # noqa: BLE001
    print(f"rank {r}: raised {type(e).__name__} after {time.monotonic() - t0:.1f} s: {e}",
          flush=True)
    os._exit(0)  # the process group cannot be torn down cleanly any more
print(f"rank {r}: finished without an error", flush=True)
sys.exit(1)
