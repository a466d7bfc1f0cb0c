// What the start-up failure tests share (tests/integration/setup_failure_test.cc and
// setup_failure_late_test.cc): a rank's environment for a tcp job over a private store, and the
// check that every rank failed promptly and close together. Header only, over the process
// harness (tests/integration/proc_harness.h).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tests/integration/proc_harness.h"

namespace gw::test {

// GW_RANK, GW_WORLD_SIZE, GW_STORE (127.0.0.1:port), GW_TIMEOUT_MS and GW_TRANSPORT=tcp.
inline Env tcp_rank_env(int rank, int world, int port, int timeout_ms) {
  Env env = clean_env();
  env["GW_RANK"] = std::to_string(rank);
  env["GW_WORLD_SIZE"] = std::to_string(world);
  env["GW_STORE"] = "127.0.0.1:" + std::to_string(port);
  env["GW_TIMEOUT_MS"] = std::to_string(timeout_ms);
  env["GW_TRANSPORT"] = "tcp";
  return env;
}

// Every rank failed (exited non-zero, not killed at the harness's deadline) within within_ms of
// its start (none waited out its own deadline), and the last exited within spread_ms of the
// first.
inline void expect_failed_promptly(const std::vector<ProcResult>& results, double within_ms,
                                   double spread_ms) {
  double first = 1e18, last = 0;
  for (size_t r = 0; r < results.size(); ++r) {
    const auto& res = results[r];
    EXPECT_TRUE(res.exited && res.exit_code != 0) << "rank " << r << ": " << res.describe();
    EXPECT_FALSE(res.timed_out) << "rank " << r << ": " << res.describe();
    EXPECT_LT(res.elapsed_ms, within_ms) << "rank " << r << ": " << res.describe();
    first = std::min(first, res.elapsed_ms);
    last = std::max(last, res.elapsed_ms);
  }
  EXPECT_LT(last - first, spread_ms)
      << "the last rank exited " << (last - first) << " ms after the first";
}

}  // namespace gw::test
