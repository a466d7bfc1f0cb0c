"""Worker: every supported torch.distributed call on the gradwire backend, checked on each rank."""
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import gradwire
import gradwire.torch  # noqa: F401 (registers the backend)

dist.init_process_group("gradwire")
r, n = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() == "gradwire", dist.get_backend()


def raises(call, exc, text: str, what: str) -> None:
    """call() must raise exc with text in its message."""
    try:
        call()
    except exc as e:
        assert text in str(e), e
    else:
        raise AssertionError(f"{what} did not raise")


t = torch.full((5,), float(r + 1))
dist.all_reduce(t)
assert torch.equal(t, torch.full((5,), n * (n + 1) / 2)), t
for op, want in ((dist.ReduceOp.MAX, n), (dist.ReduceOp.MIN, 1), (dist.ReduceOp.PRODUCT,
                 float(torch.arange(1, n + 1).prod()))):
    t = torch.full((3,), float(r + 1), dtype=torch.float64)
    dist.all_reduce(t, op=op)
    assert torch.all(t == want), (op, t)
t = torch.full((4,), r + 1, dtype=torch.int64)
w = dist.all_reduce(t, async_op=True)
w.wait()
assert torch.all(t == n * (n + 1) // 2), t

t = torch.arange(6, dtype=torch.float32) if r == n - 1 else torch.zeros(6)
dist.broadcast(t, src=n - 1)
assert torch.equal(t, torch.arange(6, dtype=torch.float32)), t

outs = [torch.zeros(2, 2) for _ in range(n)]
dist.all_gather(outs, torch.full((2, 2), float(r)))
assert all(torch.all(o == i) for i, o in enumerate(outs)), outs
out = torch.zeros(n * 3, dtype=torch.bfloat16)
dist._all_gather_base(out, torch.full((3,), float(r), dtype=torch.bfloat16))
assert torch.equal(out, torch.arange(n).repeat_interleave(3).to(torch.bfloat16)), out

ins = [torch.full((3,), float(j + r)) for j in range(n)]
o = torch.zeros(3)
dist.reduce_scatter(o, ins)
want = float(sum(rr + r for rr in range(n)))  # block r on rank rr holds r + rr
assert torch.all(o == want), (o, want)

ins = [torch.full((2,), float(r * 10 + j)) for j in range(n)]
outs = [torch.zeros(2) for _ in range(n)]
dist.all_to_all(outs, ins)
assert all(torch.all(o == j * 10 + r) for j, o in enumerate(outs)), outs
src = torch.arange(n * 2, dtype=torch.float32) + 100 * r
dst = torch.zeros(n * 2)
dist.all_to_all_single(dst, src)
assert torch.equal(dst, torch.tensor([100.0 * j + 2 * r + k for j in range(n) for k in range(2)]))

t = torch.full((2,), float(r + 1))
dist.reduce(t, dst=0)
assert (r != 0) or torch.all(t == n * (n + 1) / 2), t
assert (r == 0) or torch.all(t == r + 1), t

dist.barrier()

# Byte-moving ops take any dtype (their bytes are moved); reductions refuse what gradwire cannot
# reduce, at the call, before anything is queued.
for dt in (torch.int8, torch.int16, torch.bool, torch.complex64):
    want = (torch.arange(6) % 2 == 1) if dt == torch.bool else torch.arange(6).to(dt) * 3
    t = want.clone() if r == n - 1 else torch.zeros(6, dtype=dt)
    dist.broadcast(t, src=n - 1)
    assert torch.equal(t, want), (dt, t)
    outs = [torch.zeros(6, dtype=dt) for _ in range(n)]
    dist.all_gather(outs, want if r == 0 else want.flip(0))
    assert torch.equal(outs[0], want) and all(torch.equal(o, want.flip(0)) for o in outs[1:]), dt
    if dt == torch.complex64:  # torch reduces it as its float32 view itself
        t = torch.ones(2, dtype=dt) * (1 + 2j)
        dist.all_reduce(t)
        assert torch.all(t == n * (1 + 2j)), t
        continue
    try:
        dist.all_reduce(torch.ones(2, dtype=dt))
    except ValueError as e:  # gradwire.InvalidArgument
        assert "not supported" in str(e), e
    else:
        raise AssertionError(f"all_reduce of {dt} did not raise")

# Unsupported calls raise, never a wrong result (uneven splits: only where the library has no
# gw_alltoallv; send/recv: workers/torch_p2p.py).
unsupported = [lambda: dist.all_reduce(torch.ones(1, dtype=torch.int32), op=dist.ReduceOp.BAND)]
if not gradwire.has_collective("alltoallv"):
    unsupported.append(lambda: dist.all_to_all_single(torch.zeros(n + 1), torch.zeros(n + 1),
                                                      [1] * (n - 1) + [2], [1] * (n - 1) + [2]))
for call in unsupported:
    try:
        call()
    except RuntimeError as e:
        assert "not supported" in str(e) or "gradwire" in str(e), e
    else:
        raise AssertionError("an unsupported call did not raise")

# Equal splits that do not split dim 0 over the ranks are refused (gloo refuses them too), not
# re-split by element count: [2] * n on 3 * n rows would move 3 rows per peer.
try:
    dist.all_to_all_single(torch.zeros(3 * n, 1), torch.zeros(3 * n, 1), [2] * n, [2] * n)
except ValueError as e:  # gradwire.InvalidArgument
    assert "do not split dim 0" in str(e), e
else:
    raise AssertionError("all_to_all_single with splits that miss dim 0 did not raise")
out = torch.zeros(2 * n, 1)
dist.all_to_all_single(out, torch.full((2 * n, 1), float(r)), [2] * n, [2] * n)
assert torch.equal(out.flatten(), torch.tensor([float(j) for j in range(n) for _ in range(2)]))

# torch 2.x's _coalescing_manager (FSDP) calls the coalesced tensor collectives: one Work, each
# pair as all_gather_into_tensor / reduce_scatter_tensor would give it.
pg = dist.distributed_c10d._get_default_group()
ins = [torch.full((3,), float(r)), torch.arange(2, dtype=torch.float64) + 10 * r]
outs = [torch.zeros(3 * n), torch.zeros(2 * n, dtype=torch.float64)]
pg.allgather_into_tensor_coalesced(outs, ins).wait()
assert torch.equal(outs[0], torch.tensor([float(j) for j in range(n) for _ in range(3)])), outs
assert torch.equal(outs[1], torch.tensor([10.0 * j + k for j in range(n) for k in range(2)],
                                         dtype=torch.float64)), outs
ins = [torch.arange(4 * n, dtype=torch.float32) * (r + 1), torch.ones(n, dtype=torch.int64)]
outs = [torch.zeros(4), torch.zeros(1, dtype=torch.int64)]
pg.reduce_scatter_tensor_coalesced(outs, ins).wait()
tri = n * (n + 1) / 2
assert torch.equal(outs[0], torch.arange(4 * r, 4 * r + 4, dtype=torch.float32) * tri), outs
assert outs[1].item() == n, outs
try:
    pg.allgather_into_tensor_coalesced([torch.zeros(3 * n)], [torch.zeros(4)])
except ValueError as e:  # gradwire.InvalidArgument, at the call
    assert "expected" in str(e), e
else:
    raise AssertionError("a coalesced all_gather_into_tensor of the wrong size did not raise")

# torch 2.x calls shutdown() on each group destroy_process_group ends (1.13 never does): it runs
# what was queued, stops the group's worker, frees its communicator, and refuses later calls.
g2 = dist.new_group(list(range(n)), backend="gradwire")
t = torch.ones(2)
work = dist.all_reduce(t, group=g2, async_op=True)
try:
    name = g2.group_name  # torch 2.x names every group
except RuntimeError:  # 1.13 does not
    g2.setGroupName(name := "gw-g2")
assert g2.getGroupName() == name and g2.getGroupDesc() == g2.group_desc
assert g2._get_backend(torch.device("cpu")) is g2 and not g2.supports_splitting
g2.shutdown()
assert work.is_completed() and torch.all(t == n), t
g2.shutdown()  # again: nothing
assert "closed" in repr(g2.comm), repr(g2.comm)
raises(lambda: dist.all_reduce(torch.ones(2), group=g2), ValueError, "shut down",
       "a collective on a shut-down group")

# Parameters are synchronised under torch.no_grad() (grad mode is per thread: the caller's governs
# the backend's worker); without it, the in-place write to a leaf that requires grad is refused,
# and Work.wait() raises gradwire's own exception (not torch's RuntimeError around a callback).
param = torch.nn.Parameter(torch.ones(3))
with torch.no_grad():
    dist.all_reduce(param)
    dist.broadcast(param, src=n - 1)
assert torch.equal(param.detach(), torch.full((3,), float(n))), param
for call in (lambda: dist.all_reduce(param), lambda: dist.broadcast(param, src=0),
             lambda: dist.reduce(param, dst=0)):
    # refused at the call on every rank alike (root included), so no rank waits alone
    raises(call, gradwire.InvalidArgument, "leaf tensor that requires grad",
           "an in-place write to a leaf that requires grad")
dist.barrier()  # the refused calls ran on no rank's communicator

# With splits on one side only, the other side's dim 0 must divide by the ranks (as gloo checks):
# a (1, 6n) output would otherwise be cut in the middle of its one row.
raises(lambda: dist.all_to_all_single(torch.zeros(1, 6 * n), torch.zeros(2 * n, 3), [], [2] * n),
       ValueError, "has no splits", "all_to_all_single with an output dim 0 of 1")

# Work.wait(timeout): gradwire.TimeoutError when the operation has not ended by then; it goes on
# and a later wait() gets its result. The other ranks join 2 s late.
g4 = dist.new_group(list(range(n)), backend="gradwire")
t4 = torch.ones(2)
if r == 0:
    w4 = dist.all_reduce(t4, group=g4, async_op=True)
    try:
        w4.wait(timedelta(milliseconds=200))
    except gradwire.TimeoutError as e:
        assert "did not end within" in str(e), e
    else:
        raise AssertionError("Work.wait(200 ms) returned while the peers were away")
    w4.wait()
else:
    time.sleep(2.0)
    dist.all_reduce(t4, group=g4)
assert torch.all(t4 == n), t4

# shutdown() from a callback on the worker's own thread (a Work's future completing there) does
# not wait for itself, lets what was queued before it run, then frees the group's communicator;
# later calls are refused. Rank 0 registers its callback while the others are 0.5 s away, so
# there it runs on the worker.
g3 = dist.new_group(list(range(n)), backend="gradwire")
if r != 0:
    time.sleep(0.5)
w3 = dist.all_reduce(torch.ones(2), group=g3, async_op=True)
t3 = torch.ones(2)
w3b = dist.all_reduce(t3, group=g3, async_op=True)  # queued before the shutdown: it runs
shut = threading.Event()
ran_on = []
w3.get_future().then(lambda _f: (ran_on.append(threading.current_thread().name), g3.shutdown(),
                                 shut.set()))
w3.wait()
assert shut.wait(10), "shutdown from the callback did not return"
if r == 0:
    assert ran_on[0].startswith("gradwire-rank"), ran_on
w3b.wait()
assert torch.all(t3 == n), t3
deadline = time.monotonic() + 10
while "closed" not in repr(g3.comm) and time.monotonic() < deadline:
    time.sleep(0.01)
assert "closed" in repr(g3.comm), repr(g3.comm)
raises(lambda: dist.all_reduce(torch.ones(2), group=g3), ValueError, "shut down",
       "a collective on a group shut down from a callback")

# One store and prefix serving two rendezvous one after the other (torch 2.x re-creating a group
# on torchrun's lasting store): the second must not read the first's (closed) address.
again = dist.PrefixStore("gw-again", dist.distributed_c10d._get_default_store())
for i in range(2):
    c = gradwire.torch.comm_over_store(again, r, n)
    x = torch.ones(3)
    c.allreduce(x)
    assert torch.all(x == n), (i, x)
    c.close()

# An error the worker meets reaches Work.wait() as gradwire's own class (here: a group over a
# communicator its owner closed), not as torch's RuntimeError around a failed callback.
c5 = gradwire.torch.comm_over_store(again, r, n)
g5 = gradwire.torch.ProcessGroupGradwire(None, r, n, comm=c5)
c5.barrier()  # every rank is done with its init (rank 0's closing ends the store they read)
c5.close()
raises(lambda: g5.allreduce([torch.ones(2)]).wait(), gradwire.InvalidArgument, "closed",
       "a collective on a closed communicator")

# A subgroup of the even ranks runs its own communicator.
evens = list(range(0, n, 2))
g = dist.new_group(evens, backend="gradwire")
if r in evens:
    t = torch.ones(2)
    dist.all_reduce(t, group=g)
    assert torch.all(t == len(evens)), t
dist.barrier()
dist.destroy_process_group()
print(f"rank {r}: torch ops ok")
