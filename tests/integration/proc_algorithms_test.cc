// Every allreduce algorithm of the table forced with GW_ALGO, across real processes through
// libgradwire.so: 4 ranks as 2 hosts of 2 (GW_HOSTID), so transport auto puts shm within a host
// and tcp between them. Every dtype the C helper checks and every op, out-of-place and in place,
// at odd counts up to past one pipeline chunk.
#include <gtest/gtest.h>

#include <string>

#include "tests/integration/proc_harness.h"

namespace gw::test {
namespace {

class ProcAlgorithmsTest : public ::testing::TestWithParam<std::string> {};

void run_two_hosts_of_two(const std::string& algo, const char* chunk) {
  const int nranks = 4;
  int port = free_port();
  ASSERT_GT(port, 0);
  ProcGroup group;
  for (int r = 0; r < nranks; ++r) {
    Env env = clean_env();
    env["GW_TIMEOUT_MS"] = "30000";
    env["GW_ALGO"] = algo;
    if (chunk != nullptr) env["GW_CHUNK_SIZE"] = chunk;
    env["GW_HOSTID"] = r < 2 ? "fake-host-a" : "fake-host-b";
    env["GW_LOG_LEVEL"] = "info";
    group.start({GW_RANK_MAIN_PATH, "--rank", std::to_string(r), "--world", std::to_string(nranks),
                 "--store", "127.0.0.1:" + std::to_string(port), "--transport", "auto", "suite",
                 "0", "1", "7", "1001", "100003"},
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
    // The choice is logged, and it is the forced one.
    EXPECT_NE(results[r].output.find(": " + algo + ", "), std::string::npos) << results[r].output;
  }
}

TEST_P(ProcAlgorithmsTest, TwoHostsOfTwoRanksAreExact) {
  run_two_hosts_of_two(GetParam(), nullptr);
}

// Small chunks cut the largest count into many pipeline segments of hier (its intra-host phases
// over shm overlapping the inter-host one over tcp).
TEST(ProcAlgorithms, HierPipelinedOverManySegmentsIsExact) { run_two_hosts_of_two("hier", "4K"); }

INSTANTIATE_TEST_SUITE_P(Algorithms, ProcAlgorithmsTest,
                         ::testing::Values("ring", "rhd", "host_ring", "hier", "hier_leader",
                                           "tree", "bblocks"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gw::test
