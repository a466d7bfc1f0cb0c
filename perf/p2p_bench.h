// `gradwire-perf p2p`: point-to-point bandwidth and latency of one core/net transport between two
// forked processes, below the collective layer (ib_write_bw / ib_send_lat style).
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace gw::perf {

struct P2pConfig {
  std::string transport = "tcp";  // tcp or shm
  uint64_t min_bytes = 1;
  uint64_t max_bytes = 64ull << 20;
  int factor = 2;
  int iters = 0;           // bandwidth iterations per size; 0: adaptive
  int window = 16;         // outstanding sends (<= gw::net::kMaxRequests)
  uint64_t lat_bytes = 8;  // ping-pong size
  int lat_iters = 1000;
  int np = 2;  // must be 2
  std::string json_path;
  int64_t timeout_ms = 0;  // 0: GW_TIMEOUT_MS
};

// Bandwidth iterations for one size when --iters is not given: clamp(2e9 / size, 20, 1000).
int p2p_adaptive_iters(uint64_t bytes);

Status validate(const P2pConfig& config);

// Returns the exit status (0 ok, 2 error).
int run_p2p(const P2pConfig& config);

}  // namespace gw::perf
