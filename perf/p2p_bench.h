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
  // perftest's server/client form across hosts (no --np, no launcher, a transport other than
  // shm): without peer_host this process is the server (hosts the rendezvous on `port`, waits
  // for a client until the timeout, receives); with it, the client (connects to peer_host:port,
  // sends, prints and writes the JSON).
  std::string peer_host;
  int port = 18515;            // perftest's default port
  uint64_t size = 0;           // -s: one size (min = max = size); 0: min_bytes..max_bytes
  bool all_sizes = false;      // -a: 2 B .. 8 MiB, factor 2 (perftest's -a)
  double duration_s = 0;       // -D: stream each size this long (0: --iters messages)
  bool report_gbits = false;   // --report_gbits: bandwidth in Gb/s
  bool bidirectional = false;  // -b: both ranks stream at once; BW is the sum of both ways
  bool capi = false;           // --capi: the C ABI's calls (p2p_capi.cc), not the transport
};

// Bandwidth iterations for one size when --iters is not given: clamp(2e9 / size, 20, 1000).
int p2p_adaptive_iters(uint64_t bytes);

Status validate(const P2pConfig& config);
// -s and -a applied to min_bytes, max_bytes and factor.
P2pConfig resolve_sizes(P2pConfig config);

// Returns the exit status (0 ok, 2 error). Under a launcher only rank 0 prints and writes the
// JSON file; every wait (store, connect, each request) ends at the timeout.
int run_p2p(const P2pConfig& config);
// --capi: both ranks forked here (or a launcher's 2 ranks), over the C ABI: gw_isend/gw_irecv
// bandwidth with a window, gw_send/gw_recv ping-pong latency (perf/p2p_capi.cc).
int run_p2p_capi(const P2pConfig& config);

}  // namespace gw::perf
