// One rank of gradwire-perf's point-to-point test: how the two ranks find each other (a forked
// pair's socketpair, a launcher's store, or the server/client form) and the rank itself, which
// connects over the chosen transport, measures bandwidth and latency and emits its result lines.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/store.h"
#include "perf/p2p_bench.h"

namespace gw::perf {

// How the two ranks of a run find each other and where rank 0's results go.
struct P2pSetup {
  int rank = 0;
  // Forked: a socketpair to the other rank for the handle exchange. Launcher: the job's store.
  int pair_fd = -1;
  Store* store = nullptr;
  std::string token;    // job token of the transport handshakes
  std::string host_id;  // TransportOptions::host_id
  // TransportOptions::route_host: the other host as this rank reaches it (the store's host, the
  // server's name, the client's address), so tcp takes the interface that routes there.
  std::string route_host;
  std::string origin;   // for the header: "2 forked processes" or the launcher's name
  bool server = false;  // the p2p server of the server/client form (prints its interfaces)
  // Takes every result line ("config {...}", "bw {...}", "lat {...}", "error \"...\"").
  std::function<void(const std::string& line)> emit;
};

// Runs one rank of the test `c` as `setup` says, every wait bounded by timeout_ms. Returns the
// exit status: 0 ok, 2 error (also emitted as an "error" line and printed on stderr).
int run_p2p_rank(const P2pConfig& c, P2pSetup setup, int64_t timeout_ms);

}  // namespace gw::perf
