"""Worker: a few collectives of each kind, for the timeline test (GW_TIMELINE set by it)."""
import numpy as np

import gradwire

comm = gradwire.init()
x = np.ones(300_000, dtype=np.float32)  # several chunks: reductions are events of their own
for _ in range(3):
    comm.allreduce(x)
comm.broadcast(x, root=0)
comm.allgather(np.ones(10, dtype=np.float32))
comm.iallreduce(x).wait()
g = np.ones(4096, dtype=np.float32)
comm.allreduce_compressed(g, "topk:0.1", key="g")
print(f"rank {comm.rank}: timeline worker ok", flush=True)
comm.close()
