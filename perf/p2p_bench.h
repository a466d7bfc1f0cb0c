// `gradwire-perf p2p`: point-to-point bandwidth and latency of one core/net transport between two
// ranks, below the collective layer (ib_write_bw / ib_send_lat style). The two ranks are either
// forked on this host (--np 2, or no launcher environment) or the two ranks of a job a launcher
// started, one per host (GW_RANK/GW_WORLD_SIZE/GW_STORE, torchrun, mpirun, srun).
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace gw::perf {

struct P2pConfig {
  std::string transport = "tcp";  // tcp, shm or dpdk
  uint64_t min_bytes = 1;
  uint64_t max_bytes = 64ull << 20;
  int factor = 2;
  int iters = 0;           // bandwidth iterations per size; 0: adaptive
  int window = 16;         // outstanding sends (<= gw::net::kMaxRequests)
  uint64_t lat_bytes = 8;  // ping-pong size
  int lat_iters = 1000;
  // 2: fork both ranks here. 0: one rank of a 2-rank launcher job when the environment names a
  // rank (GW_RANK, RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID), else fork both ranks here.
  int np = 0;
  std::string json_path;
  int64_t timeout_ms = 0;  // 0: GW_TIMEOUT_MS
};

// Bandwidth iterations for one size when --iters is not given: clamp(2e9 / size, 20, 1000).
int p2p_adaptive_iters(uint64_t bytes);

Status validate(const P2pConfig& config);

// Returns the exit status (0 ok, 2 error). Under a launcher only rank 0 prints and writes the
// JSON file; every wait (store, connect, each request) ends at the timeout.
int run_p2p(const P2pConfig& config);

}  // namespace gw::perf
