// The broadcast, allgather and reduce-scatter algorithm tables: when each entry applies, what the
// two-level cost model picks, GW_ALGO_BROADCAST / _ALLGATHER / _REDUCE_SCATTER (validation,
// forcing, refusing an entry that does not apply), and every entry forced on ranks as threads
// over the in-process transport with host ids that lay them out, for every dtype.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/communicator_impl.h"
#include "collectives/reduce.h"
#include "core/config.h"
#include "tests/support/ranks.h"
#include "tests/support/schedule_sim.h"
#include "tests/support/test_env.h"

namespace gw::coll {
namespace {

using ::gw::testing::encode;
using ::gw::testing::hosts_of;
using ::gw::testing::kAllTypes;
using ::gw::testing::ScopedEnv;
using ::gw::testing::two_level;

constexpr Collective kKinds[] = {Collective::kBroadcast, Collective::kAllgather,
                                 Collective::kReduceScatter};

Group layout(const std::vector<int>& host_of) { return Group(0, host_of); }

double cost_of(const CollectiveChoice& c, std::string_view name) {
  for (auto [n, s] : c.costs) {
    if (n == name) return s;
  }
  return -1;
}

TEST(CollectiveAlgorithms, TablesNameRingThenHier) {
  for (Collective kind : kKinds) {
    std::vector<std::string> names;
    for (const auto& a : collective_algorithms(kind)) {
      names.emplace_back(a.name);
      EXPECT_EQ(a.name, algo_name(a.algo));
      EXPECT_EQ(find_collective_algorithm(kind, a.name), &a);
      EXPECT_EQ(find_collective_algorithm(kind, a.algo), &a);
    }
    EXPECT_EQ(names, (std::vector<std::string>{"ring", "hier"})) << collective_name(kind);
    EXPECT_EQ(find_collective_algorithm(kind, "rhd"), nullptr);
    EXPECT_EQ(*parse_collective_algo(kind, "auto"), Algo::kAuto);
    EXPECT_EQ(*parse_collective_algo(kind, "hier"), Algo::kHier);
    auto bad = parse_collective_algo(kind, "rhd");
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find(std::string(collective_algo_row(kind)) +
                                          "=rhd: expected one of auto, ring, hier"),
              std::string::npos)
        << bad.status().message();
  }
}

TEST(CollectiveAlgorithms, HierAppliesOnlyToEqualHostsOfSeveralRanks) {
  for (Collective kind : kKinds) {
    auto applies = [&](std::string_view name, const std::vector<int>& hosts) {
      return find_collective_algorithm(kind, name)->applies(layout(hosts), 1024);
    };
    for (const auto& hosts : {hosts_of(1, 4), hosts_of(2, 2), std::vector<int>{0, 0, 0, 1}}) {
      EXPECT_TRUE(applies("ring", hosts).ok());
    }
    EXPECT_TRUE(applies("hier", hosts_of(2, 2)).ok());
    EXPECT_TRUE(applies("hier", {0, 1, 2, 0, 1, 2}).ok());
    Status one = applies("hier", hosts_of(1, 4));
    EXPECT_NE(one.message().find("more than one host"), std::string::npos) << one.message();
    Status uneven = applies("hier", {0, 0, 0, 1});
    EXPECT_NE(uneven.message().find("same number of ranks on every host (ranks per host: 3+1)"),
              std::string::npos)
        << uneven.message();
    Status single = applies("hier", hosts_of(4, 1));
    EXPECT_NE(single.message().find("more than one rank per host"), std::string::npos)
        << single.message();
  }
}

// The pipelined forms count segments as their builders cut them: with the call's chunk, not the
// executor's default. Smaller chunks mean more segments: more message latencies, less fill time.
TEST(CollectiveAlgorithms, HierCostsFollowTheCallsChunk) {
  CostParams big = two_level();
  CostParams small = two_level();
  small.chunk_bytes = 4096;
  const Group g = layout(hosts_of(2, 2));
  const size_t bytes = size_t{64} << 20;
  for (Collective kind : {Collective::kAllgather, Collective::kReduceScatter}) {
    auto a = choose_collective(kind, g, bytes, big, Algo::kAuto);
    auto b = choose_collective(kind, g, bytes, small, Algo::kAuto);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_NE(cost_of(*a, "hier"), cost_of(*b, "hier")) << collective_name(kind);
    EXPECT_EQ(cost_of(*a, "ring"), cost_of(*b, "ring")) << "the flat ring is not pipelined";
  }
  // The element size does not change the segment count (both count in elements).
  CostParams half = two_level();
  half.elem_bytes = 2;
  auto f32 = choose_collective(Collective::kAllgather, g, bytes, big, Algo::kAuto);
  auto f16 = choose_collective(Collective::kAllgather, g, bytes, half, Algo::kAuto);
  ASSERT_TRUE(f32.ok() && f16.ok());
  EXPECT_DOUBLE_EQ(cost_of(*f32, "hier"), cost_of(*f16, "hier"));
}

TEST(CollectiveAlgorithms, CostModelPicksHierWhenTheHostLinkIsTheBottleneck) {
  const CostParams p = two_level();
  for (auto [nhosts, local] : {std::pair{2, 2}, {2, 4}, {4, 2}, {3, 3}}) {
    for (size_t bytes : {size_t{1} << 20, size_t{64} << 20, size_t{256} << 20}) {
      for (Collective kind : {Collective::kAllgather, Collective::kReduceScatter}) {
        auto c = choose_collective(kind, layout(hosts_of(nhosts, local)), bytes, p, Algo::kAuto);
        ASSERT_TRUE(c.ok()) << c.status().to_string();
        EXPECT_EQ(c->algorithm->algo, Algo::kHier)
            << nhosts << "x" << local << " " << describe_choice(kind, bytes, *c, 2);
        // The flat ring carries (p-1)/p of the buffer over the link, hier (H-1)/H.
        const double pr = nhosts * local;
        if (bytes == size_t{256} << 20) {
          EXPECT_GT(cost_of(*c, "ring") / cost_of(*c, "hier"),
                    0.9 * ((pr - 1) / pr) / ((nhosts - 1.0) / nhosts))
              << describe_choice(kind, bytes, *c, 2);
        }
      }
      // Broadcast: a chain over host-major ranks already enters every host once, so the two
      // cost the same and the ring (first in the table) stays; over interleaved ranks the flat
      // chain crosses the link at every hop and hier wins.
      auto major = choose_collective(Collective::kBroadcast, layout(hosts_of(nhosts, local)), bytes,
                                     p, Algo::kAuto);
      ASSERT_TRUE(major.ok());
      EXPECT_EQ(major->algorithm->algo, Algo::kRing);
      EXPECT_DOUBLE_EQ(cost_of(*major, "ring"), cost_of(*major, "hier"));
      std::vector<int> interleaved;
      for (int r = 0; r < nhosts * local; ++r) interleaved.push_back(r % nhosts);
      auto inter =
          choose_collective(Collective::kBroadcast, layout(interleaved), bytes, p, Algo::kAuto);
      ASSERT_TRUE(inter.ok());
      EXPECT_EQ(inter->algorithm->algo, Algo::kHier)
          << describe_choice(Collective::kBroadcast, bytes, *inter, 1);
    }
  }
  // One host, or uneven hosts: only the ring applies.
  for (const auto& hosts : {hosts_of(1, 4), std::vector<int>{0, 0, 0, 1}}) {
    for (Collective kind : kKinds) {
      auto c = choose_collective(kind, layout(hosts), 64 << 20, p, Algo::kAuto);
      ASSERT_TRUE(c.ok());
      EXPECT_EQ(c->algorithm->algo, Algo::kRing);
      EXPECT_EQ(c->costs.size(), 1u);
    }
  }
}

TEST(CollectiveAlgorithms, ForcedAlgorithmThatDoesNotApplySaysWhy) {
  for (Collective kind : kKinds) {
    auto c = choose_collective(kind, layout({0, 0, 0, 1}), 4096, two_level(), Algo::kHier);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), Code::kInvalidArg);
    EXPECT_NE(
        c.status().message().find(std::string(collective_algo_row(kind)) + "=hier does not apply"),
        std::string::npos)
        << c.status().message();
    auto none = choose_collective(kind, layout(hosts_of(2, 2)), 4096, two_level(), Algo::kRhd);
    EXPECT_EQ(none.status().code(), Code::kInvalidArg);
    auto ok = choose_collective(kind, layout(hosts_of(2, 2)), 4096, two_level(), Algo::kRing);
    ASSERT_TRUE(ok.ok());
    EXPECT_TRUE(ok->forced);
    EXPECT_NE(describe_choice(kind, 4096, *ok, 1)
                  .find("forced by " + std::string(collective_algo_row(kind))),
              std::string::npos);
  }
}

