#include "tests/support/schedule_sim.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <tuple>
#include <utility>

#include "collectives/reduce.h"
#include "tests/support/test_env.h"

namespace gw::testing {

using namespace ::gw::coll;  // NOLINT: the simulator speaks the schedules' vocabulary

namespace {

struct Message {
  int id;
  std::vector<uint8_t> data;
};

}  // namespace

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
  for (const auto& h : hosts) {
    if (!out.empty()) out += '+';
    out += std::to_string(h.size());
  }
  return out;
}

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

std::vector<std::vector<int>> uneven_layouts(std::vector<std::vector<int>> fixed, uint32_t seed,
                                             int random, int min_hosts) {
  std::vector<std::vector<int>> all = std::move(fixed);
  std::mt19937 rng(seed);
  for (int t = 0; t < random; ++t) {
    std::vector<int> sizes;
    int total = 0;
    const int hosts = min_hosts + static_cast<int>(rng() % static_cast<uint32_t>(7 - min_hosts));
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

std::vector<int> hosts_of(int nhosts, int per_host) {
  std::vector<int> h;
  for (int i = 0; i < nhosts; ++i) h.insert(h.end(), per_host, i);
  return h;
}

CostParams two_level() {
  return CostParams{.alpha_us = 30,
                    .bw_gbps = 0.125,
                    .reduce_gbps = 8,
                    .intra_alpha_us = 2,
                    .intra_bw_gbps = 8,
                    .inter_alpha_us = 30,
                    .inter_bw_gbps = 0.125};
}

// Dependencies are acyclic when the plans can finish at all: sweep until every step is known.
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

namespace {

bool overlap(const Range& a, const Range& b) {
  return a.count && b.count && a.offset < b.offset + b.count && b.offset < a.offset + a.count;
}

}  // namespace

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

}  // namespace gw::testing
