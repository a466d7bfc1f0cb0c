"""Worker: the last rank sleeps before an allreduce named "late.tensor" submitted through the
Horovod API; the others' Python warning names the tensor (and the library's names the rank)."""
import sys
import time

import torch

import gradwire.torch as hvd

hvd.init()
hvd.allreduce(torch.ones(4))  # in step
if hvd.rank() == hvd.size() - 1:
    time.sleep(float(sys.argv[1]))
h = hvd.allreduce_async(torch.ones(8), name="late.tensor", op=hvd.Sum)
assert torch.equal(hvd.synchronize(h), torch.full((8,), float(hvd.size())))
print(f"rank {hvd.rank()}: hvd stall done", flush=True)
