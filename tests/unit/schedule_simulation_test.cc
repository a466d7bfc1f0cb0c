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
#include "tests/support/test_env.h"

namespace gw::coll {
namespace {

using gw::testing::kSimMaxRanks;

struct Message {
  int id;
  std::vector<int64_t> data;
};

struct RankState {
  Schedule sched;
  std::vector<int64_t> input;
  std::vector<int64_t> output;
  size_t next = 0;
  bool sent = false;  // the current step's send is posted
};

// Applies all schedules in lock-step rounds; fails the test on a mismatch or a deadlock.
void simulate(std::vector<RankState>& ranks) {
  const int p = static_cast<int>(ranks.size());
  std::map<std::pair<int, int>, std::deque<Message>> wire;
  auto do_send = [&](int r, const Step& st) {
    const auto& src = st.send_from_input ? ranks[r].input : ranks[r].output;
    ASSERT_LE(st.send.offset + st.send.count, src.size()) << describe(st);
    Message m{st.id, std::vector<int64_t>(src.begin() + st.send.offset,
                                          src.begin() + st.send.offset + st.send.count)};
    wire[{r, st.send_to}].push_back(std::move(m));
  };
  for (int round = 0;; ++round) {
    bool progress = false, all_done = true;
    for (int r = 0; r < p; ++r) {
      RankState& rs = ranks[r];
      if (rs.next >= rs.sched.size()) continue;
      all_done = false;
      const Step& st = rs.sched[rs.next];
      ASSERT_TRUE(st.send_to >= 0 || st.recv_from >= 0) << "empty " << describe(st);
      ASSERT_NE(st.send_to, r);
      ASSERT_NE(st.recv_from, r);
      if (!st.forward && st.send_to >= 0 && st.recv_from >= 0 && st.send.count && st.recv.count) {
        // The executor posts both at once, so they must not overlap.
        const bool disjoint = st.send.offset + st.send.count <= st.recv.offset ||
                              st.recv.offset + st.recv.count <= st.send.offset;
        ASSERT_TRUE(disjoint) << "rank " << r << " " << describe(st);
      }
      if (st.send_to >= 0 && !st.forward && !rs.sent) {
        do_send(r, st);
        rs.sent = true;
        progress = true;
      }
      if (st.recv_from >= 0) {
        auto& q = wire[{st.recv_from, r}];
        if (q.empty()) continue;
        Message m = std::move(q.front());
        q.pop_front();
        ASSERT_EQ(m.id, st.id) << "rank " << r << " got a message of another step; "
                               << describe(st);
        ASSERT_EQ(m.data.size(), st.recv.count) << "rank " << r << " " << describe(st);
        ASSERT_LE(st.recv.offset + st.recv.count, rs.output.size());
        int64_t* out = rs.output.data() + st.recv.offset;
        if (st.action == RecvAction::kReduce) {
          const int64_t* local =
              (st.reduce_with_input ? rs.input.data() : rs.output.data()) + st.recv.offset;
          reduce(DataType::kI64, ReduceOp::kSum, local, m.data.data(), out, m.data.size());
        } else if (!m.data.empty()) {
          std::memcpy(out, m.data.data(), m.data.size() * sizeof(int64_t));
        }
      }
      if (st.send_to >= 0 && st.forward) do_send(r, st);
      rs.next++;
      rs.sent = false;
      progress = true;
    }
    if (all_done) break;
    ASSERT_TRUE(progress) << "deadlock in round " << round;
  }
  for (auto& [pair, q] : wire) {
    ASSERT_TRUE(q.empty()) << "unreceived message " << pair.first << "->" << pair.second;
  }
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

std::string layout_name(const HostRanks& hosts) {
  std::string out;
  for (const auto& h : hosts) out += (out.empty() ? "" : "+") + std::to_string(h.size());
  return out;
}

// Host-major (ranks 0..L-1 on host 0, ...) and interleaved (rank r on host r % H) numberings of
// a layout given by its host sizes.
std::vector<HostRanks> numberings(const std::vector<int>& sizes) {
  std::vector<HostRanks> out(2);
  int next = 0;
  for (int n : sizes) {
    out[0].emplace_back();
    for (int i = 0; i < n; ++i) out[0].back().push_back(next++);
  }
  std::vector<int> host_of;
  std::vector<int> left = sizes;
  for (bool any = true; any;) {
    any = false;
    for (size_t h = 0; h < left.size(); ++h) {
      if (left[h] > 0) {
        host_of.push_back(static_cast<int>(h));
        --left[h];
        any = true;
      }
    }
  }
  out[1] = hosts_from_map(host_of);
  return out;
}

std::vector<std::vector<int>> uneven_layouts() {
  std::vector<std::vector<int>> all = {{3, 1}, {1, 3},       {2, 2, 1}, {1, 1, 1}, {5, 3, 2},
                                       {1, 7}, {4, 4, 4, 1}, {16, 17},  {1},       {6}};
  std::mt19937 rng(7);
  for (int t = 0; t < 12; ++t) {
    std::vector<int> sizes;
    int total = 0;
    const int hosts = 1 + static_cast<int>(rng() % 6);
    for (int h = 0; h < hosts && total < 33; ++h) {
      const int n = 1 + static_cast<int>(rng() % std::min(8, 33 - total));
      sizes.push_back(n);
      total += n;
    }
    all.push_back(sizes);
  }
  return all;
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

// Finished-step counts of every plan of one rank that the dependencies (each plan's own order,
// Step::after_plan) guarantee before each step starts: start[l][i][m] steps of plan m.
std::vector<std::vector<std::vector<size_t>>> guaranteed_before(const std::vector<Plan>& plans) {
  const size_t np = plans.size();
  std::vector<std::vector<std::vector<size_t>>> start(np);
  std::vector<std::vector<bool>> known(np);
  for (size_t l = 0; l < np; ++l) {
    start[l].assign(plans[l].sched.size(), std::vector<size_t>(np, 0));
    known[l].assign(plans[l].sched.size(), false);
  }
  // Dependencies are acyclic when the plans can finish at all: sweep until every step is known.
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t l = 0; l < np; ++l) {
      for (size_t i = 0; i < plans[l].sched.size(); ++i) {
        if (known[l][i]) continue;
        std::vector<size_t> v(np, 0);
        if (i > 0) {
          if (!known[l][i - 1]) continue;
          v = start[l][i - 1];
          v[l] = i;
        }
        const Step& st = plans[l].sched[i];
        if (st.after_plan >= 0 && st.after_steps > 0) {
          const auto m = static_cast<size_t>(st.after_plan);
          if (!known[m][st.after_steps - 1]) continue;
          const auto& w = start[m][st.after_steps - 1];
          for (size_t q = 0; q < np; ++q) v[q] = std::max(v[q], w[q]);
          v[m] = std::max(v[m], st.after_steps);
        }
        start[l][i] = v;
        known[l][i] = true;
        changed = true;
      }
    }
  }
  for (size_t l = 0; l < np; ++l) {
    for (size_t i = 0; i < known[l].size(); ++i) {
      EXPECT_TRUE(known[l][i]) << "plan " << l << " step " << i << " waits in a cycle";
    }
  }
  return start;
}

bool overlap(size_t a_off, size_t a_count, size_t b_off, size_t b_count) {
  return a_count && b_count && a_off < b_off + b_count && b_off < a_off + a_count;
}

// Two steps of different plans of one rank that may run at the same time (neither is ordered
// before the other) must not touch a range the other writes. Input and output are taken as one
// buffer (in place), the stricter case.
void expect_no_races(const std::vector<Plan>& plans, const std::string& what) {
  const auto start = guaranteed_before(plans);
  for (size_t a = 0; a < plans.size(); ++a) {
    for (size_t b = a + 1; b < plans.size(); ++b) {
      for (size_t i = 0; i < plans[a].sched.size(); ++i) {
        for (size_t j = 0; j < plans[b].sched.size(); ++j) {
          if (start[b][j][a] > i || start[a][i][b] > j) continue;  // ordered
          const Step& x = plans[a].sched[i];
          const Step& y = plans[b].sched[j];
          const size_t xb = plans[a].base, yb = plans[b].base;
          const bool xw = x.recv_from >= 0, yw = y.recv_from >= 0;
          const bool xs = x.send_to >= 0, ys = y.send_to >= 0;
          bool race = false;
          if (xw && yw)
            race |= overlap(xb + x.recv.offset, x.recv.count, yb + y.recv.offset, y.recv.count);
          if (xw && ys)
            race |= overlap(xb + x.recv.offset, x.recv.count, yb + y.send.offset, y.send.count);
          if (xs && yw)
            race |= overlap(xb + x.send.offset, x.send.count, yb + y.recv.offset, y.recv.count);
          ASSERT_FALSE(race) << what << ": plan " << a << " " << describe(x) << " and plan " << b
                             << " " << describe(y) << " may run at once";
        }
      }
    }
  }
}

struct PlanRank {
  std::vector<Plan> plans;
  std::vector<size_t> next;
  std::vector<bool> sent;
  std::vector<int64_t> input, output;
};

// simulate() for several plans per rank: messages queue per (sender, receiver, channel), a
// plan's step starts once the plan it waits for is far enough, and the plans of a rank are
// visited in a shuffled order every round so that they interleave differently.
void simulate_plans(std::vector<PlanRank>& ranks, uint32_t seed) {
  const int p = static_cast<int>(ranks.size());
  std::mt19937 rng(seed);
  std::map<std::tuple<int, int, int>, std::deque<Message>> wire;
  for (int round = 0;; ++round) {
    bool progress = false, all_done = true;
    for (int r = 0; r < p; ++r) {
      PlanRank& rs = ranks[r];
      std::vector<size_t> order(rs.plans.size());
      std::iota(order.begin(), order.end(), size_t{0});
      std::shuffle(order.begin(), order.end(), rng);
      for (size_t l : order) {
        const Plan& plan = rs.plans[l];
        if (rs.next[l] >= plan.sched.size()) continue;
        all_done = false;
        const Step& st = plan.sched[rs.next[l]];
        if (st.after_plan >= 0 && rs.next[static_cast<size_t>(st.after_plan)] < st.after_steps) {
          continue;
        }
        ASSERT_TRUE(st.send_to >= 0 || st.recv_from >= 0) << "empty " << describe(st);
        ASSERT_NE(st.send_to, r);
        ASSERT_NE(st.recv_from, r);
        ASSERT_FALSE(st.forward);
        if (st.send_to >= 0 && st.recv_from >= 0) {
          ASSERT_FALSE(overlap(st.send.offset, st.send.count, st.recv.offset, st.recv.count))
              << "rank " << r << " " << describe(st);
        }
        if (st.send_to >= 0 && !rs.sent[l]) {
          const auto& src = st.send_from_input ? rs.input : rs.output;
          const size_t off = plan.base + st.send.offset;
          ASSERT_LE(off + st.send.count, src.size()) << describe(st);
          wire[{r, st.send_to, plan.chan}].push_back(Message{
              st.id, std::vector<int64_t>(src.begin() + off, src.begin() + off + st.send.count)});
          rs.sent[l] = true;
          progress = true;
        }
        if (st.recv_from >= 0) {
          auto& q = wire[{st.recv_from, r, plan.chan}];
          if (q.empty()) continue;
          Message m = std::move(q.front());
          q.pop_front();
          ASSERT_EQ(m.id, st.id) << "rank " << r << " plan " << l
                                 << " got a message of another step; " << describe(st);
          ASSERT_EQ(m.data.size(), st.recv.count) << "rank " << r << " " << describe(st);
          const size_t off = plan.base + st.recv.offset;
          ASSERT_LE(off + st.recv.count, rs.output.size());
          int64_t* out = rs.output.data() + off;
          if (st.action == RecvAction::kReduce) {
            const int64_t* local =
                (st.reduce_with_input ? rs.input.data() : rs.output.data()) + off;
            reduce(DataType::kI64, ReduceOp::kSum, local, m.data.data(), out, m.data.size());
          } else if (!m.data.empty()) {
            std::memcpy(out, m.data.data(), m.data.size() * sizeof(int64_t));
          }
        }
        rs.next[l]++;
        rs.sent[l] = false;
        progress = true;
      }
    }
    if (all_done) break;
    ASSERT_TRUE(progress) << "deadlock in round " << round;
  }
  for (auto& [key, q] : wire) {
    ASSERT_TRUE(q.empty()) << "unreceived message " << std::get<0>(key) << "->" << std::get<1>(key)
                           << " on channel " << std::get<2>(key);
  }
}

void check_plans_sum(int p, size_t count, bool in_place,
                     const std::function<std::vector<Plan>(int)>& make, const std::string& what,
                     uint32_t seed, bool check_races) {
  std::vector<PlanRank> ranks(p);
  for (int r = 0; r < p; ++r) {
    PlanRank& rs = ranks[r];
    rs.plans = make(r);
    rs.next.assign(rs.plans.size(), 0);
    rs.sent.assign(rs.plans.size(), false);
    rs.input.resize(count);
    for (size_t i = 0; i < count; ++i) rs.input[i] = value(r, i);
    rs.output = in_place ? rs.input : std::vector<int64_t>(count, -777);
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
    for (size_t i = 0; i < count; ++i) {
      int64_t want = 0;
      for (int q = 0; q < p; ++q) want += value(q, i);
      ASSERT_EQ(ranks[r].output[i], want)
          << what << " rank " << r << " element " << i << (in_place ? " in place" : "");
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
