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
#include "tests/support/test_env.h"

namespace gw::coll {
namespace {

using gw::testing::kSimMaxRanks;

constexpr DataType kAllTypes[] = {DataType::kF32, DataType::kF64, DataType::kF16, DataType::kBF16,
                                  DataType::kI32, DataType::kI64, DataType::kU8};

void encode(DataType t, double v, uint8_t* p) {
  switch (t) {
    case DataType::kF32: {
      const auto x = static_cast<float>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case DataType::kF64:
      std::memcpy(p, &v, 8);
      break;
    case DataType::kF16: {
      const uint16_t h = float_to_half(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case DataType::kBF16: {
      const uint16_t h = float_to_bf16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case DataType::kI32: {
      const auto x = static_cast<int32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case DataType::kI64: {
      const auto x = static_cast<int64_t>(v);
      std::memcpy(p, &x, 8);
      break;
    }
    case DataType::kU8:
      *p = static_cast<uint8_t>(v);
      break;
  }
}

double decode(DataType t, const uint8_t* p) {
  switch (t) {
    case DataType::kF32: {
      float x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case DataType::kF64: {
      double x;
      std::memcpy(&x, p, 8);
      return x;
    }
    case DataType::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return half_to_float(h);
    }
    case DataType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return bf16_to_float(h);
    }
    case DataType::kI32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case DataType::kI64: {
      int64_t x;
      std::memcpy(&x, p, 8);
      return static_cast<double>(x);
    }
    case DataType::kU8:
      return *p;
  }
  return 0;
}

// 0..3 (33 ranks sum to at most 99: exact in every dtype, u8 and bf16 included); 1 + ... for the
// broadcast so that a zeroed buffer never passes.
double value(int rank, size_t i) { return static_cast<double>((rank * 7 + i * 3 + i / 5) % 4); }

struct Message {
  int id;
  std::vector<uint8_t> data;
};

struct SimRank {
  std::vector<Plan> plans;
  std::vector<size_t> next;
  std::vector<bool> sent;
  std::vector<uint8_t> input, output;
};

// Runs every rank's plans to the end; fails the test on a mismatch, a deadlock or a message left
// unreceived.
void simulate(std::vector<SimRank>& ranks, DataType dtype, ReduceOp op, uint32_t seed) {
  const int p = static_cast<int>(ranks.size());
  const size_t es = dtype_size(dtype);
  std::mt19937 rng(seed);
  std::map<std::tuple<int, int, int>, std::deque<Message>> wire;
  for (int r = 0; r < p; ++r) {
    SimRank& rs = ranks[r];
    rs.next.assign(rs.plans.size(), 0);
    rs.sent.assign(rs.plans.size(), false);
    // Two plans on one channel must not talk to the same peer (their messages would mix).
    std::set<std::tuple<int, int, bool>> used;  // (channel, peer, send)
    for (size_t l = 0; l < rs.plans.size(); ++l) {
      std::set<std::tuple<int, int, bool>> mine;
      for (const Step& st : rs.plans[l].sched) {
        if (st.send_to >= 0) mine.insert({rs.plans[l].chan, st.send_to, true});
        if (st.recv_from >= 0) mine.insert({rs.plans[l].chan, st.recv_from, false});
      }
      for (const auto& k : mine) {
        ASSERT_TRUE(used.insert(k).second) << "rank " << r << ": two plans use channel "
                                           << std::get<0>(k) << " to rank " << std::get<1>(k);
      }
    }
  }
  auto do_send = [&](int r, const Plan& plan, const Step& st) {
    const auto& src = st.send_from_input ? ranks[r].input : ranks[r].output;
    const size_t off = (plan.base + st.send.offset) * es;
    ASSERT_LE(off + st.send.count * es, src.size()) << describe(st);
    wire[{r, st.send_to, plan.chan}].push_back(Message{
        st.id, std::vector<uint8_t>(src.begin() + off, src.begin() + off + st.send.count * es)});
  };
  for (int round = 0;; ++round) {
    bool progress = false, all_done = true;
    for (int r = 0; r < p; ++r) {
      SimRank& rs = ranks[r];
      std::vector<size_t> order(rs.plans.size());
      std::iota(order.begin(), order.end(), size_t{0});
      std::shuffle(order.begin(), order.end(), rng);
      for (size_t l : order) {
        const Plan& plan = rs.plans[l];
        if (rs.next[l] >= plan.sched.size()) continue;
        all_done = false;
        const Step& st = plan.sched[rs.next[l]];
        if (st.after_plan >= 0) {
          ASSERT_LT(static_cast<size_t>(st.after_plan), rs.plans.size()) << describe(st);
          ASSERT_LE(st.after_steps, rs.plans[st.after_plan].sched.size()) << describe(st);
          if (rs.next[static_cast<size_t>(st.after_plan)] < st.after_steps) continue;
        }
        ASSERT_TRUE(st.send_to >= 0 || st.recv_from >= 0) << "empty " << describe(st);
        ASSERT_NE(st.send_to, r);
        ASSERT_NE(st.recv_from, r);
        if (!st.forward && st.send_to >= 0 && st.recv_from >= 0 && st.send.count && st.recv.count) {
          const bool disjoint = st.send.offset + st.send.count <= st.recv.offset ||
                                st.recv.offset + st.recv.count <= st.send.offset;
          ASSERT_TRUE(disjoint) << "rank " << r << " " << describe(st);
        }
        if (st.forward) {
          ASSERT_EQ(st.send, st.recv) << describe(st);
        }
        if (st.send_to >= 0 && !st.forward && !rs.sent[l]) {
          do_send(r, plan, st);
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
          ASSERT_EQ(m.data.size(), st.recv.count * es) << "rank " << r << " " << describe(st);
          const size_t off = (plan.base + st.recv.offset) * es;
          ASSERT_LE(off + m.data.size(), rs.output.size());
          uint8_t* out = rs.output.data() + off;
          if (st.action == RecvAction::kReduce) {
            const uint8_t* local =
                (st.reduce_with_input ? rs.input.data() : rs.output.data()) + off;
            reduce(dtype, op, local, m.data.data(), out, st.recv.count);
          } else if (!m.data.empty()) {
            std::memcpy(out, m.data.data(), m.data.size());
          }
        }
        if (st.send_to >= 0 && st.forward) do_send(r, plan, st);
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

std::vector<Plan> one_plan(Schedule s) {
  std::vector<Plan> plans(1);
  plans[0].sched = std::move(s);
  return plans;
}

std::string layout_name(const HostRanks& hosts) {
  std::string out;
  for (const auto& h : hosts) out += (out.empty() ? "" : "+") + std::to_string(h.size());
  return out;
}

// Host-major (ranks 0..L-1 on host 0, ...) and interleaved (rank r on the next host that has
// room) numberings of a layout given by its host sizes.
std::vector<HostRanks> numberings(const std::vector<int>& sizes) {
  std::vector<HostRanks> out(2);
  int next = 0;
  for (int n : sizes) {
    out[0].emplace_back();
    for (int i = 0; i < n; ++i) out[0].back().push_back(next++);
  }
  std::vector<int> host_of, left = sizes;
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

std::vector<std::vector<int>> uniform_layouts() {
  std::vector<std::vector<int>> all;
  for (int nhosts = 1; nhosts <= kSimMaxRanks; ++nhosts) {
    for (int local = 1; nhosts * local <= kSimMaxRanks; ++local) all.emplace_back(nhosts, local);
  }
  return all;
}

std::vector<std::vector<int>> uneven_layouts() {
  std::vector<std::vector<int>> all = {{3, 1}, {1, 3},       {2, 2, 1}, {5, 3, 2},
                                       {1, 7}, {4, 4, 4, 1}, {16, 17}};
  std::mt19937 rng(11);
  for (int t = 0; t < 10; ++t) {
    std::vector<int> sizes;
    int total = 0;
    const int hosts = 2 + static_cast<int>(rng() % 5);
    for (int h = 0; h < hosts && total < 33; ++h) {
      const int n = 1 + static_cast<int>(rng() % std::min(8, 33 - total));
      sizes.push_back(n);
      total += n;
    }
    all.push_back(sizes);
  }
  return all;
}

int nranks_of(const HostRanks& hosts) {
  int p = 0;
  for (const auto& h : hosts) p += static_cast<int>(h.size());
  return p;
}

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

bool overlap(const Range& a, const Range& b) {
  return a.count && b.count && a.offset < b.offset + b.count && b.offset < a.offset + a.count;
}

// Two steps of different plans of one rank that may run at the same time must not touch a range
// the other writes (input and output taken as one buffer, the stricter case).
void expect_no_races(const std::vector<Plan>& plans, const std::string& what) {
  const auto start = guaranteed_before(plans);
  for (size_t a = 0; a < plans.size(); ++a) {
    for (size_t b = a + 1; b < plans.size(); ++b) {
      for (size_t i = 0; i < plans[a].sched.size(); ++i) {
        for (size_t j = 0; j < plans[b].sched.size(); ++j) {
          if (start[b][j][a] > i || start[a][i][b] > j) continue;  // ordered
          const Step& x = plans[a].sched[i];
          const Step& y = plans[b].sched[j];
          auto at = [](const Plan& p, const Range& r) { return Range{p.base + r.offset, r.count}; };
          bool race = false;
          if (x.recv_from >= 0 && y.recv_from >= 0)
            race |= overlap(at(plans[a], x.recv), at(plans[b], y.recv));
          if (x.recv_from >= 0 && y.send_to >= 0)
            race |= overlap(at(plans[a], x.recv), at(plans[b], y.send));
          if (x.send_to >= 0 && y.recv_from >= 0)
            race |= overlap(at(plans[a], x.send), at(plans[b], y.recv));
          ASSERT_FALSE(race) << what << ": plan " << a << " " << describe(x) << " and plan " << b
                             << " " << describe(y) << " may run at once";
        }
      }
    }
  }
}

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
