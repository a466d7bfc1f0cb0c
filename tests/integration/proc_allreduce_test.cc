// Allreduce across real processes through libgradwire.so: every dtype the C helper checks
// (f32 f64 i32 i64 u8), every op, out-of-place and in place, counts from 0 to past one pipeline
// chunk, at 2, 3 and 4 ranks over tcp and over shm.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "tests/integration/proc_harness.h"

namespace gw::test {
namespace {

class ProcAllreduceTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(ProcAllreduceTest, EveryDtypeAndOpIsExact) {
  const auto& [transport, nranks] = GetParam();
  int port = free_port();
  ASSERT_GT(port, 0);
  Env env = clean_env();
  env["GW_TIMEOUT_MS"] = "30000";
  ProcGroup group;
  for (int r = 0; r < nranks; ++r) {
    group.start({GW_RANK_MAIN_PATH, "--rank", std::to_string(r), "--world", std::to_string(nranks),
                 "--store", "127.0.0.1:" + std::to_string(port), "--transport", transport, "suite",
                 "0", "1", "7", "1000", "100003"},
                env);
  }
  auto results = group.wait_all(120000, /*kill_on_failure=*/true);
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].exited && results[r].exit_code == 0)
        << "rank " << r << " " << results[r].describe();
    auto fields = parse_tagged_line(results[r].output, "RESULT");
    ASSERT_TRUE(fields.has_value()) << results[r].describe();
    EXPECT_EQ((*fields)["status"], "0");
    EXPECT_EQ((*fields)["calls"], "250");  // 5 counts x 5 dtypes x 5 ops x 2 placements
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, ProcAllreduceTest,
                         ::testing::Combine(::testing::Values(std::string("tcp"),
                                                              std::string("shm")),
                                            ::testing::Values(2, 3, 4)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "ranks";
                         });

}  // namespace
}  // namespace gw::test
