// Runs every schedule for p = 1..17 ranks (1..33 for the topology-aware ones) entirely in memory:
// each rank's steps are applied in order, messages travel through per-pair FIFO queues carrying
// (step id, elements), and the receiver checks the id and the element count like the Communicator
// does. Results are checked against the exact answer (int64 sums, so order of reduction does not
// matter).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "collectives/reduce.h"
#include "collectives/schedule.h"
#include "tests/support/schedule_sim.h"
#include "tests/support/test_env.h"

namespace gw::coll {
namespace {

using gw::testing::expect_no_races;
using gw::testing::kSimMaxRanks;
using gw::testing::layout_name;
using gw::testing::numberings;

struct RankState {
  Schedule sched;
  std::vector<int64_t> input;
  std::vector<int64_t> output;
};

std::vector<uint8_t> bytes_of(const std::vector<int64_t>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(int64_t));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<int64_t> int64s_of(const std::vector<uint8_t>& b) {
  std::vector<int64_t> v(b.size() / sizeof(int64_t));
  if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * sizeof(int64_t));
  return v;
}

// Runs each rank's schedule, as its only plan, through the byte-level simulator
// (tests/support/schedule_sim.h) with int64 sums (exact in every order); fails the test on a
// mismatch or a deadlock.
void simulate(std::vector<RankState>& ranks) {
  std::vector<testing::SimRank> sim(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    sim[r].plans = testing::one_plan(ranks[r].sched);
    sim[r].input = bytes_of(ranks[r].input);
    sim[r].output = bytes_of(ranks[r].output);
  }
  testing::simulate(sim, DataType::kI64, ReduceOp::kSum, 0);
  for (size_t r = 0; r < ranks.size(); ++r) ranks[r].output = int64s_of(sim[r].output);
}

int64_t value(int rank, size_t i) { return static_cast<int64_t>(rank) * 1000003 + i * 7 + 1; }

std::vector<size_t> counts_for(int p) {
  return {0,
          1,
          2,
          static_cast<size_t>(p > 1 ? p - 1 : 0),
          static_cast<size_t>(p),
          static_cast<size_t>(p + 1),
          37,
          1000};
}

enum class Algo { kRing, kRhd };

void check_allreduce(Algo algo, int p, size_t count, bool in_place) {
  std::vector<RankState> ranks(p);
  for (int r = 0; r < p; ++r) {
    ranks[r].sched = algo == Algo::kRing ? ring_allreduce(r, p, count) : rhd_allreduce(r, p, count);
    ranks[r].input.resize(count);
    for (size_t i = 0; i < count; ++i) ranks[r].input[i] = value(r, i);
    // Out of place: the output starts as garbage; every element must be written.
    ranks[r].output = in_place ? ranks[r].input : std::vector<int64_t>(count, -777);
  }
  if (in_place) {
    for (auto& rs : ranks) {
      // In place: input and output are the same buffer; model it by pointing both at output.
      for (auto& st : rs.sched) st.send_from_input = st.reduce_with_input = false;
    }
  }
  simulate(ranks);
  if (p == 1 && !in_place) ranks[0].output = ranks[0].input;  // the executor's local copy
  for (int r = 0; r < p; ++r) {
    for (size_t i = 0; i < count; ++i) {
      int64_t want = 0;
      for (int q = 0; q < p; ++q) want += value(q, i);
      ASSERT_EQ(ranks[r].output[i], want)
          << "p=" << p << " count=" << count << " rank " << r << " element " << i;
    }
  }
}

TEST(ScheduleSimulation, RingAllreduce) {
  for (int p = 1; p <= 17; ++p)
    for (size_t n : counts_for(p))
      for (bool in_place : {false, true}) check_allreduce(Algo::kRing, p, n, in_place);
}

TEST(ScheduleSimulation, RhdAllreduceWithNonPowerOfTwoFold) {
  for (int p = 1; p <= 17; ++p)
    for (size_t n : counts_for(p))
      for (bool in_place : {false, true}) check_allreduce(Algo::kRhd, p, n, in_place);
}

TEST(ScheduleSimulation, RingReduceScatter) {
  for (int p = 1; p <= 17; ++p) {
    for (size_t n : counts_for(p)) {
      std::vector<RankState> ranks(p);
      for (int r = 0; r < p; ++r) {
        ranks[r].sched = ring_reduce_scatter(r, p, n);
        ranks[r].input.resize(n);
        for (size_t i = 0; i < n; ++i) ranks[r].input[i] = value(r, i);
        ranks[r].output.assign(n, -5);
      }
      simulate(ranks);
      for (int r = 0; r < p; ++r) {
        Range mine = block_range(n, p, r);
        for (size_t i = mine.offset; i < mine.offset + mine.count; ++i) {
          int64_t want = 0;
          for (int q = 0; q < p; ++q) want += value(q, i);
          if (p == 1) ranks[r].output[i] = ranks[r].input[i];  // executor's local copy
          ASSERT_EQ(ranks[r].output[i], want) << "p=" << p << " n=" << n << " rank " << r;
        }
      }
    }
  }
}

TEST(ScheduleSimulation, RingAllgather) {
  for (int p = 1; p <= 17; ++p) {
    for (size_t per : {size_t{0}, size_t{1}, size_t{3}, size_t{100}}) {
      std::vector<RankState> ranks(p);
      for (int r = 0; r < p; ++r) {
        ranks[r].sched = ring_allgather(r, p, per);
        ranks[r].output.assign(per * p, -1);
        for (size_t i = 0; i < per; ++i) ranks[r].output[r * per + i] = value(r, i);
      }
      simulate(ranks);
      for (int r = 0; r < p; ++r)
        for (int q = 0; q < p; ++q)
          for (size_t i = 0; i < per; ++i)
            ASSERT_EQ(ranks[r].output[q * per + i], value(q, i)) << p << " " << r << " " << q;
    }
  }
}

TEST(ScheduleSimulation, ChainBroadcastFromEveryRoot) {
  for (int p = 1; p <= 17; ++p) {
    for (int root = 0; root < p; ++root) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{50}}) {
        std::vector<RankState> ranks(p);
        for (int r = 0; r < p; ++r) {
          ranks[r].sched = chain_broadcast(r, p, root, n);
          ranks[r].output.assign(n, -3);
          if (r == root)
            for (size_t i = 0; i < n; ++i) ranks[r].output[i] = value(root, i);
        }
        simulate(ranks);
        for (int r = 0; r < p; ++r)
          for (size_t i = 0; i < n; ++i) ASSERT_EQ(ranks[r].output[i], value(root, i));
      }
    }
  }
}

