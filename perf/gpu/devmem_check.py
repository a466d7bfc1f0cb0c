"""The C ABI against real CUDA memory, on a GPU host, run by perf/gpu/run_gpu_check.sh --devmem
under the launcher (2 ranks), once in direct mode and once in daemon mode (GW_DAEMON set):

- direct mode: the plain collectives take device memory (cudaMalloc'd torch tensors), staged
  through page-locked host memory: allreduce (in place and not), broadcast, allgather,
  reduce_scatter, alltoall, iallreduce, send/recv, results equal to the same calls on host
  tensors; a registered buffer, and one freed and reallocated at the same address between calls;
  gw_comm_describe says "staged";
- daemon mode: the plain collectives refuse device memory with GW_ERR_UNSUPPORTED naming the
  argument, instead of reading it with the CPU;
- managed memory (cuMemAllocManaged) passes and is reduced correctly;
- gw_allreduce_compressed takes device memory in direct mode (exact result for fp16 of small
  integers) and refuses it in daemon mode with the daemon's reason.

Prints "devmem ok (MODE)" per rank, or raises.
"""
import ctypes
import os

import torch

import gradwire
from gradwire import _lib
from gradwire.errors import Unsupported, check

mode = "daemon" if os.environ.get("GW_DAEMON", "").startswith("unix:") else "direct"
comm = gradwire.init()
r, n = comm.rank, comm.size
torch.cuda.set_device(0)
lib = _lib.lib
F32 = _lib.GW_FLOAT32


def refused(status, what, needle):
    try:
        check(status, what)
    except Unsupported as e:
        assert needle in str(e), f"{what}: refused, but the message lacks {needle!r}: {e}"
        return str(e)
    raise AssertionError(f"{what}: status {status}, expected a refusal (GW_ERR_UNSUPPORTED)")


# 1. device memory: staged in direct mode, refused in daemon mode
dev = torch.full((4096,), float(r + 1), device="cuda")
p = ctypes.c_void_p(dev.data_ptr())
msg = "staged"
if mode == "daemon":
    msg = refused(lib.gw_allreduce(comm.handle, p, p, 4096, F32, _lib.GW_SUM), "gw_allreduce",
                  "CUDA device memory")
    refused(lib.gw_broadcast(comm.handle, p, 4096, F32, 0), "gw_broadcast", "CUDA device memory")
    assert torch.equal(dev.cpu(), torch.full((4096,), float(r + 1))), "refused call touched it"
