// gw_comm_split through the real libgradwire.so: sub-communicators beside the parent with 1-8
// ranks as threads over the TCP store, and a world of one joining none (part of the capi_test
// binary).
#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/gradwire.h"
#include "tests/support/capi_ranks.h"
#include "tests/support/test_env.h"
#include "tests/unit/capi_test_util.h"

namespace {

using gw::testing::CleanEnv;
using namespace gw::testing::capi;

// --- gw_comm_split: ranks as threads over the TCP store ------------------------------------------

// Parent ranks of the communicator that `color` forms when parent rank r passes colors[r] and
// keys[r]: ordered by key, then by parent rank.
std::vector<int> split_members(const std::vector<int>& colors, const std::vector<int>& keys,
                               int color) {
  std::vector<int> m;
  for (int r = 0; r < static_cast<int>(colors.size()); ++r) {
    if (colors[r] == color) m.push_back(r);
  }
  std::stable_sort(m.begin(), m.end(), [&](int a, int b) { return keys[a] < keys[b]; });
  return m;
}

// First split: up to three colours, keys that reverse the parent's order, and (from four ranks on)
// rank 1 joining none.
int color_a(int rank, int world) {
  if (world >= 4 && rank == 1) return -1;
  return rank % std::min(world, 3);
}
int key_a(int rank, int world) { return world - rank; }
// Second split, taken while the first is alive: one colour with equal keys (the parent's order
// decides), the last rank of two or more joining none with a colour other than -1.
int color_b(int rank, int world) { return world > 1 && rank == world - 1 ? -7 : 5; }

// Checks that `sub` is the communicator the plan gives this rank; returns "" or what is wrong.
std::string check_membership(gw_comm_t sub, const std::vector<int>& members, int parent_rank) {
  int r = -1;
  int s = -1;
  if (gw_comm_rank(sub, &r) != GW_OK || gw_comm_size(sub, &s) != GW_OK) return gw_last_error();
  auto it = std::find(members.begin(), members.end(), parent_rank);
  const int want = static_cast<int>(it - members.begin());
  if (s != static_cast<int>(members.size()) || r != want) {
    return "rank " + std::to_string(r) + " of " + std::to_string(s) + ", expected " +
           std::to_string(want) + " of " + std::to_string(members.size());
  }
  return "";
}

// Every rank: split twice, then collectives on both sub-communicators interleaved with the parent
// (blocking and asynchronous), a split of a sub-communicator, and destruction in both orders
// (even ranks destroy the parent before their last use of the first sub-communicator).
void run_split_rank(int rank, int world, const std::string& addr, const char* transport,
                    RankResult* out) {
  gw_comm_t comm = init_checked_rank(rank, world, addr, transport, "capi-split-token", out);
  if (comm == nullptr) return;
  auto fail = [&](const std::string& what) {
    if (out->error.empty()) out->error = what + ": " + gw_last_error();
  };
  std::vector<int> colors(world);
  std::vector<int> keys(world);
  std::vector<int> colors_b(world);
  for (int r = 0; r < world; ++r) {
    colors[r] = color_a(r, world);
    keys[r] = key_a(r, world);
    colors_b[r] = color_b(r, world) < 0 ? -1 : color_b(r, world);
  }
  const std::vector<int> zeros(world, 0);
  const int my_color = color_a(rank, world);
  const std::vector<int> mine = split_members(colors, keys, my_color);
  const std::vector<int> mine_b = split_members(colors_b, zeros, color_b(rank, world));

  gw_comm_t a = reinterpret_cast<gw_comm_t>(0x1);
  const gw_status_t sa = gw_comm_split(comm, my_color, key_a(rank, world), &a);
  if (sa != GW_OK) fail("split a");
  if (my_color < 0) {
    if (a != nullptr) fail("split a with color -1 gave a communicator");
  } else if (a == nullptr) {
    fail("split a gave no communicator");
  } else {
    std::string m = check_membership(a, mine, rank);
    if (!m.empty()) fail("split a membership: " + m);
  }
  gw_comm_t b = reinterpret_cast<gw_comm_t>(0x1);
  if (gw_comm_split(comm, color_b(rank, world), 0, &b) != GW_OK) fail("split b");
  if (color_b(rank, world) < 0) {
    if (b != nullptr) fail("split b with a negative color gave a communicator");
  } else if (b == nullptr) {
    fail("split b gave no communicator");
  } else {
    std::string m = check_membership(b, mine_b, rank);
    if (!m.empty()) fail("split b membership: " + m);
  }
  if (!out->error.empty()) {
    gw_comm_destroy(a == reinterpret_cast<gw_comm_t>(0x1) ? nullptr : a);
    gw_comm_destroy(b == reinterpret_cast<gw_comm_t>(0x1) ? nullptr : b);
    gw_comm_destroy(comm);
    return;
  }

  // Interleaved: a, parent, b, a (async across a parent collective), parent.
  int64_t sum_a = 0;
  for (int p : mine) sum_a += 1000 + p;
  if (a != nullptr) {
    int64_t v = 1000 + rank;
    if (gw_allreduce(a, &v, &v, 1, GW_INT64, GW_SUM) != GW_OK) fail("allreduce on a");
    if (v != sum_a) fail("allreduce on a value " + std::to_string(v));
  }
  int64_t all = rank;
  if (gw_allreduce(comm, &all, &all, 1, GW_INT64, GW_SUM) != GW_OK) fail("allreduce on parent");
  if (all != static_cast<int64_t>(world) * (world - 1) / 2) fail("allreduce on parent value");
  if (b != nullptr) {
    std::vector<int32_t> g(mine_b.size(), -1);
    int32_t own = rank;
    if (gw_allgather(b, &own, g.data(), 1, GW_INT32) != GW_OK) fail("allgather on b");
    for (size_t i = 0; i < g.size(); ++i) {
      if (g[i] != mine_b[i]) fail("allgather on b: block " + std::to_string(i));
    }
  }
  if (a != nullptr) {
    // Blocks in the sub-communicator's order: its rank i holds parent rank mine[i].
    std::vector<int32_t> g(mine.size(), -1);
    int32_t own = rank;
    if (gw_allgather(a, &own, g.data(), 1, GW_INT32) != GW_OK) fail("allgather on a");
    for (size_t i = 0; i < g.size(); ++i) {
      if (g[i] != mine[i]) fail("allgather on a: block " + std::to_string(i));
    }
    std::vector<float> in(10007, static_cast<float>(rank + 1));
    std::vector<float> res(in.size());
    gw_request_t req = nullptr;
    if (gw_iallreduce(a, in.data(), res.data(), in.size(), GW_FLOAT32, GW_SUM, &req) != GW_OK) {
      fail("iallreduce on a");
    }
    if (gw_barrier(comm) != GW_OK) fail("barrier on parent while a works");
    if (req != nullptr && gw_wait(req, -1) != GW_OK) fail("wait on a");
    float want = 0;
    for (int p : mine) want += static_cast<float>(p + 1);
    if (res[10006] != want) fail("iallreduce on a value");
    int32_t root_value = static_cast<int32_t>(rank == mine.back() ? 77 : 0);
    if (gw_broadcast(a, &root_value, 1, GW_INT32, static_cast<int>(mine.size()) - 1) != GW_OK) {
      fail("broadcast on a");
    }
    if (root_value != 77) fail("broadcast on a value");
    // A split of a split: one colour, keys reversing a's order.
    int ar = -1;
    gw_comm_rank(a, &ar);
    gw_comm_t aa = nullptr;
    if (gw_comm_split(a, 0, -ar, &aa) != GW_OK || aa == nullptr) {
      fail("split of a");
    } else {
      int aar = -1;
      gw_comm_rank(aa, &aar);
      if (aar != static_cast<int>(mine.size()) - 1 - ar) fail("split of a: rank");
      int64_t v = 1000 + rank;
      if (gw_allreduce(aa, &v, &v, 1, GW_INT64, GW_SUM) != GW_OK || v != sum_a) {
        fail("allreduce on the split of a");
      }
      if (gw_comm_destroy(aa) != GW_OK) fail("destroy split of a");
    }
  } else {
    if (gw_barrier(comm) != GW_OK) fail("barrier on parent");
  }
  if (b != nullptr && gw_barrier(b) != GW_OK) fail("barrier on b");
  if (gw_barrier(comm) != GW_OK) fail("last barrier on parent");
  if (gw_comm_destroy(b) != GW_OK) fail("destroy b");

  // Either may go first: even ranks drop the parent before using a again.
  const bool parent_first = rank % 2 == 0;
  if (parent_first && gw_comm_destroy(comm) != GW_OK) fail("destroy parent");
  if (a != nullptr) {
    int64_t v = 1000 + rank;
    if (gw_allreduce(a, &v, &v, 1, GW_INT64, GW_SUM) != GW_OK) fail("allreduce on a at the end");
    if (v != sum_a) fail("allreduce on a at the end: value");
    if (gw_comm_destroy(a) != GW_OK) fail("destroy a");
  }
  if (!parent_first && gw_comm_destroy(comm) != GW_OK) fail("destroy parent");
  out->checked = true;
}

class SplitTest : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(SplitTest, SubCommunicatorsBesideTheParent) {
  CleanEnv env;
  auto [world, transport] = GetParam();
  run_checked_ranks(world, transport.c_str(), run_split_rank);
}

INSTANTIATE_TEST_SUITE_P(Worlds, SplitTest,
                         ::testing::Values(std::make_tuple(1, std::string("tcp")),
                                           std::make_tuple(2, std::string("tcp")),
                                           std::make_tuple(3, std::string("tcp")),
                                           std::make_tuple(4, std::string("tcp")),
                                           std::make_tuple(5, std::string("tcp")),
                                           std::make_tuple(6, std::string("auto")),
                                           std::make_tuple(7, std::string("tcp")),
                                           std::make_tuple(8, std::string("auto"))),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                  std::get<1>(info.param);
                         });