// Bandwidth-optimality: ring and RHD (power of two) move 2(p-1)/p * n elements per rank.
TEST(ScheduleShape, BytesAndStepsMatchTheCostModel) {
  for (int p : {2, 4, 8, 16}) {
    const size_t n = 16 * 1024;
    for (int r = 0; r < p; ++r) {
      for (const Schedule& s : {ring_allreduce(r, p, n), rhd_allreduce(r, p, n)}) {
        size_t sent = 0;
        for (const auto& st : s) sent += st.send_to >= 0 ? st.send.count : 0;
        EXPECT_EQ(sent, 2 * (p - 1) * n / p) << "p=" << p;
      }
      EXPECT_EQ(ring_allreduce(r, p, n).size(), static_cast<size_t>(2 * (p - 1)));
      int lg = 0;
      while ((1 << lg) < p) ++lg;
      EXPECT_EQ(rhd_allreduce(r, p, n).size(), static_cast<size_t>(2 * lg));
    }
  }
  // Non-power-of-two: folded even ranks do just the pre and post steps.
  EXPECT_EQ(rhd_allreduce(0, 3, 10).size(), 2u);
  EXPECT_EQ(rhd_allreduce(1, 3, 10).size(), 4u);
}

// The executor's size check can only stop a rank that receives: a rank that only sent would
// return ok from a call whose counts disagree. So every rank of every schedule receives somewhere
// (the broadcast root: the closing token).
TEST(ScheduleShape, EveryRankReceivesSoACountMismatchReachesIt) {
  for (int p = 2; p <= 17; ++p) {
    for (int r = 0; r < p; ++r) {
      std::vector<std::pair<std::string, Schedule>> all = {
          {"ring allreduce", ring_allreduce(r, p, 100)},
          {"ring reduce_scatter", ring_reduce_scatter(r, p, 100)},
          {"ring allgather", ring_allgather(r, p, 10)},
          {"rhd allreduce", rhd_allreduce(r, p, 100)},
          {"alltoall", pairwise_alltoall(r, p, 10)}};
      for (int root = 0; root < p; ++root) {
        all.emplace_back("broadcast from " + std::to_string(root),
                         chain_broadcast(r, p, root, 100));
      }
      for (const auto& [name, s] : all) {
        bool receives = false;
        for (const Step& st : s) receives |= st.recv_from >= 0;
        EXPECT_TRUE(receives) << name << ": rank " << r << " of " << p << " never receives";
      }
    }
  }
}