else:
    def ptr(t):
        return ctypes.c_void_p(t.data_ptr())

    def both(fn, send_len, recv_len):
        """fn(send, recv) on host tensors and on device tensors; the outputs must be equal."""
        g = torch.Generator().manual_seed(1234 + r)
        src = torch.randint(-50, 50, (send_len,), generator=g).float()
        outs = []
        for device in ("cpu", "cuda"):
            s_t = src.to(device)
            r_t = torch.full((recv_len,), -7.0, device=device)
            torch.cuda.synchronize()
            check(fn(s_t, r_t), f"{fn.__name__} on {device}")
            outs.append(r_t.cpu())
        assert torch.equal(outs[0], outs[1]), (fn.__name__, outs[0][:4], outs[1][:4])

    N = (1 << 20) + 3
    lh = comm.handle
    both(lambda s_, r_: lib.gw_allreduce(lh, ptr(s_), ptr(r_), N, F32, _lib.GW_SUM), N, N)
    both(lambda s_, r_: lib.gw_allgather(lh, ptr(s_), ptr(r_), N, F32), N, N * n)
    both(lambda s_, r_: lib.gw_reduce_scatter(lh, ptr(s_), ptr(r_), N, F32, _lib.GW_SUM), N * n, N)
    both(lambda s_, r_: lib.gw_alltoall(lh, ptr(s_), ptr(r_), N, F32), N * n, N * n)

    def bcast(s_, r_):
        r_.copy_(s_)
        torch.cuda.synchronize()
        return lib.gw_broadcast(lh, ptr(r_), N, F32, n - 1)
    both(bcast, N, N)

    def iallreduce(s_, r_):
        req = _lib.request_t()
        st = lib.gw_iallreduce(lh, ptr(s_), ptr(r_), N, F32, _lib.GW_MAX, ctypes.byref(req))
        return st if st != 0 else lib.gw_wait(req, -1)
    both(iallreduce, N, N)

    def sendrecv(s_, r_):
        if r == 0:
            st = lib.gw_send(lh, ptr(s_), N, F32, 1 % n, 5)
            return st if st != 0 else lib.gw_recv(lh, ptr(r_), N, F32, (n - 1) % n, 5)
        st = lib.gw_recv(lh, ptr(r_), N, F32, r - 1, 5)
        return st if st != 0 else lib.gw_send(lh, ptr(s_), N, F32, (r + 1) % n, 5)
    both(sendrecv, N, N)

    # In place, registered, then freed and reallocated (the caching allocator is bypassed so
    # that cudaFree really frees; cudaMalloc of the same size usually returns the same address).
    nbytes = N * 4
    h = ctypes.c_void_p()
    a = torch.cuda.caching_allocator_alloc(nbytes)
    check(lib.gw_mem_register(lh, ctypes.c_void_p(a), nbytes, ctypes.byref(h)), "gw_mem_register")
    for rnd in range(2):
        host_in = torch.full((N,), float(r + 1 + rnd))
        cuda = ctypes.CDLL("libcuda.so.1")
        assert cuda.cuMemcpyHtoD_v2(ctypes.c_uint64(a), ctypes.c_void_p(host_in.data_ptr()),
                                    ctypes.c_size_t(nbytes)) == 0
        check(lib.gw_allreduce(lh, ctypes.c_void_p(a), ctypes.c_void_p(a), N, F32, _lib.GW_SUM),
              "gw_allreduce registered")
        out = torch.empty(N)
        assert cuda.cuMemcpyDtoH_v2(ctypes.c_void_p(out.data_ptr()), ctypes.c_uint64(a),
                                    ctypes.c_size_t(nbytes)) == 0
        want_sum = sum(k + 1 + rnd for k in range(n))
        assert torch.equal(out, torch.full((N,), float(want_sum))), (rnd, out[:4])
        if rnd == 0:
            torch.cuda.caching_allocator_delete(a)
            torch.cuda.empty_cache()
            a = torch.cuda.caching_allocator_alloc(nbytes)
    check(lib.gw_mem_deregister(lh, h), "gw_mem_deregister")
    torch.cuda.caching_allocator_delete(a)
    desc = ctypes.create_string_buffer(512)
    lib.gw_comm_describe.argtypes = [_lib.comm_t, ctypes.c_char_p, ctypes.c_void_p,
                                     ctypes.c_size_t, ctypes.c_void_p]
    check(lib.gw_comm_describe(lh, b"device_memory", desc, 512, None), "gw_comm_describe")
    assert desc.value.startswith(b"staged through"), desc.value
    msg = desc.value.decode()
    check(lib.gw_comm_describe(lh, b"device_memory_stats", desc, 512, None), "describe stats")
    msg += "; " + desc.value.decode()

# 2. managed memory: passes and is reduced
cuda = ctypes.CDLL("libcuda.so.1")
mp = ctypes.c_void_p()
nbytes = 4096 * 4
res = cuda.cuMemAllocManaged(ctypes.byref(mp), ctypes.c_size_t(nbytes), ctypes.c_uint(1))
assert res == 0, f"cuMemAllocManaged: CUresult {res}"
arr = (ctypes.c_float * 4096).from_address(mp.value)
for i in range(4096):
    arr[i] = float(r + 1)
check(lib.gw_allreduce(comm.handle, mp, mp, 4096, F32, _lib.GW_SUM), "gw_allreduce managed")
want = n * (n + 1) / 2
assert all(arr[i] == want for i in range(0, 4096, 97)), (arr[0], want)
cuda.cuMemFree_v2(mp)

# 3. the compressed allreduce on device memory
g = torch.full((1 << 16,), float(r + 1), device="cuda")
st = lib.gw_allreduce_compressed(comm.handle, ctypes.c_void_p(g.data_ptr()), g.numel(), F32,
                                 b"fp16", b"devmem.fp16")
if mode == "direct":
    check(st, "gw_allreduce_compressed on device memory")
    torch.cuda.synchronize()
    assert torch.equal(g.cpu(), torch.full((1 << 16,), want)), g[:4]
else:
    refused(st, "gw_allreduce_compressed", "daemon mode")
print(f"rank {r}: devmem ok ({mode}; torch {torch.__version__}, "
      f"{torch.cuda.get_device_name(0)}): {msg}", flush=True)
comm.close()
