// The allreduce algorithm table: when each entry applies, what the two-level cost model picks,
// GW_ALGO forcing an entry that does not apply, and the level figures from the configuration.
#include "collectives/algorithms.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/support/ranks.h"
#include "tests/support/schedule_sim.h"
#include "tests/support/test_env.h"

namespace gw::coll {
namespace {

using ::gw::testing::hosts_of;
using ::gw::testing::ScopedEnv;
using ::gw::testing::two_level;

// n ranks spread over hosts by `host_of`; the group of rank 0.
Group layout(const std::vector<int>& host_of) { return Group(0, host_of); }

TEST(Algorithms, TableNamesEveryAlgoOnce) {
  std::vector<std::string> names;
  for (const auto& a : allreduce_algorithms()) {
    names.emplace_back(a.name);
    EXPECT_EQ(a.name, algo_name(a.algo));
    EXPECT_EQ(find_allreduce_algorithm(a.name), &a);
    EXPECT_EQ(find_allreduce_algorithm(a.algo), &a);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"ring", "rhd", "host_ring", "hier", "hier_leader",
                                             "tree", "bblocks", "pair"}));
  EXPECT_EQ(find_allreduce_algorithm("auto"), nullptr);
}

TEST(Algorithms, WhenEachApplies) {
  auto applies = [](std::string_view name, const std::vector<int>& hosts) {
    return find_allreduce_algorithm(name)->applies(layout(hosts), 1024);
  };
  const auto one_host = hosts_of(1, 4), two_by_two = hosts_of(2, 2), one_each = hosts_of(4, 1);
  const std::vector<int> three_plus_one = {0, 0, 0, 1};
  for (const char* flat : {"ring", "rhd", "tree", "bblocks"}) {
    EXPECT_TRUE(applies(flat, one_host).ok()) << flat;
    EXPECT_TRUE(applies(flat, three_plus_one).ok()) << flat;
  }
  for (const char* topo : {"host_ring", "hier", "hier_leader"}) {
    Status s = applies(topo, one_host);
    EXPECT_EQ(s.code(), Code::kInvalidArg) << topo;
    EXPECT_NE(s.message().find("more than one host"), std::string::npos) << s.message();
    EXPECT_TRUE(applies(topo, two_by_two).ok()) << topo;
  }
  EXPECT_TRUE(applies("hier_leader", three_plus_one).ok());
  EXPECT_TRUE(applies("host_ring", three_plus_one).ok());
  Status uneven = applies("hier", three_plus_one);
  EXPECT_EQ(uneven.code(), Code::kInvalidArg);
  EXPECT_NE(uneven.message().find("same number of ranks on every host (ranks per host: 3+1)"),
            std::string::npos)
      << uneven.message();
  Status single = applies("hier", one_each);
  EXPECT_NE(single.message().find("more than one rank per host"), std::string::npos)
      << single.message();
}

TEST(Algorithms, CostModelPicksHierForLargeSizesOverSlowLinksWithManyLocalRanks) {
  const CostParams p = two_level();
  for (int per_host : {2, 4, 8}) {
    for (size_t bytes : {size_t{64} << 20, size_t{256} << 20}) {
      auto c = choose_allreduce(layout(hosts_of(2, per_host)), bytes, p, Algo::kAuto);
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      EXPECT_EQ(c->algorithm->algo, Algo::kHier)
          << per_host << " ranks per host, " << describe_choice(bytes, *c, 1);
      EXPECT_FALSE(c->forced);
    }
  }
  // Ranks numbered round-robin over the hosts: the flat ring crosses the link four times per
  // direction, the host-ordered ring once.
  std::vector<int> interleaved;
  for (int r = 0; r < 8; ++r) interleaved.push_back(r % 2);
  auto c = choose_allreduce(layout(interleaved), 64 << 20, p, Algo::kAuto);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->algorithm->algo, Algo::kHier);
  double ring = 0, host_ring = 0;
  for (auto [name, s] : c->costs) {
    if (name == "ring") ring = s;
    if (name == "host_ring") host_ring = s;
  }
  EXPECT_GT(ring, 3 * host_ring);
  // Uneven hosts: hier does not apply, the leader form does and beats the flat ring.
  auto uneven = choose_allreduce(layout({0, 0, 0, 1}), 64 << 20, p, Algo::kAuto);
  ASSERT_TRUE(uneven.ok());
  EXPECT_EQ(uneven->algorithm->algo, Algo::kHierLeader) << describe_choice(64 << 20, *uneven, 1);
}