TEST(ScheduleShape, BlockRangeCoversEverythingOnce) {
  for (size_t n : {0, 1, 5, 16, 17}) {
    for (int b = 1; b <= 9; ++b) {
      size_t next = 0;
      for (int i = 0; i < b; ++i) {
        Range rg = block_range(n, b, i);
        EXPECT_EQ(rg.offset, next);
        next += rg.count;
      }
      EXPECT_EQ(next, n);
    }
  }
}

// ---- topology-aware schedules ----------------------------------------------------------------

// Simulates schedule(r) on every rank and checks that `covered` of every rank's output holds the
// exact sum (the rest of the buffer is another schedule's business, e.g. the other tree).
void check_sum(int p, size_t count, bool in_place, const std::function<Schedule(int)>& schedule,
               const Range& covered, const std::string& what) {
  std::vector<RankState> ranks(p);
  for (int r = 0; r < p; ++r) {
    ranks[r].sched = schedule(r);
    ranks[r].input.resize(count);
    for (size_t i = 0; i < count; ++i) ranks[r].input[i] = value(r, i);
    ranks[r].output = in_place ? ranks[r].input : std::vector<int64_t>(count, -777);
    if (in_place) {
      for (auto& st : ranks[r].sched) st.send_from_input = st.reduce_with_input = false;
    }
  }
  simulate(ranks);
  if (::testing::Test::HasFatalFailure()) {
    ADD_FAILURE() << what;
    return;
  }
  if (p == 1 && !in_place) ranks[0].output = ranks[0].input;
  for (int r = 0; r < p; ++r) {
    for (size_t i = covered.offset; i < covered.offset + covered.count; ++i) {
      int64_t want = 0;
      for (int q = 0; q < p; ++q) want += value(q, i);
      ASSERT_EQ(ranks[r].output[i], want)
          << what << " rank " << r << " element " << i << (in_place ? " in place" : "");
    }
  }
}

// This suite's uneven layouts: a few fixed ones and 12 drawn, of 1 to 6 hosts.
std::vector<std::vector<int>> uneven_layouts() {
  return testing::uneven_layouts(
      {{3, 1}, {1, 3}, {2, 2, 1}, {1, 1, 1}, {5, 3, 2}, {1, 7}, {4, 4, 4, 1}, {16, 17}, {1}, {6}},
      7, 12, 1);
}