// A rank that passes color < 0 in a world of one gets NULL and GW_OK; the parent is unharmed.
TEST_F(SingleRankTest, SplitWithNegativeColorJoinsNone) {
  gw_comm_t sub = reinterpret_cast<gw_comm_t>(0x1234);
  EXPECT_GW(GW_OK, gw_comm_split(comm_, -1, 3, &sub));
  EXPECT_EQ(sub, nullptr);
  EXPECT_GW(GW_OK, gw_comm_split(comm_, 0, 3, &sub));
  ASSERT_NE(sub, nullptr);
  float x = 3;
  EXPECT_GW(GW_OK, gw_allreduce(sub, &x, &x, 1, GW_FLOAT32, GW_SUM));
  EXPECT_GW(GW_OK, gw_allreduce(comm_, &x, &x, 1, GW_FLOAT32, GW_SUM));
  EXPECT_EQ(x, 3.0f);
  EXPECT_GW(GW_OK, gw_comm_abort(sub));  // aborting the child leaves the parent usable
  EXPECT_GW(GW_ERR_ABORTED, gw_comm_split(sub, 0, 0, &sub));
  EXPECT_GW(GW_OK, gw_barrier(comm_));
  EXPECT_GW(GW_OK, gw_comm_destroy(sub));
}

}  // namespace