// More flows crossing hosts at once than the CPUs they share (GW_COST_CPUS; namespace "hosts"
// of one machine count together): every rank of hier crosses at once, only the leaders of
// hier_leader, so small allreduces go to the leaders; large ones stay hier (the link dominates).
// Measured on the 2-core testbed at 2x2, 4 KiB: hier_leader 91 us, hier 113 us; at 1 MiB equal.
TEST(Algorithms, CpuContentionMovesSmallAllreducesToTheLeaders) {
  CostParams p = two_level();
  EXPECT_EQ(crossing_contention(p, 4), 1.0);  // cpus 0: not considered
  p.cpus = 2;
  p.kernel_hosts = 2;
  EXPECT_EQ(crossing_contention(p, 1), 1.0);
  EXPECT_EQ(crossing_contention(p, 2), 2.0);
  EXPECT_EQ(crossing_contention(p, 4), 4.0);
  EXPECT_NEAR(inter_link(p, 2).a, 2 * inter_link(p).a, 1e-12);
  EXPECT_EQ(inter_link(p, 2).b, inter_link(p).b);  // bandwidth is the link's, not the CPUs'
  const Group g = layout(hosts_of(2, 2));
  auto pick = [&](const CostParams& c, size_t bytes) {
    auto r = choose_allreduce(g, bytes, c, Algo::kAuto);
    EXPECT_TRUE(r.ok());
    return r.ok() ? r->algorithm->algo : Algo::kAuto;
  };
  EXPECT_EQ(pick(p, 4096), Algo::kHierLeader);
  EXPECT_EQ(pick(p, size_t{64} << 20), Algo::kHier);
  // The same hosts each with their own 2 CPUs (real hosts): no contention at 2 ranks per host.
  CostParams own = p;
  own.kernel_hosts = 1;
  EXPECT_EQ(crossing_contention(own, 2), 1.0);
  CostParams none = p;
  none.cpus = 0;
  EXPECT_EQ(pick(none, 4096), pick(own, 4096));
}

// Groups know which hosts share a kernel, through a split too.
TEST(Algorithms, GroupsCountTheHostsSharingAKernel) {
  auto run = [](const std::vector<std::string>& ids, int* whole, int* child) {
    auto store = make_memory_store();
    std::vector<int> w(ids.size()), c(ids.size());
    testing::run_threads(static_cast<int>(ids.size()), [&](int rank) {
      const auto r = static_cast<size_t>(rank);
      GroupOptions o;
      o.rank = rank;
      o.world_size = static_cast<int>(ids.size());
      o.store = store;
      o.job_token = "t";
      o.host_id = ids[r];
      auto g = Group::create(o, deadline_after_ms(5000));
      ASSERT_TRUE(g.ok()) << g.status().to_string();
      w[r] = g->max_hosts_per_kernel();
      auto s = g->split(static_cast<int>(r % 2), 0, deadline_after_ms(5000));
      ASSERT_TRUE(s.ok() && s->has_value());
      c[r] = (*s)->max_hosts_per_kernel();
    });
    *whole = w[0];
    *child = c[0];
    for (size_t r = 1; r < ids.size(); ++r) {
      EXPECT_EQ(w[r], w[0]);
      EXPECT_EQ(c[r], c[r % 2]);
    }
  };
  int whole = 0, child = 0;
  // Four namespace hosts of one machine, then two machines of two namespaces each.
  run({"m/b/netns:1", "m/b/netns:2", "m/b/netns:3", "m/b/netns:4"}, &whole, &child);
  EXPECT_EQ(whole, 4);
  EXPECT_EQ(child, 2);  // ranks 0 and 2: hosts netns:1 and netns:3
  run({"m/b/netns:1", "m/b/netns:2", "n/c/netns:1", "n/c/netns:2"}, &whole, &child);
  EXPECT_EQ(whole, 2);
  EXPECT_EQ(child, 1);  // ranks 0 and 2: one host on each machine
  run({"a", "b", "c", "d"}, &whole, &child);
  EXPECT_EQ(whole, 1);
  EXPECT_EQ(Group(0, {0, 0, 1, 1}).max_hosts_per_kernel(), 1);
}

