// Ranks as threads of this process through the C ABI (include/gradwire/gradwire.h): rank 0 hosts
// the TCP store on a fresh loopback port, each thread inits its own communicator. For tests that
// link libgradwire.so (header only: gw_test_support does not link it).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "gradwire/gradwire.h"
#include "tests/support/free_port.h"
#include "tests/support/ranks.h"

namespace gw::testing {

// "127.0.0.1:<a free port>": where rank 0 of a new group of ranks hosts the store.
inline std::string local_store_addr() { return "127.0.0.1:" + std::to_string(free_port()); }

// The config of rank r of `world` ranks as threads, on the store at addr (addr and token must
// outlive gw_comm_init; token NULL: GW_JOB_TOKEN or generated).
inline gw_config_t thread_rank_config(int r, int world, const std::string& addr, const char* token,
                                      int timeout_ms) {
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.rank = r;
  cfg.world_size = world;
  cfg.store_addr = addr.c_str();
  cfg.timeout_ms = timeout_ms;
  cfg.job_token = token;
  return cfg;
}

// Runs fn(rank, addr) on `world` threads that share a fresh store address; each rank makes (and
// ends) its own communicator.
inline void run_capi_ranks(int world,
                           const std::function<void(int rank, const std::string& addr)>& fn) {
  const std::string addr = local_store_addr();
  run_threads(world, [&](int r) { fn(r, addr); });
}

// Inits `world` ranks as threads on `transport` and returns their communicators in rank order. A
// rank whose init fails adds a test failure with its gw_last_error() and is NULL.
inline std::vector<gw_comm_t> init_ranks(int world, const std::string& token, const char* transport,
                                         int timeout_ms = 20000) {
  std::vector<gw_comm_t> comms(static_cast<size_t>(world), nullptr);
  run_capi_ranks(world, [&](int r, const std::string& addr) {
    gw_config_t cfg = thread_rank_config(r, world, addr, token.c_str(), timeout_ms);
    cfg.transport = transport;
    const gw_status_t st = gw_comm_init(&comms[static_cast<size_t>(r)], &cfg);
    EXPECT_EQ(st, GW_OK) << "rank " << r << ": " << gw_last_error();
  });
  return comms;
}

// Runs fn(rank, comm) on one thread per communicator of comms (rank order).
inline void on_each_rank(const std::vector<gw_comm_t>& comms,
                         const std::function<void(int rank, gw_comm_t comm)>& fn) {
  run_threads(static_cast<int>(comms.size()), [&](int r) { fn(r, comms[static_cast<size_t>(r)]); });
}

}  // namespace gw::testing
