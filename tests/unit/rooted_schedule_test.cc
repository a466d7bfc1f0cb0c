// The rooted collectives' and all-to-all-v's schedules (collectives/rooted_schedule.h), run in
// memory by the schedule simulator for 1..17 ranks, every root and every dtype: the root's
// result, the closing tokens (every message received, no deadlock), and the tree/chain choice.
#include "collectives/rooted_schedule.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "tests/support/schedule_sim.h"

namespace gw::coll {
namespace {

using gw::testing::decode;
using gw::testing::encode;
using gw::testing::kAllTypes;
using gw::testing::one_plan;
using gw::testing::SimRank;
using gw::testing::simulate;

double value(int r, size_t i) { return static_cast<double>((r * 3 + i) % 5 + 1); }

TEST(RootedScheduleTest, TreeAndChainReduceGiveTheRootTheSum) {
  for (int p = 1; p <= 17; ++p) {
    for (int root = 0; root < p; root += (p > 5 ? 3 : 1)) {
      for (bool tree : {true, false}) {
        for (DataType t : kAllTypes) {
          const size_t n = 11, es = dtype_size(t);
          std::vector<SimRank> ranks(p);
          for (int r = 0; r < p; ++r) {
            ranks[r].plans =
                one_plan(tree ? tree_reduce(r, p, root, n) : chain_reduce(r, p, root, n));
            ranks[r].input.resize(n * es);
            ranks[r].output.assign(n * es, 0);
            for (size_t i = 0; i < n; ++i) encode(t, value(r, i), &ranks[r].input[i * es]);
          }
          simulate(ranks, t, ReduceOp::kSum, static_cast<uint32_t>(p * 31 + root));
          if (p > 1) {
            for (size_t i = 0; i < n; ++i) {
              double want = 0;
              for (int r = 0; r < p; ++r) want += value(r, i);
              ASSERT_EQ(decode(t, &ranks[root].output[i * es]), want)
                  << "p " << p << " root " << root << (tree ? " tree" : " chain") << " i " << i;
            }
          }
          for (int r = 0; r < p; ++r) ranks[r].plans = one_plan(reduce_token(r, p, root, tree));
          simulate(ranks, t, ReduceOp::kSum, 7);
        }
      }
    }
  }
}

TEST(RootedScheduleTest, GatherAndScatterMoveEveryBlockAndTheTokens) {
  for (int p = 1; p <= 17; ++p) {
    for (int root = 0; root < p; root += (p > 5 ? 4 : 1)) {
      for (bool to_root : {true, false}) {
        const DataType t = DataType::kI32;
        const size_t n = 5, es = 4;
        std::vector<SimRank> ranks(p);
        for (int r = 0; r < p; ++r) {
          ranks[r].plans = spread_steps(rooted_blocks(r, p, root, n, to_root), 8);
          ranks[r].input.resize(p * n * es);
          ranks[r].output.assign(p * n * es, 0);
          for (size_t i = 0; i < p * n; ++i) encode(t, r * 100 + i, &ranks[r].input[i * es]);
        }
        simulate(ranks, t, ReduceOp::kSum, static_cast<uint32_t>(p));
        for (int r = 0; r < p; ++r) {
          if (r == root) continue;
          for (size_t i = 0; i < n; ++i) {
            // gather: the root's block r is rank r's first n elements; scatter: rank r's output
            // starts with the root's block r.
            const double got = to_root ? decode(t, &ranks[root].output[(r * n + i) * es])
                                       : decode(t, &ranks[r].output[i * es]);
            const double want = to_root ? r * 100 + i : root * 100 + r * n + i;
            ASSERT_EQ(got, want) << "p " << p << " root " << root << " rank " << r;
          }
        }
        for (int r = 0; r < p; ++r) ranks[r].plans = spread_steps(rooted_ack(r, p, root), 8);
        simulate(ranks, t, ReduceOp::kSum, 3);
        for (int r = 0; r < p; ++r) ranks[r].plans = spread_steps(rooted_token(r, p, root), 8);
        simulate(ranks, t, ReduceOp::kSum, 5);
      }
    }
  }
}

TEST(RootedScheduleTest, PairwiseAlltoallvMovesEveryUnevenBlock) {
  for (int p = 1; p <= 17; ++p) {
    std::mt19937 rng(static_cast<uint32_t>(p));
    std::vector<std::vector<size_t>> c(p, std::vector<size_t>(p));
    for (auto& row : c) {
      for (auto& x : row) x = rng() % 4;
    }
    const DataType t = DataType::kI64;
    const size_t es = 8;
    std::vector<SimRank> ranks(p);
    std::vector<std::vector<size_t>> sd(p, std::vector<size_t>(p)), rd = sd;
    for (int r = 0; r < p; ++r) {
      std::vector<size_t> sc(p), rc(p);
      // The receive blocks after the send blocks: the simulator wants a step's two ranges apart
      // (it runs schedules on one buffer), which the executor does not need for separate buffers.
      size_t s_at = 0;
      for (int j = 0; j < p; ++j) s_at += c[r][j];
      size_t r_at = s_at;
      for (int j = 0, at = 0; j < p; ++j) {
        sc[j] = c[r][j];
        rc[j] = c[j][r];
        sd[r][j] = static_cast<size_t>(at);
        rd[r][j] = r_at;
        at += static_cast<int>(sc[j]);
        r_at += rc[j];
      }
      ranks[r].plans = spread_steps(pairwise_alltoallv(r, p, sc, sd[r], rc, rd[r]), 8);
      const size_t len = r_at;
      ranks[r].input.assign(len * es, 0);
      ranks[r].output.assign(len * es, 0);
      for (size_t i = 0; i < s_at; ++i) encode(t, r * 1000 + i, &ranks[r].input[i * es]);
    }
    simulate(ranks, t, ReduceOp::kSum, 11);
    for (int r = 0; r < p; ++r) {
      for (int i = 0; i < p; ++i) {
        if (i == r) continue;
        for (size_t k = 0; k < c[i][r]; ++k) {
          ASSERT_EQ(decode(t, &ranks[r].output[(rd[r][i] + k) * es]),
                    static_cast<double>(i * 1000 + sd[i][r] + k))
              << "p " << p << " from " << i << " to " << r;
        }
      }
    }
    for (int r = 0; r < p; ++r) ranks[r].plans = spread_steps(pairwise_token(r, p), 8);
    simulate(ranks, t, ReduceOp::kSum, 13);
  }
}

TEST(RootedScheduleTest, TreeForSmallBuffersChainForLarge) {
  // tcp-like figures: 20 us per message, 1 GB/s, 8 GB/s reduction, 512 KiB chunks.
  for (int p : {3, 4, 8, 16}) {
    EXPECT_TRUE(prefer_tree_reduce(p, 1024, 20, 1, 8, 512 * 1024)) << p;
    EXPECT_FALSE(prefer_tree_reduce(p, 64 << 20, 20, 1, 8, 512 * 1024)) << p;
  }
  EXPECT_TRUE(prefer_tree_reduce(2, 64 << 20, 20, 1, 8, 512 * 1024));  // one message either way
}

}  // namespace
}  // namespace gw::coll
