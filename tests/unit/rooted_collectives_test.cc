// gw_reduce, gw_gather, gw_scatter and gw_alltoallv through the C ABI (direct mode), ranks as
// threads: 1..8 ranks, every dtype, every kind of root, the tree and the chain reduce, in place,
// uneven all-to-all-v splits from random seeds, bad arguments, ranks that disagree (every rank
// fails, none hangs), and daemon mode on one trainer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/capi_world.h"
#include "tests/support/local_daemon.h"

namespace {

using gw::testing::get_elem;
using gw::testing::gw_dtype_bytes;
using gw::testing::kAllDtypes;
using gw::testing::last_error;
using gw::testing::put_elem;
using gw::testing::RankErrors;
using gw::testing::run_world;

// Rank r's element i: small, so that sums over 8 ranks stay exact in every dtype.
int value(int r, size_t i) { return static_cast<int>((r + i) % 5) + 1; }

std::vector<uint8_t> filled(gw_dtype_t d, size_t count, int r, int salt = 0) {
  std::vector<uint8_t> b(std::max<size_t>(1, count * gw_dtype_bytes(d)));
  for (size_t i = 0; i < count; ++i) put_elem(d, b.data(), i, value(r + salt, i));
  return b;
}

std::vector<int> roots_of(int world) {
  std::vector<int> roots = {0, world - 1, world / 2};
  std::sort(roots.begin(), roots.end());
  roots.erase(std::unique(roots.begin(), roots.end()), roots.end());
  return roots;
}

// Reduces count elements of every dtype to every kind of root with sum and max, in place too.
void check_reduce(gw_comm_t c, int rank, int world, RankErrors& e, size_t count,
                  const std::vector<gw_dtype_t>& dtypes) {
  for (gw_dtype_t d : dtypes) {
    for (int root : roots_of(world)) {
      for (gw_op_t op : {GW_SUM, GW_MAX}) {
        for (bool in_place : {false, true}) {
          auto in = filled(d, count, rank);
          std::vector<uint8_t> out(in.size(), 0xEE);
          void* recv = in_place && rank == root ? in.data() : out.data();
          GW_CHECK_RANK(rank, e, gw_reduce(c, in.data(), recv, count, d, op, root));
          if (rank != root) continue;
          for (size_t i = 0; i < count; ++i) {
            int want = 0;
            for (int r = 0; r < world; ++r) {
              want = op == GW_SUM ? want + value(r, i) : std::max(want, value(r, i));
            }
            const int got = get_elem(d, recv, i);
            if (got != want) {
              e.add(rank, "reduce dtype " + std::to_string(d) + " root " + std::to_string(root) +
                              " op " + std::to_string(op) + " count " + std::to_string(count) +
                              " element " + std::to_string(i) + ": " + std::to_string(got) +
                              " != " + std::to_string(want));
              return;
            }
          }
        }
      }
    }
  }
}

TEST(RootedCollectivesTest, ReduceEveryDtypeRootAndWorldOneToEight) {
  const std::vector<gw_dtype_t> all(std::begin(kAllDtypes), std::end(kAllDtypes));
  for (int world : {1, 2, 3, 5, 8}) {
    SCOPED_TRACE("world " + std::to_string(world));
    run_world(world, "auto", 60000, [&](gw_comm_t c, int rank, int w, RankErrors& e) {
      check_reduce(c, rank, w, e, 37, all);
      check_reduce(c, rank, w, e, 0, {GW_FLOAT32});
    });
  }
}

// Large buffers take the pipelined chain (many chunks), small ones the binomial tree.
TEST(RootedCollectivesTest, ReduceLargeBuffersOverTheChain) {
  for (const char* transport : {"tcp", "shm"}) {
    SCOPED_TRACE(transport);
    run_world(4, transport, 60000, [&](gw_comm_t c, int rank, int w, RankErrors& e) {
      check_reduce(c, rank, w, e, 700000, {GW_FLOAT32, GW_UINT8});
    });
  }
}

void check_gather_scatter(gw_comm_t c, int rank, int world, RankErrors& e, size_t count) {
  const auto p = static_cast<size_t>(world);
  for (gw_dtype_t d : kAllDtypes) {
    const size_t es = gw_dtype_bytes(d);
    for (int root : roots_of(world)) {
      for (bool in_place : {false, true}) {
        // gather: rank r sends value(r + 7, i); the root's block r must hold it.
        auto mine = filled(d, count, rank, 7);
        std::vector<uint8_t> all(std::max<size_t>(1, p * count * es), 0xEE);
        const void* send = mine.data();
        if (in_place && rank == root) {
          std::copy(mine.begin(), mine.begin() + count * es, all.begin() + rank * count * es);
          send = all.data() + rank * count * es;
        }
        GW_CHECK_RANK(rank, e,
                      gw_gather(c, send, rank == root ? all.data() : nullptr, count, d, root));
        if (rank == root) {
          for (int r = 0; r < world; ++r) {
            for (size_t i = 0; i < count; ++i) {
              if (get_elem(d, all.data() + r * count * es, i) != value(r + 7, i)) {
                e.add(rank, "gather dtype " + std::to_string(d) + " root " + std::to_string(root) +
                                ": block " + std::to_string(r) + " element " + std::to_string(i));
                return;
              }
            }
          }
        }
        // scatter: the root's block r holds value(r + 3, i).
        std::vector<uint8_t> src(std::max<size_t>(1, p * count * es));
        for (int r = 0; r < world; ++r) {
          for (size_t i = 0; i < count; ++i) {
            put_elem(d, src.data() + r * count * es, i, value(r + 3, i));
          }
        }
        std::vector<uint8_t> got(std::max<size_t>(1, count * es), 0xEE);
        void* recv = in_place && rank == root ? src.data() + rank * count * es : got.data();
        GW_CHECK_RANK(rank, e,
                      gw_scatter(c, rank == root ? src.data() : nullptr, recv, count, d, root));
        for (size_t i = 0; i < count; ++i) {
          if (get_elem(d, recv, i) != value(rank + 3, i)) {
            e.add(rank, "scatter dtype " + std::to_string(d) + " root " + std::to_string(root) +
                            " element " + std::to_string(i));
            return;
          }
        }
      }
    }
  }
}

TEST(RootedCollectivesTest, GatherAndScatterEveryDtypeRootAndWorldOneToEight) {
  for (int world : {1, 2, 3, 5, 8}) {
    SCOPED_TRACE("world " + std::to_string(world));
    run_world(world, "auto", 60000, [&](gw_comm_t c, int rank, int w, RankErrors& e) {
      check_gather_scatter(c, rank, w, e, 29);
      check_gather_scatter(c, rank, w, e, 0);
    });
  }
}

TEST(RootedCollectivesTest, GatherAndScatterLargeBlocks) {
  run_world(3, "auto", 60000, [&](gw_comm_t c, int rank, int w, RankErrors& e) {
    check_gather_scatter(c, rank, w, e, 300000);
  });
}

// The split of one all-to-all-v: counts[i][j] elements from rank i to rank j (zeros included),
// every rank's blocks placed in a shuffled order with gaps between them.
struct Split {
  std::vector<std::vector<size_t>> counts;
  std::vector<std::vector<size_t>> sdispls, rdispls;  // [rank][peer]
  std::vector<size_t> send_extent, recv_extent;
};

Split make_split(int world, unsigned seed, size_t max_count) {
  std::mt19937 rng(seed);
  const auto p = static_cast<size_t>(world);
  Split s;
  s.counts.assign(p, std::vector<size_t>(p));
  for (auto& row : s.counts) {
    for (auto& n : row) n = rng() % 4 == 0 ? 0 : rng() % (max_count + 1);
  }
  auto place = [&](bool send, std::vector<std::vector<size_t>>& displs, std::vector<size_t>& ext) {
    displs.assign(p, std::vector<size_t>(p));
    ext.assign(p, 0);
    for (size_t r = 0; r < p; ++r) {
      std::vector<size_t> order(p);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      size_t at = rng() % 3;
      for (size_t j : order) {
        displs[r][j] = at;
        at += (send ? s.counts[r][j] : s.counts[j][r]) + rng() % 3;
      }
      ext[r] = at;
    }
  };
  place(true, s.sdispls, s.send_extent);
  place(false, s.rdispls, s.recv_extent);
  return s;
}

void check_alltoallv(gw_comm_t c, int rank, int world, RankErrors& e, unsigned seed,
                     size_t max_count, gw_dtype_t d) {
  const Split s = make_split(world, seed, max_count);
  const auto p = static_cast<size_t>(world);
  const auto me = static_cast<size_t>(rank);
  const size_t es = gw_dtype_bytes(d);
  std::vector<size_t> sendcounts(p), recvcounts(p);
  for (size_t j = 0; j < p; ++j) {
    sendcounts[j] = s.counts[me][j];
    recvcounts[j] = s.counts[j][me];
  }
  std::vector<uint8_t> in(std::max<size_t>(1, s.send_extent[me] * es));
  for (size_t j = 0; j < p; ++j) {
    for (size_t i = 0; i < sendcounts[j]; ++i) {
      put_elem(d, in.data(), s.sdispls[me][j] + i, static_cast<int>((rank * 7 + j * 3 + i) % 200));
    }
  }
  std::vector<uint8_t> out(std::max<size_t>(1, s.recv_extent[me] * es), 0xEE);
  GW_CHECK_RANK(rank, e,
                gw_alltoallv(c, in.data(), sendcounts.data(), s.sdispls[me].data(), out.data(),
                             recvcounts.data(), s.rdispls[me].data(), d));
  for (size_t i = 0; i < p; ++i) {
    for (size_t k = 0; k < recvcounts[i]; ++k) {
      const int want = static_cast<int>((i * 7 + me * 3 + k) % 200);
      if (get_elem(d, out.data(), s.rdispls[me][i] + k) != want) {
        e.add(rank, "alltoallv seed " + std::to_string(seed) + " dtype " + std::to_string(d) +
                        ": from rank " + std::to_string(i) + " element " + std::to_string(k));
        return;
      }
    }
  }
}

TEST(RootedCollectivesTest, AlltoallvUnevenSplitsFromRandomSeeds) {
  for (int world : {1, 2, 3, 4, 7}) {
    SCOPED_TRACE("world " + std::to_string(world));
    run_world(world, "auto", 60000, [&](gw_comm_t c, int rank, int w, RankErrors& e) {
      for (unsigned seed = 1; seed <= 6; ++seed) {
        for (gw_dtype_t d : kAllDtypes) check_alltoallv(c, rank, w, e, seed * 100 + w, 40, d);
      }
      check_alltoallv(c, rank, w, e, 999, 200000, GW_FLOAT32);  // several chunks per block
    });
  }
}

TEST(RootedCollectivesTest, AlltoallvInPlace) {
  run_world(3, "auto", 60000, [&](gw_comm_t c, int rank, int w, RankErrors& e) {
    // Packed in rank order on both sides; counts[i][j] = i + 2 j + 1.
    const auto p = static_cast<size_t>(w);
    std::vector<size_t> sc(p), sd(p), rc(p), rd(p);
    size_t s_at = 0, r_at = 0;
    for (size_t j = 0; j < p; ++j) {
      sc[j] = rank + 2 * j + 1;
      rc[j] = j + 2 * rank + 1;
      sd[j] = s_at;
      rd[j] = r_at;
      s_at += sc[j];
      r_at += rc[j];
    }
    std::vector<int32_t> buf(std::max(s_at, r_at));
    for (size_t j = 0; j < p; ++j) {
      for (size_t k = 0; k < sc[j]; ++k)
        buf[sd[j] + k] = static_cast<int32_t>(rank * 1000 + j * 100 + k);
    }
    GW_CHECK_RANK(rank, e,
                  gw_alltoallv(c, buf.data(), sc.data(), sd.data(), buf.data(), rc.data(),
                               rd.data(), GW_INT32));
    for (size_t i = 0; i < p; ++i) {
      for (size_t k = 0; k < rc[i]; ++k) {
        if (buf[rd[i] + k] != static_cast<int32_t>(i * 1000 + rank * 100 + k)) {
          e.add(rank, "in place: from rank " + std::to_string(i) + " element " + std::to_string(k));
          return;
        }
      }
    }
  });
}

TEST(RootedCollectivesTest, BadArgumentsAreInvalidArgWithAMessage) {
  run_world(2, "auto", 60000, [](gw_comm_t c, int rank, int, RankErrors& e) {
    if (rank == 1) return;  // every call below fails before it talks to a peer
    int32_t x[8] = {};
    auto expect = [&](gw_status_t s, const char* what, const char* word) {
      if (s != GW_ERR_INVALID_ARG || last_error().find(word) == std::string::npos) {
        e.add(rank, std::string(what) + ": status " + std::to_string(s) + ": " + last_error());
      }
    };
    expect(gw_reduce(c, x, x + 4, 1, GW_INT32, GW_SUM, 2), "reduce root 2", "root");
    expect(gw_reduce(c, x, x + 4, 1, GW_INT32, GW_SUM, -1), "reduce root -1", "root");
    expect(gw_reduce(c, x, nullptr, 1, GW_INT32, GW_SUM, 0), "reduce NULL recvbuf at root",
           "recvbuf");
    expect(gw_reduce(c, nullptr, x, 1, GW_INT32, GW_SUM, 1), "reduce NULL sendbuf", "sendbuf");
    expect(gw_reduce(c, x, x + 1, 2, GW_INT32, GW_SUM, 0), "reduce overlap", "overlap");
    expect(gw_reduce(c, x, x, 1, GW_INT32, static_cast<gw_op_t>(9), 0), "reduce bad op", "op");
    expect(gw_reduce(c, x, x, SIZE_MAX / 2, GW_INT32, GW_SUM, 0), "reduce overflow", "count");
    expect(gw_gather(c, x, nullptr, 1, GW_INT32, 0), "gather NULL recvbuf at root", "recvbuf");
    expect(gw_gather(c, x, x, SIZE_MAX / 4, GW_INT32, 0), "gather overflow", "sendcount");
    expect(gw_gather(c, x + 1, x, 2, GW_INT32, 0), "gather overlap", "overlap");
    expect(gw_gather(c, x, x + 2, 1, static_cast<gw_dtype_t>(77), 0), "gather bad dtype", "dtype");
    expect(gw_scatter(c, nullptr, x, 1, GW_INT32, 0), "scatter NULL sendbuf at root", "sendbuf");
    expect(gw_scatter(c, x, x, 1, GW_INT32, 5), "scatter root", "root");
    size_t one[2] = {1, 1}, zero_one[2] = {0, 1}, big[2] = {SIZE_MAX, 1}, same[2] = {0, 0};
    expect(gw_alltoallv(c, x, nullptr, zero_one, x + 4, one, zero_one, GW_INT32),
           "alltoallv NULL sendcounts", "NULL");
    expect(gw_alltoallv(c, x, one, zero_one, x + 4, one, same, GW_INT32),
           "alltoallv overlapping receive blocks", "overlap");
    expect(gw_alltoallv(c, x, one, big, x + 4, one, zero_one, GW_INT32),
           "alltoallv displacement overflow", "overflow");
    expect(gw_alltoallv(c, nullptr, one, zero_one, x + 4, one, zero_one, GW_INT32),
           "alltoallv NULL sendbuf", "sendbuf");
    size_t two_one[2] = {2, 1};
    expect(gw_alltoallv(c, x, two_one, zero_one, x + 4, one, zero_one, GW_INT32),
           "alltoallv own block counts differ", "own block");
    expect(gw_alltoallv(c, x, one, zero_one, x + 1, one, zero_one, GW_INT32),
           "alltoallv send/recv overlap", "overlap");
    expect(gw_reduce(nullptr, x, x, 1, GW_INT32, GW_SUM, 0), "NULL comm", "comm");
  });
}

// Every rank of a call whose ranks disagree fails (none hangs, none returns GW_OK).
void expect_all_fail(int world, const std::function<gw_status_t(gw_comm_t, int)>& call) {
  run_world(
      world, "auto", 20000,
      [&](gw_comm_t c, int rank, int, RankErrors& e) {
        const auto t0 = std::chrono::steady_clock::now();
        const gw_status_t s = call(c, rank);
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - t0)
                            .count();
        if (s != GW_ERR_INVALID_ARG && s != GW_ERR_PEER) {
          e.add(rank, "status " + std::to_string(s) + " (" + last_error() + ")");
        }
        if (ms > 15000) e.add(rank, "took " + std::to_string(ms) + " ms (the deadline)");
        gw_comm_destroy(c);
      },
      true);
}

