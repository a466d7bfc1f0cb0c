"""The C ABI against real CUDA memory, on a GPU host, run by perf/gpu/run_gpu_check.sh --devmem
under the launcher (2 ranks), once in direct mode and once in daemon mode (GW_DAEMON set):

- the plain collectives refuse device memory (a cudaMalloc'd torch tensor's pointer passed to
  gw_allreduce) with GW_ERR_UNSUPPORTED naming the argument, instead of reading it with the CPU;
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


# 1. device memory: refused by the plain collectives
dev = torch.full((4096,), float(r + 1), device="cuda")
p = ctypes.c_void_p(dev.data_ptr())
msg = refused(lib.gw_allreduce(comm.handle, p, p, 4096, F32, _lib.GW_SUM), "gw_allreduce",
              "CUDA device memory")
refused(lib.gw_broadcast(comm.handle, p, 4096, F32, 0), "gw_broadcast", "CUDA device memory")
assert torch.equal(dev.cpu(), torch.full((4096,), float(r + 1))), "refused call touched the buffer"

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
