// A rank that has not joined is named at INFO while the others wait, every GW_JOIN_REPORT_MS,
// until it joins (or the deadline).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "tests/integration/proc_harness.h"

namespace gw::test {
namespace {

constexpr int kTimeoutMs = 20000;

Env rank_env(int rank, int world, int port) {
  Env env = clean_env();
  env["GW_TIMEOUT_MS"] = std::to_string(kTimeoutMs);
  env["GW_LOG_LEVEL"] = "info";
  env["GW_JOIN_REPORT_MS"] = "200";
  env["GW_TRANSPORT"] = "tcp";
  env["RANK"] = std::to_string(rank);
  env["WORLD_SIZE"] = std::to_string(world);
  env["MASTER_ADDR"] = "127.0.0.1";
  env["MASTER_PORT"] = std::to_string(port);
  return env;
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(JoinWaitTest, MissingRanksAreNamedUntilTheyJoin) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const int world = 4;
  ProcGroup group;
  // Ranks 0 and 2 start; 1 and 3 are late.
  group.start({GW_RANK_MAIN_PATH, "identity"}, rank_env(0, world, port));
  group.start({GW_RANK_MAIN_PATH, "identity"}, rank_env(2, world, port));
  const std::string line = "communicator: waiting for ranks 1, 3 to join (2 of 4 joined";
  ASSERT_TRUE(group.wait_for_output(0, line, kTimeoutMs)) << group.output(0);
  ASSERT_TRUE(group.wait_for_output(1, line, kTimeoutMs)) << group.output(1);
  // Repeated while they wait (every 200 ms here).
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  // Rank 1 joins: now only rank 3 is named.
  group.start({GW_RANK_MAIN_PATH, "identity"}, rank_env(1, world, port));
  ASSERT_TRUE(group.wait_for_output(0, "communicator: waiting for rank 3 to join (3 of 4 joined",
                                    kTimeoutMs))
      << group.output(0);
  // Rank 3 finds everyone there; its report comes late, so a slow store round trip on a loaded
  // machine cannot make it name a rank that has joined.
  Env late = rank_env(3, world, port);
  late["GW_JOIN_REPORT_MS"] = "3000";
  group.start({GW_RANK_MAIN_PATH, "identity"}, late);
  auto results = group.wait_all(kTimeoutMs * 2, /*kill_on_failure=*/true);
  for (const auto& res : results) {
    ASSERT_TRUE(res.exited && res.exit_code == 0) << res.describe();
    EXPECT_NE(res.output.find("RESULT"), std::string::npos) << res.describe();
  }
  EXPECT_GE(count(results[0].output, "waiting for ranks 1, 3 to join"), 2u) << results[0].output;
  // The late ranks found everyone there and waited for nobody by name.
  EXPECT_EQ(results[3].output.find("waiting for rank"), std::string::npos) << results[3].output;
}

TEST(JoinWaitTest, ZeroTurnsTheReportOff) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  ProcGroup group;
  Env env = rank_env(0, 2, port);
  env["GW_JOIN_REPORT_MS"] = "0";
  env["GW_TIMEOUT_MS"] = "1500";
  group.start({GW_RANK_MAIN_PATH, "identity"}, env);
  auto results = group.wait_all(kTimeoutMs);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_TRUE(results[0].exited && results[0].exit_code != 0) << results[0].describe();
  EXPECT_EQ(results[0].output.find("info communicator: waiting for rank"), std::string::npos)
      << results[0].describe();
  // The deadline's error still names the rank that never came.
  EXPECT_NE(results[0].output.find("waiting for rank 1 to join"), std::string::npos)
      << results[0].describe();
}

}  // namespace
}  // namespace gw::test