TEST(CollectiveAlgorithms, RowsRefuseUnknownNames) {
  for (const char* row : {"GW_ALGO_BROADCAST", "GW_ALGO_ALLGATHER", "GW_ALGO_REDUCE_SCATTER"}) {
    {
      ScopedEnv env(row, "bblocks");
      Status s = config::validate();
      EXPECT_EQ(s.code(), Code::kInvalidArg) << row;
      EXPECT_NE(s.message().find(row), std::string::npos) << s.message();
      EXPECT_NE(s.message().find("expected one of auto, ring, hier"), std::string::npos)
          << s.message();
    }
    ScopedEnv env(row, "hier");
    EXPECT_TRUE(config::validate().ok()) << row;
  }
}

// ---- ranks as threads ------------------------------------------------------------------------

// Small integers: every dtype's sums and maxima of up to 9 ranks are exact.
double value(int rank, size_t i) { return static_cast<double>((rank * 5 + i * 3 + i / 7) % 4); }

std::vector<uint8_t> encoded(DataType t, size_t n, const std::function<double(size_t)>& v) {
  const size_t es = dtype_size(t);
  std::vector<uint8_t> out(n * es);
  for (size_t i = 0; i < n; ++i) encode(t, v(i), &out[i * es]);
  return out;
}

// `kind` with its row forced to every entry that applies on `host_of` (the in-process transport:
// a send completes only once its receive is posted, the strictest order), every dtype, odd counts
// and many chunks (4K chunks: hier runs many segments); broadcast from every root, allgather in
// and out of place, reduce-scatter with sum, max and min.
void run_every_algorithm(Collective kind, const std::vector<int>& host_of) {
  const int n = static_cast<int>(host_of.size());
  ScopedEnv chunk("GW_CHUNK_SIZE", "4K");
  for (const auto& algo : collective_algorithms(kind)) {
    if (!algo.applies(layout(host_of), 0).ok()) continue;
    ScopedEnv env(std::string(collective_algo_row(kind)).c_str(), std::string(algo.name).c_str());
    testing::RankOptions ranks;
    ranks.host_of = host_of;
    testing::run_ranks(n, ranks, [&](std::unique_ptr<Communicator>& comm, int r) {
      const std::string what = std::string(collective_name(kind)) + " " + std::string(algo.name) +
                               " rank " + std::to_string(r);
      for (DataType dt : kAllTypes) {
        const size_t es = dtype_size(dt);
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1001}, size_t{9001}}) {
          if (kind == Collective::kBroadcast) {
            for (int root = 0; root < n; ++root) {
              auto want = encoded(dt, count, [&](size_t i) { return 1 + value(root, i); });
              std::vector<uint8_t> buf = r == root ? want : std::vector<uint8_t>(count * es, 0);
              Status s = comm->broadcast(buf.data(), count, dt, root);
              ASSERT_TRUE(s.ok()) << what << ": " << s.to_string();
              ASSERT_TRUE(buf == want)
                  << what << " root " << root << " count " << count << " " << dtype_name(dt);
            }
          } else if (kind == Collective::kAllgather) {
            std::vector<uint8_t> want;
            for (int q = 0; q < n; ++q) {
              auto b = encoded(dt, count, [&](size_t i) { return value(q, i); });
              want.insert(want.end(), b.begin(), b.end());
            }
            auto mine = encoded(dt, count, [&](size_t i) { return value(r, i); });
            for (bool in_place : {false, true}) {
              std::vector<uint8_t> out(want.size(), 0xEE);
              const void* send = mine.data();
              if (in_place && count > 0) {
                std::memcpy(out.data() + r * count * es, mine.data(), mine.size());
                send = out.data() + r * count * es;
              }
              Status s = comm->allgather(send, out.data(), count, dt);
              ASSERT_TRUE(s.ok()) << what << ": " << s.to_string();
              ASSERT_TRUE(out == want) << what << " count " << count << " " << dtype_name(dt)
                                       << (in_place ? " in place" : "");
            }
          } else {
            for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
              const size_t total = count * static_cast<size_t>(n);
              auto in = encoded(dt, total, [&](size_t i) { return value(r, i); });
              auto want = encoded(dt, count, [&](size_t i) {
                const size_t e = static_cast<size_t>(r) * count + i;
                double w = value(0, e);
                for (int q = 1; q < n; ++q) {
                  const double v = value(q, e);
                  w = op == ReduceOp::kSum   ? w + v
                      : op == ReduceOp::kMax ? std::max(w, v)
                                             : std::min(w, v);
                }
                return w;
              });
              std::vector<uint8_t> out(count * es, 0xEE);
              Status s = comm->reduce_scatter(in.data(), out.data(), count, dt, op);
              ASSERT_TRUE(s.ok()) << what << ": " << s.to_string();
              ASSERT_TRUE(out == want)
                  << what << " count " << count << " " << dtype_name(dt) << " " << op_name(op);
            }
          }
        }
      }
    });
    if (::testing::Test::HasFailure()) return;
  }
}