TEST(RootedCollectivesTest, RanksThatDisagreeAllFail) {
  std::vector<int32_t> a(4096, 1), b(4 * 4096, 0);
  // Root.
  expect_all_fail(3, [&](gw_comm_t c, int rank) {
    return gw_reduce(c, a.data(), b.data(), 64, GW_INT32, GW_SUM, rank == 2 ? 1 : 0);
  });
  // Count, small and large.
  for (size_t n : {size_t{5}, size_t{3000}}) {
    expect_all_fail(3, [&](gw_comm_t c, int rank) {
      return gw_reduce(c, a.data(), b.data(), rank == 1 ? n + 1 : n, GW_INT32, GW_SUM, 0);
    });
    expect_all_fail(3, [&](gw_comm_t c, int rank) {
      return gw_gather(c, a.data(), b.data(), rank == 2 ? n + 1 : n, GW_INT32, 0);
    });
    expect_all_fail(3, [&](gw_comm_t c, int rank) {
      return gw_scatter(c, b.data(), a.data(), rank == 1 ? n - 1 : n, GW_INT32, 0);
    });
  }
  // Kind and dtype.
  expect_all_fail(3, [&](gw_comm_t c, int rank) {
    return rank == 0 ? gw_gather(c, a.data(), b.data(), 4, GW_INT32, 0)
                     : gw_scatter(c, b.data(), a.data(), 4, GW_INT32, 0);
  });
  expect_all_fail(2, [&](gw_comm_t c, int rank) {
    return gw_reduce(c, a.data(), b.data(), 8, rank ? GW_FLOAT32 : GW_INT32, GW_SUM, 0);
  });
  // An all-to-all-v whose counts from rank 0 to rank 1 disagree.
  expect_all_fail(3, [&](gw_comm_t c, int rank) {
    size_t sc[3] = {2, 2, 2}, rc[3] = {2, 2, 2}, d[3] = {0, 2, 4};
    if (rank == 1) rc[0] = 3, d[1] = 3, d[2] = 5;
    return gw_alltoallv(c, a.data(), sc, d, b.data(), rc, d, GW_INT32);
  });
}