TEST(Algorithms, CostModelPicksTreeForSmallSizesAtManyRanks) {
  CostParams shm{.alpha_us = 2, .bw_gbps = 8};
  for (int p : {12, 24, 33}) {
    auto c = choose_allreduce(layout(hosts_of(1, p)), 512, shm, Algo::kAuto);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->algorithm->algo, Algo::kTree) << p << " ranks: " << describe_choice(512, *c, 2);
  }
  // Large sizes stay on the bandwidth-optimal ones.
  auto big = choose_allreduce(layout(hosts_of(1, 24)), 64 << 20, shm, Algo::kAuto);
  ASSERT_TRUE(big.ok());
  EXPECT_NE(big->algorithm->algo, Algo::kTree);
  // Two ranks: pair, one message latency where the ring and the tree take two.
  auto two = choose_allreduce(layout(hosts_of(1, 2)), 512, shm, Algo::kAuto);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->algorithm->algo, Algo::kPair);
}

TEST(Algorithms, ForcedAlgorithmThatDoesNotApplySaysWhy) {
  auto c = choose_allreduce(layout(hosts_of(1, 4)), 4096, two_level(), Algo::kHier);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kInvalidArg);
  EXPECT_NE(c.status().message().find("GW_ALGO=hier"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("more than one host"), std::string::npos);
  auto ok = choose_allreduce(layout(hosts_of(2, 2)), 4096, two_level(), Algo::kHier);
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ok->forced);
  EXPECT_EQ(ok->algorithm->algo, Algo::kHier);
  EXPECT_NE(describe_choice(4096, *ok, 1).find("forced by GW_ALGO"), std::string::npos);
}

