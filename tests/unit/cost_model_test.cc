#include "collectives/cost_model.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "tests/support/test_env.h"

namespace gw::coll {
namespace {

using ::gw::testing::ScopedEnv;

TEST(CostModel, FormulasMatchTheAlphaBetaGammaModel) {
  CostParams p{.alpha_us = 10, .bw_gbps = 1, .reduce_gbps = 4};
  const double n = 64.0 * 1024 * 1024;
  // ring, p = 4: 6 a + 1.5 n b + 0.75 n g
  EXPECT_NEAR(ring_allreduce_seconds(4, 64 << 20, p), 6 * 10e-6 + 1.5 * n / 1e9 + 0.75 * n / 4e9,
              1e-12);
  // rhd, p = 4: 4 a + 1.5 n b + 0.75 n g
  EXPECT_NEAR(rhd_allreduce_seconds(4, 64 << 20, p), 4 * 10e-6 + 1.5 * n / 1e9 + 0.75 * n / 4e9,
              1e-12);
  // rhd, p = 5: the core of 4 plus the fold (2 a + 2 n b + n g)
  EXPECT_NEAR(rhd_allreduce_seconds(5, 1000, p),
              rhd_allreduce_seconds(4, 1000, p) + 2 * 10e-6 + 2 * 1000 / 1e9 + 1000 / 4e9, 1e-15);
  EXPECT_EQ(ring_allreduce_seconds(1, 1 << 20, p), 0);
  EXPECT_EQ(rhd_allreduce_seconds(1, 1 << 20, p), 0);
}

TEST(CostModel, ChoosesRhdForLatencyBoundPowerOfTwoAndRingWhenFoldCosts) {
  CostParams tcp{.alpha_us = 20, .bw_gbps = 1.2};
  EXPECT_EQ(choose_allreduce(8, 4096, tcp, Algo::kAuto).algo, Algo::kRhd);
  EXPECT_EQ(choose_allreduce(2, 4096, tcp, Algo::kAuto).algo, Algo::kRing);  // tie -> ring
  // p = 3: the fold moves the whole vector twice; ring wins for big buffers.
  EXPECT_EQ(choose_allreduce(3, 64 << 20, tcp, Algo::kAuto).algo, Algo::kRing);
  auto forced = choose_allreduce(8, 4096, tcp, Algo::kRing);
  EXPECT_EQ(forced.algo, Algo::kRing);
  EXPECT_TRUE(forced.forced);
  EXPECT_GT(forced.ring_s, forced.rhd_s);
}

TEST(CostModel, ParamsFromTransportThenEnvironment) {
  auto shm = cost_params_for("shm", 0, 0);
  auto tcp = cost_params_for("tcp", 0, 0);
  EXPECT_LT(shm.alpha_us, tcp.alpha_us);
  auto props = cost_params_for("tcp", 7.5, 3.0);
  EXPECT_EQ(props.alpha_us, 7.5);
  EXPECT_EQ(props.bw_gbps, 3.0);
  ScopedEnv a("GW_COST_ALPHA_US", "123");
  ScopedEnv b("GW_COST_BW_GBPS", "0.5");
  auto env = cost_params_for("tcp", 7.5, 3.0);
  EXPECT_EQ(env.alpha_us, 123);
  EXPECT_EQ(env.bw_gbps, 0.5);
}

TEST(CostModel, ParseAlgoRejectsUnknownNames) {
  EXPECT_EQ(*parse_algo("ring"), Algo::kRing);
  EXPECT_EQ(*parse_algo("rhd"), Algo::kRhd);
  EXPECT_EQ(*parse_algo("auto"), Algo::kAuto);
  for (Algo a : {Algo::kRing, Algo::kRhd, Algo::kHostRing, Algo::kHier, Algo::kHierLeader,
                 Algo::kTree, Algo::kBblocks}) {
    EXPECT_EQ(*parse_algo(algo_name(a)), a) << algo_name(a);
  }
  auto bad = parse_algo("bogus");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArg);
  EXPECT_NE(bad.status().message().find("GW_ALGO"), std::string::npos);
}

TEST(CostModel, DescribesTheChoiceForTheLog) {
  AlgoChoice c{.algo = Algo::kRing, .forced = false, .ring_s = 0.0401, .rhd_s = 0.041};
  EXPECT_EQ(describe_choice(64 << 20, c, 2),
            "allreduce 64 MiB: ring, 2 channels (cost model: ring 40.1 ms, rhd 41.0 ms)");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(12), "12 B");
  EXPECT_EQ(size_class(0), -1);
  EXPECT_EQ(size_class(1024), size_class(2047));
  EXPECT_NE(size_class(1024), size_class(2048));
}

}  // namespace
}  // namespace gw::coll