TEST(ScheduleSimulation, HierAllreduceOnEveryUniformLayoutUpTo33Ranks) {
  for (int nhosts = 1; nhosts <= 33; ++nhosts) {
    for (int local = 1; nhosts * local <= 33; ++local) {
      const int p = nhosts * local;
      for (const HostRanks& hosts : numberings(std::vector<int>(nhosts, local))) {
        ASSERT_TRUE(uniform_hosts(hosts));
        for (size_t n : {size_t{0}, size_t{1}, static_cast<size_t>(p), size_t{97}, size_t{1000}}) {
          for (bool in_place : {false, true}) {
            check_sum(
                p, n, in_place, [&](int r) { return hier_allreduce(hosts, r, n); }, Range{0, n},
                "hier " + layout_name(hosts) + " n=" + std::to_string(n));
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

TEST(ScheduleSimulation, HierLeaderAndHostRingOnUnevenLayouts) {
  for (const auto& sizes : uneven_layouts()) {
    int p = 0;
    for (int n : sizes) p += n;
    for (const HostRanks& hosts : numberings(sizes)) {
      for (size_t n :
           {size_t{0}, size_t{1}, size_t{13}, static_cast<size_t>(p) + 1, size_t{1000}}) {
        for (bool in_place : {false, true}) {
          const std::string what = layout_name(hosts) + " n=" + std::to_string(n);
          check_sum(
              p, n, in_place, [&](int r) { return hier_leader_allreduce(hosts, r, n); },
              Range{0, n}, "leader " + what);
          if (HasFatalFailure()) return;
          check_sum(
              p, n, in_place, [&](int r) { return host_ring_allreduce(hosts, r, n); }, Range{0, n},
              "host ring " + what);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(ScheduleSimulation, BinaryBlocksUpTo33Ranks) {
  for (int p = 1; p <= 33; ++p) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, static_cast<size_t>(p), size_t{1000}}) {
      for (bool in_place : {false, true}) {
        check_sum(
            p, n, in_place, [&](int r) { return binary_blocks_allreduce(r, p, n); }, Range{0, n},
            "binary blocks p=" + std::to_string(p) + " n=" + std::to_string(n));
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(ScheduleSimulation, DoubleBinaryTreeUpTo33Ranks) {
  for (int p = 1; p <= 33; ++p) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{31}, size_t{1000}}) {
      for (bool in_place : {false, true}) {
        for (int tree = 0; tree < 2; ++tree) {
          const Range half = block_range(n, 2, tree);
          check_sum(
              p, n, in_place, [&](int r) { return tree_allreduce(r, p, tree, half); }, half,
              "tree " + std::to_string(tree) + " p=" + std::to_string(p));
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(ScheduleShape, DoubleBinaryTreesAreTreesWithDisjointInteriors) {
  for (int p = 1; p <= 33; ++p) {
    std::vector<int> interior(p, 0);
    for (int tree = 0; tree < 2; ++tree) {
      int roots = 0;
      for (int r = 0; r < p; ++r) {
        const TreeLinks t = tree_links(r, p, tree);
        if (t.parent < 0) {
          ++roots;
        } else {
          const TreeLinks up = tree_links(t.parent, p, tree);
          ASSERT_LT(static_cast<size_t>(t.slot), up.children.size());
          EXPECT_EQ(up.children[t.slot], r) << "p=" << p << " tree " << tree;
        }
        if (!t.children.empty()) ++interior[r];
        // Depth at most lg p + 1: walk to the root.
        int depth = 0;
        for (int x = r; tree_links(x, p, tree).parent >= 0; x = tree_links(x, p, tree).parent) {
          ASSERT_LE(++depth, 6) << "p=" << p;
        }
      }
      EXPECT_EQ(roots, 1);
    }
    for (int r = 0; r < p; ++r) EXPECT_LE(interior[r], 1) << "p=" << p << " rank " << r;
  }
}

// A hierarchical allreduce moves 2(H-1)/H x n across each host's link per direction; a flat ring
// over the same host-major ranks moves 2(p-1)/p x n across each boundary it crosses.
TEST(ScheduleShape, HierAllreduceSendsLessAcrossHosts) {
  for (auto [nhosts, local] : {std::pair{2, 2}, {2, 4}, {4, 2}, {3, 3}}) {
    const int p = nhosts * local;
    const size_t n = 1 << 16;
    const HostRanks hosts = numberings(std::vector<int>(nhosts, local))[0];
    auto across = [&](const std::function<Schedule(int)>& schedule) {
      size_t out_of_host0 = 0;
      for (int r : hosts[0])
        for (const Step& st : schedule(r))
          if (st.send_to >= 0 && st.send_to >= local) out_of_host0 += st.send.count;
      return out_of_host0;
    };
    const size_t hier = across([&](int r) { return hier_allreduce(hosts, r, n); });
    const size_t flat = across([&](int r) { return ring_allreduce(r, p, n); });
    // Exact up to the rounding of blocks that do not divide n.
    EXPECT_NEAR(static_cast<double>(hier), 2.0 * (nhosts - 1) * n / nhosts, p)
        << nhosts << "x" << local;
    EXPECT_NEAR(static_cast<double>(flat), 2.0 * (p - 1) * n / p, p) << nhosts << "x" << local;
  }
}

TEST(ScheduleShape, TopologySchedulesMakeEveryRankReceive) {
  for (const auto& sizes : uneven_layouts()) {
    int p = 0;
    for (int n : sizes) p += n;
    if (p < 2) continue;
    const HostRanks hosts = numberings(sizes)[1];
    for (int r = 0; r < p; ++r) {
      std::vector<std::pair<std::string, Schedule>> all = {
          {"leader", hier_leader_allreduce(hosts, r, 100)},
          {"host ring", host_ring_allreduce(hosts, r, 100)},
          {"binary blocks", binary_blocks_allreduce(r, p, 100)},
          {"tree 0", tree_allreduce(r, p, 0, Range{0, 50})},
          {"tree 1", tree_allreduce(r, p, 1, Range{50, 50})}};
      if (uniform_hosts(hosts)) all.emplace_back("hier", hier_allreduce(hosts, r, 100));
      for (const auto& [name, s] : all) {
        bool receives = false;
        for (const Step& st : s) receives |= st.recv_from >= 0;
        EXPECT_TRUE(receives) << name << " " << layout_name(hosts) << ": rank " << r;
      }
    }
  }
}

// ---- plans that run together (pipelined hier) -------------------------------------------------

// The plans of every rank through the byte-level simulator with int64 sums; the pipelined plans
// never forward.
void simulate_plans(std::vector<testing::SimRank>& ranks, uint32_t seed) {
  for (const auto& rs : ranks) {
    for (const Plan& plan : rs.plans) {
      for (const Step& st : plan.sched) ASSERT_FALSE(st.forward) << describe(st);
    }
  }
  testing::simulate(ranks, DataType::kI64, ReduceOp::kSum, seed);
}

void check_plans_sum(int p, size_t count, bool in_place,
                     const std::function<std::vector<Plan>(int)>& make, const std::string& what,
                     uint32_t seed, bool check_races) {
  std::vector<testing::SimRank> ranks(p);
  for (int r = 0; r < p; ++r) {
    testing::SimRank& rs = ranks[r];
    rs.plans = make(r);
    std::vector<int64_t> input(count);
    for (size_t i = 0; i < count; ++i) input[i] = value(r, i);
    rs.input = bytes_of(input);
    rs.output = in_place ? rs.input : bytes_of(std::vector<int64_t>(count, -777));
    if (in_place) {
      for (auto& plan : rs.plans) {
        for (auto& st : plan.sched) st.send_from_input = st.reduce_with_input = false;
      }
    }
    if (check_races) {
      expect_no_races(rs.plans, what + " rank " + std::to_string(r));
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  simulate_plans(ranks, seed);
  if (::testing::Test::HasFatalFailure()) {
    ADD_FAILURE() << what;
    return;
  }
  if (p == 1 && !in_place) ranks[0].output = ranks[0].input;
  for (int r = 0; r < p; ++r) {
    const std::vector<int64_t> output = int64s_of(ranks[r].output);
    for (size_t i = 0; i < count; ++i) {
      int64_t want = 0;
      for (int q = 0; q < p; ++q) want += value(q, i);
      ASSERT_EQ(output[i], want) << what << " rank " << r << " element " << i
                                 << (in_place ? " in place" : "");
    }
  }
}

TEST(ScheduleSimulation, HierPipelinedAllreduceOnEveryUniformLayoutUpTo33Ranks) {
  uint32_t seed = 1;
  for (int nhosts = 1; nhosts <= kSimMaxRanks; ++nhosts) {
    for (int local = 1; nhosts * local <= kSimMaxRanks; ++local) {
      const int p = nhosts * local;
      for (const HostRanks& hosts : numberings(std::vector<int>(nhosts, local))) {
        for (size_t n : {size_t{0}, size_t{1}, static_cast<size_t>(p), size_t{97}, size_t{1000}}) {
          for (int segments : {1, 3, 16}) {
            for (bool in_place : {false, true}) {
              check_plans_sum(
                  p, n, in_place,
                  [&](int r) { return hier_pipelined_allreduce(hosts, r, n, segments); },
                  "pipelined hier " + layout_name(hosts) + " n=" + std::to_string(n) + " " +
                      std::to_string(segments) + " segments",
                  seed++, n == 1000 && !in_place);
              if (HasFatalFailure()) return;
            }
          }
        }
      }
    }
  }
}

// The pipelined form sends exactly what hier_allreduce sends, only cut into segments: the same
// bytes across each host's link.
TEST(ScheduleShape, HierPipelinedSendsWhatHierSends) {
  for (auto [nhosts, local] : {std::pair{2, 2}, {2, 4}, {4, 2}, {3, 3}}) {
    const int p = nhosts * local;
    const size_t n = 1 << 16;
    const HostRanks hosts = numberings(std::vector<int>(nhosts, local))[0];
    for (int segments : {1, 7, 16}) {
      size_t across = 0, within = 0;
      for (int r = 0; r < p; ++r) {
        const auto plans = hier_pipelined_allreduce(hosts, r, n, segments);
        ASSERT_EQ(plans.size(), 3u);
        for (size_t l = 0; l < plans.size(); ++l) {
          EXPECT_EQ(plans[l].chan, static_cast<int>(l));
          for (const Step& st : plans[l].sched) {
            if (st.send_to < 0) continue;
            // Lanes 0 and 2 stay within the host, lane 1 only crosses.
            const bool crosses = (st.send_to / local) != (r / local);
            EXPECT_EQ(crosses, l == 1) << describe(st);
            (crosses ? across : within) += st.send.count;
          }
        }
      }
      size_t hier_across = 0, hier_within = 0;
      for (int r = 0; r < p; ++r) {
        for (const Step& st : hier_allreduce(hosts, r, n)) {
          if (st.send_to < 0) continue;
          ((st.send_to / local) != (r / local) ? hier_across : hier_within) += st.send.count;
        }
      }
      EXPECT_EQ(across, hier_across) << nhosts << "x" << local << " " << segments;
      EXPECT_EQ(within, hier_within) << nhosts << "x" << local << " " << segments;
    }
  }
}

}  // namespace
}  // namespace gw::coll