TEST(Algorithms, GwAlgoHierOnOneHostIsRefusedByTheCommunicator) {
  ScopedEnv env("GW_ALGO", "hier");
  testing::RankOptions ranks;
  ranks.timeout_ms = 10000;
  ranks.tweak = [](CommOptions& o, int) { o.host_id = "one-host"; };
  const std::vector<Status> status = testing::create_statuses(2, ranks);
  for (const Status& s : status) {
    EXPECT_EQ(s.code(), Code::kInvalidArg);
    EXPECT_NE(s.message().find("GW_ALGO=hier does not apply"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("all 2 ranks are on one host"), std::string::npos) << s.message();
  }
}

TEST(Algorithms, LevelFiguresFromTheConfiguration) {
  const LinkFigures shm{"shm", 2, 8}, tcp{"tcp", 30, 2};
  auto probed = cost_params_for_levels(tcp, shm, tcp);
  EXPECT_EQ(probed.intra_alpha_us, 2);
  EXPECT_EQ(probed.intra_bw_gbps, 8);
  EXPECT_EQ(probed.inter_alpha_us, 30);
  EXPECT_EQ(probed.inter_bw_gbps, 2);
  {
    // The flat override applies to both levels ...
    ScopedEnv a("GW_COST_ALPHA_US", "7");
    auto flat = cost_params_for_levels(tcp, shm, tcp);
    EXPECT_EQ(flat.intra_alpha_us, 7);
    EXPECT_EQ(flat.inter_alpha_us, 7);
    // ... and each level's own one wins over it.
    ScopedEnv ia("GW_COST_INTRA_ALPHA_US", "1.5");
    ScopedEnv ib("GW_COST_INTRA_BW_GBPS", "20");
    ScopedEnv ea("GW_COST_INTER_ALPHA_US", "50");
    ScopedEnv eb("GW_COST_INTER_BW_GBPS", "0.125");
    auto both = cost_params_for_levels(tcp, shm, tcp);
    EXPECT_EQ(both.intra_alpha_us, 1.5);
    EXPECT_EQ(both.intra_bw_gbps, 20);
    EXPECT_EQ(both.inter_alpha_us, 50);
    EXPECT_EQ(both.inter_bw_gbps, 0.125);
    EXPECT_EQ(both.alpha_us, 7);
  }
  // Unset levels fall back to the flat figures.
  CostParams flat_only{.alpha_us = 10, .bw_gbps = 1};
  EXPECT_DOUBLE_EQ(intra_link(flat_only).a, 10e-6);
  EXPECT_DOUBLE_EQ(inter_link(flat_only).b, 1e-9);
}

// Every algorithm that applies, forced, on ranks as threads over the in-process transport (a
// send completes only once its receive is posted, the strictest order) with host ids that lay
// the ranks out as given: int32 sum and max, in and out of place, odd counts and many chunks.
void run_every_algorithm(const std::vector<int>& host_of) {
  const int n = static_cast<int>(host_of.size());
  ScopedEnv chunk("GW_CHUNK_SIZE", "4K");
  for (const auto& algo : allreduce_algorithms()) {
    if (!algo.applies(layout(host_of), 0).ok()) continue;
    ScopedEnv env("GW_ALGO", std::string(algo.name).c_str());
    testing::RankOptions ranks;
    ranks.host_of = host_of;
    testing::run_ranks(n, ranks, [&](std::unique_ptr<Communicator>& comm, int r) {
      EXPECT_EQ(comm->choose_allreduce_algo(1 << 20), algo.algo);
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1001}, size_t{30001}}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
          for (bool in_place : {false, true}) {
            std::vector<int32_t> in(count), out(count, -1);
            for (size_t i = 0; i < count; ++i) in[i] = static_cast<int32_t>((i * 7 + r) % 1000);
            int32_t* recv = in_place ? in.data() : out.data();
            Status s = comm->allreduce(in.data(), recv, count, DataType::kI32, op);
            ASSERT_TRUE(s.ok()) << algo.name << ": " << s.to_string();
            for (size_t i = 0; i < count; ++i) {
              int32_t want = op == ReduceOp::kSum ? 0 : INT32_MIN;
              for (int q = 0; q < n; ++q) {
                const int32_t v = static_cast<int32_t>((i * 7 + q) % 1000);
                want = op == ReduceOp::kSum ? want + v : std::max(want, v);
              }
              ASSERT_EQ(recv[i], want) << algo.name << " rank " << r << " count " << count
                                       << " element " << i << (in_place ? " in place" : "");
            }
          }
        }
      }
    });
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(Algorithms, EveryAlgorithmIsExactOnTwoHostsOfTwo) { run_every_algorithm({0, 0, 1, 1}); }
TEST(Algorithms, EveryAlgorithmIsExactOnInterleavedHosts) {
  run_every_algorithm({0, 1, 0, 1, 0, 1});
}
TEST(Algorithms, EveryAlgorithmIsExactOnUnevenHosts) { run_every_algorithm({0, 0, 0, 1, 2, 2}); }
TEST(Algorithms, EveryAlgorithmIsExactOnOneHost) { run_every_algorithm({0, 0, 0, 0, 0}); }
// Two ranks: pair applies (in place through its copy of the input), on one host and on two.
TEST(Algorithms, EveryAlgorithmIsExactOnTwoRanks) {
  run_every_algorithm({0, 0});
  run_every_algorithm({0, 1});
}

// pair: only for 2 ranks; the model takes it for latency-bound sizes (one message latency where
// the ring takes two) and leaves large ones to the ring (it reduces the whole vector on each rank).
TEST(Algorithms, PairIsForTwoRanksAndLatencyBoundSizes) {
  const AllreduceAlgorithm* pair = find_allreduce_algorithm("pair");
  ASSERT_NE(pair, nullptr);
  EXPECT_TRUE(pair->applies(layout({0, 0}), 0).ok());
  EXPECT_TRUE(pair->applies(layout({0, 1}), 0).ok());
  Status s = pair->applies(layout({0, 0, 1}), 0);
  EXPECT_EQ(s.code(), Code::kInvalidArg);
  EXPECT_NE(s.message().find("needs exactly 2 ranks (this communicator has 3)"), std::string::npos)
      << s.message();
  CostParams shm{.alpha_us = 1, .bw_gbps = 10, .reduce_gbps = 8};
  auto pick = [&](const std::vector<int>& hosts, size_t bytes, const CostParams& p) {
    auto c = choose_allreduce(layout(hosts), bytes, p, Algo::kAuto);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return std::string(c.ok() ? (*c).algorithm->name : "");
  };
  EXPECT_EQ(pick({0, 0}, 4096, shm), "pair");
  EXPECT_EQ(pick({0, 0}, 64 << 20, shm), "ring");
  CostParams tcp{.alpha_us = 20, .bw_gbps = 1, .reduce_gbps = 8};
  EXPECT_EQ(pick({0, 1}, 64 << 10, tcp), "pair");
  EXPECT_EQ(pick({0, 1}, 64 << 20, tcp), "ring");
  EXPECT_NE(pick({0, 0, 0, 0}, 4096, shm), "pair");
}

