// What the capi_test binary's files share (capi_test.cc, capi_ranks_test.cc, capi_split_test.cc):
// the status check with its message, a world of one as a fixture, and ranks as threads through the
// C ABI with each rank's result checked. Defined inline in a named namespace, so the fixture is
// one type in every file (gtest requires it of a suite).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gradwire/gradwire.h"
#include "tests/support/capi_ranks.h"
#include "tests/support/test_env.h"

namespace gw::testing::capi {

inline std::string last() { return gw_last_error(); }

// The call returns `code`; a failure leaves an error message.
#define EXPECT_GW(code, call)                                   \
  do {                                                          \
    gw_status_t gw_s_ = (call);                                 \
    EXPECT_EQ(gw_s_, code) << #call << ": " << gw_last_error(); \
    if ((code) != GW_OK) {                                      \
      EXPECT_STRNE(gw_last_error(), "") << #call;               \
    }                                                           \
  } while (0)

// A world of one, made for each test and destroyed after it.
class SingleRankTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gw_config_t cfg = GW_CONFIG_INIT;
    cfg.rank = 0;
    cfg.world_size = 1;
    cfg.timeout_ms = 20000;
    ASSERT_EQ(gw_comm_init(&comm_, &cfg), GW_OK) << gw_last_error();
  }
  void TearDown() override {
    if (comm_ != nullptr) {
      EXPECT_EQ(gw_comm_destroy(comm_), GW_OK) << gw_last_error();
    }
  }
  gw_comm_t comm_ = nullptr;
  CleanEnv env_;
};

// What one rank of a multi-rank test did: its init status, the first error, whether it checked
// everything.
struct RankResult {
  gw_status_t init = GW_ERR_INTERNAL;
  std::string error;
  bool checked = false;
};

// The communicator of one rank of a run_checked_ranks function (store at `addr`, 30 s deadline),
// or nullptr with init's status and error in *out.
inline gw_comm_t init_checked_rank(int rank, int world, const std::string& addr,
                                   const char* transport, const char* token, RankResult* out) {
  gw_config_t cfg = thread_rank_config(rank, world, addr, token, 30000);
  cfg.transport = transport;
  gw_comm_t comm = nullptr;
  out->init = gw_comm_init(&comm, &cfg);
  if (out->init != GW_OK) {
    out->error = gw_last_error();
    return nullptr;
  }
  return comm;
}

// Runs rank_fn on `world` ranks as threads; every rank must have initialized, checked all and
// recorded no error.
inline void run_checked_ranks(int world, const char* transport,
                              void (*rank_fn)(int, int, const std::string&, const char*,
                                              RankResult*)) {
  std::vector<RankResult> results(world);
  gw::testing::run_capi_ranks(world, [&](int r, const std::string& addr) {
    rank_fn(r, world, addr, transport, &results[r]);
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(results[r].init, GW_OK) << "rank " << r << ": " << results[r].error;
    EXPECT_TRUE(results[r].checked) << "rank " << r;
    EXPECT_EQ(results[r].error, "") << "rank " << r;
  }
}

}  // namespace gw::testing::capi