#ifdef GW_GRADWIRED_PATH
// Daemon mode has the rooted calls, all-to-all-v and every i-form (capi/daemon_calls.cc; 2 and 3
// trainers in tests/unit/daemon_collectives_test.cc): one trainer here, each result checked;
// and point-to-point to itself.
TEST(RootedCollectivesTest, DaemonModeRunsThemOnOneTrainer) {
  gw::testing::CleanEnv env;
  gw::testing::LocalDaemon daemon(GW_GRADWIRED_PATH, "gw-rooted");
  ASSERT_TRUE(daemon.use());  // GW_DAEMON names it until the end of the test
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.rank = 0;
  cfg.world_size = 1;
  cfg.timeout_ms = 20000;
  gw_comm_t c = nullptr;
  EXPECT_EQ(gw_comm_init(&c, &cfg), GW_OK) << last_error();
  if (c != nullptr) {
    int32_t x[2] = {5, 0};
    size_t one[1] = {1}, zero[1] = {0};
    gw_request_t q = nullptr;
    EXPECT_EQ(gw_reduce(c, x, x + 1, 1, GW_INT32, GW_SUM, 0), GW_OK) << last_error();
    EXPECT_EQ(x[1], 5);
    x[1] = 0;
    EXPECT_EQ(gw_gather(c, x, x + 1, 1, GW_INT32, 0), GW_OK) << last_error();
    EXPECT_EQ(x[1], 5);
    x[1] = 0;
    EXPECT_EQ(gw_scatter(c, x, x + 1, 1, GW_INT32, 0), GW_OK) << last_error();
    EXPECT_EQ(x[1], 5);
    x[1] = 0;
    EXPECT_EQ(gw_alltoallv(c, x, one, zero, x + 1, one, zero, GW_INT32), GW_OK) << last_error();
    EXPECT_EQ(x[1], 5);
    x[1] = 0;
    ASSERT_EQ(gw_ireduce(c, x, x + 1, 1, GW_INT32, GW_MAX, 0, &q), GW_OK) << last_error();
    EXPECT_EQ(gw_wait(q, 20000), GW_OK) << last_error();
    EXPECT_EQ(x[1], 5);
    ASSERT_EQ(gw_ibarrier(c, &q), GW_OK) << last_error();
    EXPECT_EQ(gw_wait(q, 20000), GW_OK) << last_error();
    // Point-to-point goes through the daemon too (same host): a send to itself (eager) and its
    // receive.
    x[1] = 0;
    EXPECT_EQ(gw_send(c, x, 1, GW_INT32, 0, 0), GW_OK) << last_error();
    EXPECT_EQ(gw_recv(c, x + 1, 1, GW_INT32, 0, 0), GW_OK) << last_error();
    EXPECT_EQ(x[1], 5);
    EXPECT_EQ(gw_comm_destroy(c), GW_OK) << last_error();
  }
}
#endif

}  // namespace
