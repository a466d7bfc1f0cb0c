// Broadcast, allgather and reduce-scatter schedules of every entry of their algorithm tables (the
// flat ring ones and the host-aware ones), run entirely in memory for 1..33 ranks over many host
// layouts (every uniform one, host-major and interleaved numberings, and uneven ones where the
// schedule allows them), for every dtype: each rank's plans run their steps in order (a step
// that waits for another plan starts once that plan is far enough), messages travel as bytes
// through FIFO queues per (sender, receiver, channel) and carry the step id, receivers check the
// id and the byte count as the executor does, and the plans of a rank are visited in a shuffled
// order every round. Values are small integers, so every dtype's sums and maxima are exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "collectives/reduce.h"
#include "collectives/schedule.h"
#include "collectives/types.h"
#include "tests/support/schedule_sim.h"
#include "tests/support/test_env.h"

namespace gw::coll {
namespace {

using gw::testing::decode;
using gw::testing::encode;
using gw::testing::expect_no_races;
using gw::testing::kAllTypes;
using gw::testing::kSimMaxRanks;
using gw::testing::layout_name;
using gw::testing::nranks_of;
using gw::testing::numberings;
using gw::testing::one_plan;
using gw::testing::SimRank;
using gw::testing::simulate;
using gw::testing::uniform_layouts;

// This suite's uneven layouts: a few fixed ones and 10 drawn, of 2 to 6 hosts.
std::vector<std::vector<int>> uneven_layouts() {
  return gw::testing::uneven_layouts(
      {{3, 1}, {1, 3}, {2, 2, 1}, {5, 3, 2}, {1, 7}, {4, 4, 4, 1}, {16, 17}}, 11, 10, 2);
}

// 0..3 (33 ranks sum to at most 99: exact in every dtype, u8 and bf16 included); 1 + ... for the
// broadcast so that a zeroed buffer never passes.
double value(int rank, size_t i) { return static_cast<double>((rank * 7 + i * 3 + i / 5) % 4); }

// ---- checks --------------------------------------------------------------------------------

using MakePlans = std::function<std::vector<Plan>(int rank)>;

void check_broadcast(int p, int root, size_t count, DataType dt, const MakePlans& make,
                     const std::string& what, uint32_t seed) {
  const size_t es = dtype_size(dt);
  std::vector<SimRank> ranks(p);
  for (int r = 0; r < p; ++r) {
    ranks[r].plans = make(r);
    ranks[r].output.assign(count * es, 0xA5);
    if (r == root) {
      for (size_t i = 0; i < count; ++i) encode(dt, 1 + value(root, i), &ranks[r].output[i * es]);
    }
  }
  simulate(ranks, dt, ReduceOp::kSum, seed);
  if (::testing::Test::HasFatalFailure()) {
    ADD_FAILURE() << what;
    return;
  }
  for (int r = 0; r < p; ++r) {
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(decode(dt, &ranks[r].output[i * es]), 1 + value(root, i))
          << what << " rank " << r << " element " << i << " " << dtype_name(dt);
    }
  }
}

void check_allgather(int p, size_t per, DataType dt, const MakePlans& make, const std::string& what,
                     uint32_t seed) {
  const size_t es = dtype_size(dt);
  std::vector<SimRank> ranks(p);
  for (int r = 0; r < p; ++r) {
    ranks[r].plans = make(r);
    ranks[r].output.assign(static_cast<size_t>(p) * per * es, 0xA5);
    for (size_t i = 0; i < per; ++i) encode(dt, value(r, i), &ranks[r].output[(r * per + i) * es]);
  }
  simulate(ranks, dt, ReduceOp::kSum, seed);
  if (::testing::Test::HasFatalFailure()) {
    ADD_FAILURE() << what;
    return;
  }
  for (int r = 0; r < p; ++r) {
    for (int q = 0; q < p; ++q) {
      for (size_t i = 0; i < per; ++i) {
        ASSERT_EQ(decode(dt, &ranks[r].output[(q * per + i) * es]), value(q, i))
            << what << " rank " << r << " block " << q << " element " << i << " " << dtype_name(dt);
      }
    }
  }
}

// Each rank's input holds p blocks of `per`; rank r must end with block r reduced over every
// rank at r x per of its output.
void check_reduce_scatter(int p, size_t per, DataType dt, ReduceOp op, const MakePlans& make,
                          const std::string& what, uint32_t seed) {
  const size_t es = dtype_size(dt), n = static_cast<size_t>(p) * per;
  std::vector<SimRank> ranks(p);
  for (int r = 0; r < p; ++r) {
    ranks[r].plans = make(r);
    ranks[r].input.resize(n * es);
    for (size_t i = 0; i < n; ++i) encode(dt, value(r, i), &ranks[r].input[i * es]);
    ranks[r].output.assign(n * es, 0xA5);
  }
  simulate(ranks, dt, op, seed);
  if (::testing::Test::HasFatalFailure()) {
    ADD_FAILURE() << what;
    return;
  }
  if (p == 1) return;  // no steps: the Communicator copies the input
  for (int r = 0; r < p; ++r) {
    for (size_t i = r * per; i < (r + 1) * per; ++i) {
      double want = value(0, i);
      for (int q = 1; q < p; ++q) {
        const double v = value(q, i);
        want = op == ReduceOp::kSum   ? want + v
               : op == ReduceOp::kMax ? std::max(want, v)
                                      : std::min(want, v);
      }
      ASSERT_EQ(decode(dt, &ranks[r].output[i * es]), want)
          << what << " rank " << r << " element " << i << " " << dtype_name(dt) << " "
          << op_name(op);
    }
  }
}

// ---- flat rings ------------------------------------------------------------------------------

TEST(CollectiveSchedules, FlatRingsEveryDtypeUpTo33Ranks) {
  uint32_t seed = 1;
  for (int p = 1; p <= 33; ++p) {
    for (DataType dt : kAllTypes) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{13}}) {
        const std::string what = "p=" + std::to_string(p) + " n=" + std::to_string(n);
        for (int root : {0, p / 2, p - 1}) {
          check_broadcast(
              p, root, n * static_cast<size_t>(p), dt,
              [&](int r) { return one_plan(chain_broadcast(r, p, root, n * p)); },
              "ring broadcast root " + std::to_string(root) + " " + what, seed++);
          if (HasFatalFailure()) return;
        }
        check_allgather(
            p, n, dt, [&](int r) { return one_plan(ring_allgather(r, p, n)); },
            "ring allgather " + what, seed++);
        if (HasFatalFailure()) return;
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
          check_reduce_scatter(
              p, n, dt, op, [&](int r) { return one_plan(ring_reduce_scatter(r, p, n * p)); },
              "ring reduce_scatter " + what, seed++);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// ---- host-aware -------------------------------------------------------------------------------

TEST(CollectiveSchedules, HostChainBroadcastOnUniformAndUnevenLayouts) {
  auto layouts = uniform_layouts();
  for (const auto& u : uneven_layouts()) layouts.push_back(u);
  uint32_t seed = 1;
  for (const auto& sizes : layouts) {
    for (const HostRanks& hosts : numberings(sizes)) {
      const int p = nranks_of(hosts);
      // The chain lists every rank once, the root first, each host's ranks together.
      for (int root = 0; root < p; root += std::max(1, p / 4)) {
        const std::vector<int> chain = host_chain(hosts, root);
        ASSERT_EQ(static_cast<int>(chain.size()), p);
        ASSERT_EQ(chain[0], root);
        std::vector<int> sorted = chain;
        std::sort(sorted.begin(), sorted.end());
        for (int i = 0; i < p; ++i) ASSERT_EQ(sorted[i], i);
        const auto host_of = [&](int r) {
          for (size_t h = 0; h < hosts.size(); ++h) {
            if (std::find(hosts[h].begin(), hosts[h].end(), r) != hosts[h].end()) return h;
          }
          return hosts.size();
        };
        size_t changes = 0;
        for (int i = 1; i < p; ++i) changes += host_of(chain[i]) != host_of(chain[i - 1]);
        EXPECT_EQ(changes, hosts.size() - 1) << layout_name(hosts) << " root " << root;
        for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kU8, DataType::kI64}) {
          for (size_t n : {size_t{0}, size_t{1}, size_t{37}}) {
            check_broadcast(
                p, root, n, dt,
                [&](int r) { return one_plan(host_chain_broadcast(hosts, r, root, n)); },
                "host chain broadcast " + layout_name(hosts) + " root " + std::to_string(root) +
                    " n=" + std::to_string(n),
                seed++);
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

TEST(CollectiveSchedules, HierAllgatherOnEveryUniformLayoutUpTo33Ranks) {
  uint32_t seed = 1;
  for (const auto& sizes : uniform_layouts()) {
    for (const HostRanks& hosts : numberings(sizes)) {
      ASSERT_TRUE(uniform_hosts(hosts));
      const int p = nranks_of(hosts);
      auto run = [&](DataType dt, size_t per, int segments) {
        check_allgather(
            p, per, dt, [&](int r) { return hier_allgather(hosts, r, per, segments); },
            "hier allgather " + layout_name(hosts) + " per=" + std::to_string(per) + " " +
                std::to_string(segments) + " segments",
            seed++);
      };
      for (DataType dt : kAllTypes) {
        run(dt, 7, 3);
        if (HasFatalFailure()) return;
      }
      for (size_t per : {size_t{0}, size_t{1}, size_t{40}}) {
        for (int segments : {1, 2, 5}) {
          run(DataType::kI64, per, segments);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(CollectiveSchedules, HierReduceScatterOnEveryUniformLayoutUpTo33Ranks) {
  uint32_t seed = 1;
  for (const auto& sizes : uniform_layouts()) {
    for (const HostRanks& hosts : numberings(sizes)) {
      const int p = nranks_of(hosts);
      auto run = [&](DataType dt, ReduceOp op, size_t per, int segments) {
        check_reduce_scatter(
            p, per, dt, op, [&](int r) { return hier_reduce_scatter(hosts, r, per, segments); },
            "hier reduce_scatter " + layout_name(hosts) + " per=" + std::to_string(per) + " " +
                std::to_string(segments) + " segments",
            seed++);
      };
      for (DataType dt : kAllTypes) {
        run(dt, ReduceOp::kSum, 7, 3);
        if (HasFatalFailure()) return;
      }
      for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin}) {
        run(DataType::kF16, op, 5, 2);
        if (HasFatalFailure()) return;
      }
      for (size_t per : {size_t{0}, size_t{1}, size_t{40}}) {
        for (int segments : {1, 2, 5}) {
          run(DataType::kI64, ReduceOp::kSum, per, segments);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// ---- shape ----------------------------------------------------------------------------------

// Elements that leave host 0 over all of its ranks' plans.
size_t out_of_host0(const HostRanks& hosts, const MakePlans& make) {
  size_t out = 0;
  const auto& h0 = hosts[0];
  for (int r : h0) {
    for (const Plan& plan : make(r)) {
      for (const Step& st : plan.sched) {
        if (st.send_to >= 0 && std::find(h0.begin(), h0.end(), st.send_to) == h0.end()) {
          out += st.send.count;
        }
      }
    }
  }
  return out;
}

// A host's link carries (H-1)/H x the whole buffer per direction in the hierarchical forms, and
// (p-1)/p x it in a flat ring over host-major ranks; the host chain broadcast carries it once.
TEST(CollectiveShape, HierSendsLessAcrossHosts) {
  for (auto [nhosts, local] : {std::pair{2, 2}, {2, 4}, {4, 2}, {3, 3}}) {
    const int p = nhosts * local;
    const size_t per = 1 << 12, n = per * static_cast<size_t>(p);
    const std::string what = std::to_string(nhosts) + "x" + std::to_string(local);
    for (int numbering = 0; numbering < 2; ++numbering) {
      const HostRanks hosts = numberings(std::vector<int>(nhosts, local))[numbering];
      for (int segments : {1, 4}) {
        const double hier_ag =
            out_of_host0(hosts, [&](int r) { return hier_allgather(hosts, r, per, segments); });
        const double hier_rs = out_of_host0(
            hosts, [&](int r) { return hier_reduce_scatter(hosts, r, per, segments); });
        EXPECT_DOUBLE_EQ(hier_ag, static_cast<double>(n) * (nhosts - 1) / nhosts) << what;
        EXPECT_DOUBLE_EQ(hier_rs, static_cast<double>(n) * (nhosts - 1) / nhosts) << what;
      }
      const double bcast = out_of_host0(
          hosts, [&](int r) { return one_plan(host_chain_broadcast(hosts, r, 0, n)); });
      EXPECT_EQ(bcast, static_cast<double>(n)) << what;
    }
    const HostRanks major = numberings(std::vector<int>(nhosts, local))[0];
    const double flat_ag =
        out_of_host0(major, [&](int r) { return one_plan(ring_allgather(r, p, per)); });
    EXPECT_DOUBLE_EQ(flat_ag, static_cast<double>(n) * (p - 1) / p) << what;
  }
}

// ---- plans that run together: no races ------------------------------------------------------

TEST(CollectiveShape, HierPlansNeverTouchWhatTheOtherPlanWritesAtOnce) {
  for (const auto& sizes : uniform_layouts()) {
    const HostRanks hosts = numberings(sizes)[1];
    const int p = nranks_of(hosts);
    if (p > 12) continue;  // quadratic in the steps; the small layouts have every shape
    for (int segments : {1, 3, 6}) {
      for (int r = 0; r < p; ++r) {
        const std::string what = layout_name(hosts) + " " + std::to_string(segments) +
                                 " segments rank " + std::to_string(r);
        expect_no_races(hier_allgather(hosts, r, 10, segments), "allgather " + what);
        if (HasFatalFailure()) return;
        expect_no_races(hier_reduce_scatter(hosts, r, 10, segments), "reduce_scatter " + what);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Every rank receives in every schedule, so a count mismatch reaches it (schedule.h).
TEST(CollectiveShape, HostAwareSchedulesMakeEveryRankReceive) {
  for (const auto& sizes : uniform_layouts()) {
    for (const HostRanks& hosts : numberings(sizes)) {
      const int p = nranks_of(hosts);
      if (p < 2) continue;
      for (int r = 0; r < p; ++r) {
        std::vector<std::pair<std::string, std::vector<Plan>>> all = {
            {"allgather", hier_allgather(hosts, r, 3, 2)},
            {"reduce_scatter", hier_reduce_scatter(hosts, r, 3, 2)},
            {"broadcast", one_plan(host_chain_broadcast(hosts, r, p - 1, 3))}};
        for (const auto& [name, plans] : all) {
          bool receives = false;
          for (const Plan& plan : plans)
            for (const Step& st : plan.sched) receives |= st.recv_from >= 0;
          EXPECT_TRUE(receives) << name << " " << layout_name(hosts) << ": rank " << r;
        }
      }
    }
  }
}

}  // namespace
}  // namespace gw::coll
