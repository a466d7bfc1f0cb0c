"""Worker: the last rank sleeps SLEEP seconds before an allreduce; the others wait in it (the test
reads their stall warnings from stderr)."""
import sys
import time

import numpy as np

import gradwire

sleep_s = float(sys.argv[1])
comm = gradwire.init()
x = np.ones(1000, dtype=np.float32)
comm.allreduce(x)  # connected and in step
if comm.rank == comm.size - 1:
    time.sleep(sleep_s)
print(f"rank {comm.rank}: entering at {time.time():.3f}", flush=True)
comm.allreduce(x)
assert (x == comm.size ** 2).all()
print(f"rank {comm.rank}: stall done", flush=True)
comm.close()