// The pipelined hier over many segments (small chunks make many segments of a few chunks each,
// up to the most there may be): int32 exact for sum and max, float32 and float64 sums
// bit-identical on every rank, uneven counts.
TEST(Algorithms, HierPipelineIsExactAndBitIdenticalAcrossRanks) {
  ScopedEnv algo("GW_ALGO", "hier");
  for (const std::vector<int>& host_of :
       {std::vector<int>{0, 0, 1, 1}, {0, 1, 0, 1, 0, 1}, {0, 0, 0, 1, 1, 1, 2, 2, 2}}) {
    for (const char* chunk_size : {"4K", "12K"}) {
      ScopedEnv chunk("GW_CHUNK_SIZE", chunk_size);
      const int n = static_cast<int>(host_of.size());
      const std::vector<size_t> counts = {100003, 65536 * 3 + 5};
      // outputs[r][c]: rank r's float32 and float64 results for counts[c], as bytes.
      std::vector<std::vector<std::vector<uint8_t>>> f32(n), f64(n);
      testing::RankOptions ranks;
      ranks.host_of = host_of;
      testing::run_ranks(n, ranks, [&](std::unique_ptr<Communicator>& comm, int r) {
        for (size_t count : counts) {
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
            std::vector<int32_t> v(count);
            for (size_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>((i * 13 + r) % 977);
            ASSERT_TRUE(comm->allreduce(v.data(), v.data(), count, DataType::kI32, op).ok());
            for (size_t i = 0; i < count; ++i) {
              int32_t want = op == ReduceOp::kSum ? 0 : INT32_MIN;
              for (int q = 0; q < n; ++q) {
                const auto x = static_cast<int32_t>((i * 13 + q) % 977);
                want = op == ReduceOp::kSum ? want + x : std::max(want, x);
              }
              ASSERT_EQ(v[i], want) << "rank " << r << " count " << count << " element " << i;
            }
          }
          // Values whose sums round differently in different orders.
          std::vector<float> a(count), ao(count);
          std::vector<double> b(count), bo(count);
          for (size_t i = 0; i < count; ++i) {
            a[i] = 1.0f / static_cast<float>(1 + (i * 31 + static_cast<size_t>(r) * 7) % 1013);
            b[i] = 1.0 / static_cast<double>(3 + (i * 17 + static_cast<size_t>(r) * 11) % 2039);
          }
          ASSERT_TRUE(
              comm->allreduce(a.data(), ao.data(), count, DataType::kF32, ReduceOp::kSum).ok());
          ASSERT_TRUE(
              comm->allreduce(b.data(), bo.data(), count, DataType::kF64, ReduceOp::kSum).ok());
          const auto* pa = reinterpret_cast<const uint8_t*>(ao.data());
          const auto* pb = reinterpret_cast<const uint8_t*>(bo.data());
          f32[r].emplace_back(pa, pa + count * sizeof(float));
          f64[r].emplace_back(pb, pb + count * sizeof(double));
          for (size_t i = 0; i < count; i += 997) {
            double want = 0;
            for (int q = 0; q < n; ++q) {
              want += 1.0 / static_cast<double>(1 + (i * 31 + static_cast<size_t>(q) * 7) % 1013);
            }
            ASSERT_NEAR(ao[i], want, 1e-5 * want) << "rank " << r << " element " << i;
          }
        }
      });
      if (HasFailure()) return;
      for (int r = 1; r < n; ++r) {
        for (size_t c = 0; c < counts.size(); ++c) {
          EXPECT_TRUE(f32[r][c] == f32[0][c]) << "float32 differs on rank " << r << " count "
                                              << counts[c] << ", chunk " << chunk_size;
          EXPECT_TRUE(f64[r][c] == f64[0][c]) << "float64 differs on rank " << r << " count "
                                              << counts[c] << ", chunk " << chunk_size;
        }
      }
    }
  }
}

}  // namespace
}  // namespace gw::coll
