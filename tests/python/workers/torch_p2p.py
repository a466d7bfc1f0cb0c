"""Worker: point-to-point on the gradwire torch backend (send, recv, recv from any source, isend,
irecv, batch_isend_irecv, Work objects), checked on each rank; any world size >= 2."""
import time

import torch
import torch.distributed as dist

import gradwire
import gradwire.torch  # noqa: F401 (registers the backend)

dist.init_process_group("gradwire")
r, n = dist.get_rank(), dist.get_world_size()
nxt, prv = (r + 1) % n, (r - 1) % n

# A ring with isend/irecv: every rank sends first (a blocking send would wait for its receiver).
send = torch.arange(5, dtype=torch.float32) + 100 * r
got = torch.zeros(5)
ws = dist.isend(send, nxt, tag=1)
wr = dist.irecv(got, prv, tag=1)
wr.wait()
ws.wait()
assert torch.equal(got, torch.arange(5, dtype=torch.float32) + 100 * prv), got
assert wr.is_completed() and ws.is_completed() and wr.exception() is None

# Blocking send / recv, rank 0 and the last; any dtype moves as bytes.
for dt in (torch.float64, torch.int8, torch.bool, torch.complex64, torch.bfloat16):
    want = (torch.arange(6) % 2 == 1) if dt == torch.bool else (torch.arange(6) * 3).to(dt)
    if r == 0:
        dist.send(want, n - 1, tag=2)
    elif r == n - 1:
        t = torch.zeros(6, dtype=dt)
        assert dist.recv(t, 0, tag=2) == 0
        assert torch.equal(t, want), (dt, t)

# Receive from any source: rank 0 gets one message from every other rank, and recv returns who
# sent each (the source torch expects); messages of one sender with one tag keep their order.
if r == 0:
    seen = []
    for _ in range(2 * (n - 1)):
        t = torch.zeros(2, dtype=torch.int64)
        src = dist.recv(t, tag=5)
        assert t[0].item() == src, (t, src)
        seen.append((src, t[1].item()))
    for s in range(1, n):
        assert [k for src, k in seen if src == s] == [0, 1], seen
    w = dist.irecv(torch.zeros(1), tag=6)  # irecv from any source
    w.wait()
    assert w._source_rank() == n - 1, w._source_rank()
else:
    dist.send(torch.tensor([r, 0]), 0, tag=5)
    dist.send(torch.tensor([r, 1]), 0, tag=5)
    if r == n - 1:
        dist.send(torch.ones(1), 0, tag=6)

# Tags: two messages to one rank received in the other order of their tags.
if r == 0:
    a, b = dist.isend(torch.full((3,), 1.0), nxt, tag=10), dist.isend(torch.full((3,), 2.0), nxt,
                                                                          tag=11)
    a.wait(), b.wait()
elif r == 1:
    t11, t10 = torch.zeros(3), torch.zeros(3)
    dist.recv(t11, 0, tag=11)
    dist.recv(t10, 0, tag=10)
    assert torch.all(t10 == 1) and torch.all(t11 == 2), (t10, t11)

# Self send.
w = dist.isend(torch.full((2,), 7.0), r, tag=20)
t = torch.zeros(2)
dist.recv(t, r, tag=20)
w.wait()
assert torch.all(t == 7), t

# batch_isend_irecv: both neighbours at once.
outs = [torch.zeros(4), torch.zeros(4)]
ops = [dist.P2POp(dist.isend, torch.full((4,), float(r)), nxt, tag=30),
       dist.P2POp(dist.isend, torch.full((4,), float(r)), prv, tag=31),
       dist.P2POp(dist.irecv, outs[0], prv, tag=30),
       dist.P2POp(dist.irecv, outs[1], nxt, tag=31)]
for w in dist.batch_isend_irecv(ops):
    w.wait()
assert torch.all(outs[0] == prv) and torch.all(outs[1] == nxt), outs

# Interleaved with collectives: a receive posted before an all_reduce, its send after it.
t = torch.zeros(3)
wr = dist.irecv(t, prv, tag=40)
s = torch.ones(2)
dist.all_reduce(s)
dist.send(torch.full((3,), float(r + 1)), nxt, tag=40)
wr.wait()
assert torch.all(s == n) and torch.all(t == prv + 1), (s, t)

# is_completed() polls; get_future() completes.
t = torch.zeros(1)
wr = dist.irecv(t, prv, tag=50)
assert not wr.is_completed()
fut = wr.get_future()
time.sleep(0.2)
dist.send(torch.full((1,), 3.0), nxt, tag=50)
fut.wait()
assert wr.is_completed() and t.item() == 3.0

# A receive smaller than the message fails on both sides, with the sizes (a message past the eager
# size, 16 KiB: a smaller one fails only the receive).
if r == 0:
    try:
        dist.send(torch.zeros(8192), nxt, tag=60)
    except gradwire.InvalidArgument as e:
        assert "truncated" in str(e), e
    else:
        raise AssertionError("a send into a smaller receive did not raise")
elif r == 1:
    try:
        dist.recv(torch.zeros(2), 0, tag=60)
    except gradwire.InvalidArgument as e:
        assert "truncated" in str(e), e
    else:
        raise AssertionError("a receive smaller than the message did not raise")
# Bad arguments are refused at the call.
for call in (lambda: dist.send(torch.zeros(1), nxt, tag=-1),
             lambda: dist.send(torch.zeros(4)[::2], nxt)):
    try:
        call()
    except (ValueError, RuntimeError):
        pass
    else:
        raise AssertionError("a bad send was not refused")
dist.barrier()
print(f"torch p2p ok {r}")
