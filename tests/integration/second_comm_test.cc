// A second communicator made from the same environment (or the same explicit config) in one
// process works beside the first: the process's store is shared under a new key prefix instead
// of rank 0 binding the store's port again.
#include <gtest/gtest.h>

#include <string>

#include "tests/integration/proc_harness.h"

namespace gw::test {
namespace {

constexpr int kTimeoutMs = 20000;

void expect_all_twice(ProcGroup& group, int n) {
  auto results = group.wait_all(kTimeoutMs * 2, /*kill_on_failure=*/true);
  ASSERT_EQ(results.size(), static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    EXPECT_TRUE(res.exited && res.exit_code == 0) << "rank " << r << " " << res.describe();
    EXPECT_NE(res.output.find("TWICE rank=" + std::to_string(r) + " ok"), std::string::npos)
        << res.describe();
    EXPECT_EQ(res.output.find("Address already in use"), std::string::npos) << res.describe();
  }
}

TEST(SecondCommTest, TwoCommunicatorsFromTheSameEnvironment) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const int n = 3;
  ProcGroup group;
  for (int r = 0; r < n; ++r) {
    Env env = clean_env();
    env["GW_TIMEOUT_MS"] = std::to_string(kTimeoutMs);
    env["RANK"] = std::to_string(r);
    env["WORLD_SIZE"] = std::to_string(n);
    env["MASTER_ADDR"] = "127.0.0.1";
    env["MASTER_PORT"] = std::to_string(port);
    group.start({GW_RANK_MAIN_PATH, "twice"}, env);
  }
  expect_all_twice(group, n);
}

TEST(SecondCommTest, TwoCommunicatorsFromTheSameExplicitConfig) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const int n = 2;
  ProcGroup group;
  Env env = clean_env();
  env["GW_TIMEOUT_MS"] = std::to_string(kTimeoutMs);
  for (int r = 0; r < n; ++r) {
    group.start({GW_RANK_MAIN_PATH, "--rank", std::to_string(r), "--world", std::to_string(n),
                 "--store", "127.0.0.1:" + std::to_string(port), "--transport", "tcp", "twice"},
                env);
  }
  expect_all_twice(group, n);
}

}  // namespace
}  // namespace gw::test