class CollectiveAlgorithmsOnLayouts : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(CollectiveAlgorithmsOnLayouts, BroadcastIsExact) {
  run_every_algorithm(Collective::kBroadcast, GetParam());
}
TEST_P(CollectiveAlgorithmsOnLayouts, AllgatherIsExact) {
  run_every_algorithm(Collective::kAllgather, GetParam());
}
TEST_P(CollectiveAlgorithmsOnLayouts, ReduceScatterIsExact) {
  run_every_algorithm(Collective::kReduceScatter, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Layouts, CollectiveAlgorithmsOnLayouts,
                         ::testing::Values(std::vector<int>{0, 0, 1, 1},
                                           std::vector<int>{0, 1, 0, 1, 0, 1},
                                           std::vector<int>{0, 0, 0, 1, 1, 1, 2, 2, 2},
                                           std::vector<int>{0, 0, 0, 1}, std::vector<int>{0, 0, 0}),
                         [](const auto& info) {
                           std::string name;
                           for (int h : info.param) name += std::to_string(h);
                           return "hosts_" + name;
                         });

// A forced hier on uneven hosts is refused when the communicator is made, on every rank, saying
// which row and why.
TEST(CollectiveAlgorithms, ForcedHierOnUnevenHostsIsRefusedByTheCommunicator) {
  for (Collective kind : kKinds) {
    const std::string row(collective_algo_row(kind));
    ScopedEnv env(row.c_str(), "hier");
    testing::RankOptions ranks;
    ranks.host_of = {0, 0, 0, 1};
    for (const Status& s : testing::create_statuses(4, ranks)) {
      EXPECT_EQ(s.code(), Code::kInvalidArg) << row;
      EXPECT_NE(s.message().find(row + "=hier does not apply"), std::string::npos) << s.message();
      EXPECT_NE(s.message().find("ranks per host: 3+1"), std::string::npos) << s.message();
    }
  }
}

}  // namespace
}  // namespace gw::coll
