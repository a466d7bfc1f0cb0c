// Daemon mode's rooted and uneven collectives and its i-forms (capi/daemon_calls.cc) through the
// C ABI: 2 and 3 trainers (threads) on a gradwired of the test's own. gw_reduce, gw_gather,
// gw_scatter and gw_alltoallv (float32 and int32, sum and max, every root, in place, uneven
// all-to-all-v counts with zeros, small chunks so that large calls run as many chunks and slices),
// every i-form completed out of order by gw_wait and gw_test, destroy with i-forms pending, a
// trainer (a child process) killed mid-call, and the figures of each call against direct mode.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/capi_world.h"
#include "tests/support/exec_child.h"
#include "tests/support/local_daemon.h"
#include "tests/support/two_hosts.h"

#ifdef GW_GRADWIRED_PATH
namespace {

using gw::testing::get_elem;
using gw::testing::gw_dtype_bytes;
using gw::testing::last_error;
using gw::testing::put_elem;
using gw::testing::RankErrors;

int value(int r, size_t i) { return static_cast<int>((r * 3 + i) % 7) + 1; }

std::vector<uint8_t> filled(gw_dtype_t d, size_t count, int r) {
  std::vector<uint8_t> b(std::max<size_t>(1, count * gw_dtype_bytes(d)));
  for (size_t i = 0; i < count; ++i) put_elem(d, b.data(), i, value(r, i));
  return b;
}

// `world` trainers as threads, in daemon mode on `socket` ("": direct mode), each with its own
// communicator; fn's errors become test failures. Small arena and chunks: large calls are cut.
void run_ranks(int world, const std::string& socket, const gw::testing::WorldFn& fn,
               bool destroy_inside = false, const char* chunk = "65536",
               const char* arena = "32M") {
  gw::testing::CleanEnv env;
  if (!socket.empty()) ::setenv("GW_DAEMON", ("unix:" + socket).c_str(), 1);
  ::setenv("GW_DAEMON_ARENA", arena, 1);
  ::setenv("GW_DAEMON_CHUNK", chunk, 1);
  gw::testing::run_world_in_env(world, nullptr, 30000, fn, destroy_inside);
  ::unsetenv("GW_DAEMON_ARENA");
  ::unsetenv("GW_DAEMON_CHUNK");
}

class DaemonCollectivesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    daemon_ = new gw::testing::LocalDaemon(GW_GRADWIRED_PATH, "gw-dc");
  }
  static void TearDownTestSuite() {
    delete daemon_;
    daemon_ = nullptr;
  }
  void SetUp() override { ASSERT_FALSE(daemon_->socket().empty()); }
  static const std::string& socket() { return daemon_->socket(); }
  static gw::testing::LocalDaemon* daemon_;
};
gw::testing::LocalDaemon* DaemonCollectivesTest::daemon_ = nullptr;

constexpr gw_dtype_t kDtypes[] = {GW_FLOAT32, GW_INT32};

// gw_reduce, gw_gather, gw_scatter of `count` elements: both dtypes, every root, sum and max, in
// place at the root too; each result checked exactly.
void check_rooted(gw_comm_t c, int rank, int world, RankErrors& e, size_t count) {
  const auto p = static_cast<size_t>(world);
  for (gw_dtype_t d : kDtypes) {
    const size_t es = gw_dtype_bytes(d);
    for (int root = 0; root < world; ++root) {
      for (bool in_place : {false, true}) {
        for (gw_op_t op : {GW_SUM, GW_MAX}) {
          auto in = filled(d, count, rank);
          std::vector<uint8_t> out(in.size(), 0xEE);
          void* recv = in_place && rank == root ? in.data() : out.data();
          GW_CHECK_RANK(rank, e, gw_reduce(c, in.data(), recv, count, d, op, root));
          for (size_t i = 0; rank == root && i < count; ++i) {
            int want = 0;
            for (int r = 0; r < world; ++r) {
              want = op == GW_SUM ? want + value(r, i) : std::max(want, value(r, i));
            }
            if (get_elem(d, recv, i) != want) {
              e.add(rank, "reduce d" + std::to_string(d) + " root " + std::to_string(root) +
                              " op " + std::to_string(op) + " n " + std::to_string(count) + " at " +
                              std::to_string(i));
              return;
            }
          }
        }
        // gather
        auto mine = filled(d, count, rank);
        std::vector<uint8_t> all(std::max<size_t>(1, p * count * es), 0xEE);
        const void* send = mine.data();
        if (in_place && rank == root) {
          std::copy(mine.begin(), mine.begin() + count * es, all.begin() + rank * count * es);
          send = all.data() + rank * count * es;
        }
        GW_CHECK_RANK(rank, e,
                      gw_gather(c, send, rank == root ? all.data() : nullptr, count, d, root));
        for (int r = 0; rank == root && r < world; ++r) {
          for (size_t i = 0; i < count; ++i) {
            if (get_elem(d, all.data() + r * count * es, i) != value(r, i)) {
              e.add(rank, "gather d" + std::to_string(d) + " root " + std::to_string(root) +
                              " block " + std::to_string(r) + " at " + std::to_string(i));
              return;
            }
          }
        }
        // scatter: the root's block r is value(r + 11, .)
        std::vector<uint8_t> whole(std::max<size_t>(1, p * count * es), 0);
        if (rank == root) {
          for (int r = 0; r < world; ++r) {
            for (size_t i = 0; i < count; ++i)
              put_elem(d, whole.data() + r * count * es, i, value(r + 11, i));
          }
        }
        std::vector<uint8_t> part(std::max<size_t>(1, count * es), 0xEE);
        void* precv = in_place && rank == root ? whole.data() + rank * count * es : part.data();
        GW_CHECK_RANK(rank, e,
                      gw_scatter(c, rank == root ? whole.data() : nullptr, precv, count, d, root));
        for (size_t i = 0; i < count; ++i) {
          if (get_elem(d, precv, i) != value(rank + 11, i)) {
            e.add(rank, "scatter d" + std::to_string(d) + " root " + std::to_string(root) + " n " +
                            std::to_string(count) + " at " + std::to_string(i));
            return;
          }
        }
      }
    }
  }
}

TEST_F(DaemonCollectivesTest, RootedCallsTwoAndThreeTrainers) {
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    run_ranks(world, socket(), [&](gw_comm_t c, int rank, int w, RankErrors& e) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{37}}) check_rooted(c, rank, w, e, count);
    });
  }
}

// 40000 elements with 64 KiB chunks: reduce and scatter run as chunks, gather as slices.
TEST_F(DaemonCollectivesTest, RootedCallsCutIntoChunksAndSlices) {
  run_ranks(3, socket(), [&](gw_comm_t c, int rank, int w, RankErrors& e) {
    check_rooted(c, rank, w, e, 40000);
  });
}

// Uneven counts with zeros (some rank pairs exchange nothing), random from a seed every rank
// agrees on; displacements with gaps. in_place: one buffer (receive layout = send layout).
void check_alltoallv(gw_comm_t c, int rank, int world, RankErrors& e, uint32_t seed, size_t most,
                     bool in_place) {
  const auto p = static_cast<size_t>(world);
  std::mt19937 g(seed);
  std::vector<size_t> m(p * p);  // m[i * p + j]: rank i to rank j
  for (auto& x : m) x = g() % 3 == 0 ? 0 : g() % (most + 1);
  if (in_place) {  // MPI's in place: sendcounts == recvcounts, so m symmetric
    for (size_t i = 0; i < p; ++i)
      for (size_t j = 0; j < i; ++j) m[i * p + j] = m[j * p + i];
  }
  const auto me = static_cast<size_t>(rank);
  for (gw_dtype_t d : kDtypes) {
    const size_t es = gw_dtype_bytes(d);
    std::vector<size_t> sc(p), sd(p), rc(p), rd(p);
    size_t send_end = 0, recv_end = 0;
    for (size_t j = 0; j < p; ++j) {
      sc[j] = m[me * p + j];
      rc[j] = m[j * p + me];
      sd[j] = send_end + 1;  // a gap of one element before each block
      send_end = sd[j] + sc[j];
      rd[j] = recv_end + 2;
      recv_end = rd[j] + rc[j];
    }
    if (in_place) rd = sd, recv_end = send_end;
    std::vector<uint8_t> sbuf((send_end + 1) * es, 0), rbuf((recv_end + 1) * es, 0x5A);
    for (size_t j = 0; j < p; ++j) {
      for (size_t i = 0; i < sc[j]; ++i) {
        put_elem(d, sbuf.data() + sd[j] * es, i, value(static_cast<int>(me * 5 + j), i));
      }
    }
    uint8_t* recv = in_place ? sbuf.data() : rbuf.data();
    const std::vector<uint8_t> before(recv, recv + (in_place ? sbuf.size() : rbuf.size()));
    GW_CHECK_RANK(
        rank, e, gw_alltoallv(c, sbuf.data(), sc.data(), sd.data(), recv, rc.data(), rd.data(), d));
    std::vector<bool> touched(before.size(), false);
    for (size_t j = 0; j < p; ++j) {
      for (size_t i = 0; i < rc[j]; ++i) {
        for (size_t b = 0; b < es; ++b) touched[(rd[j] + i) * es + b] = true;
        if (get_elem(d, recv + rd[j] * es, i) != value(static_cast<int>(j * 5 + me), i)) {
          e.add(rank, "alltoallv from " + std::to_string(j) + " at " + std::to_string(i) +
                          " seed " + std::to_string(seed));
          return;
        }
      }
    }
    for (size_t b = 0; b < before.size(); ++b) {
      if (!touched[b] && recv[b] != before[b]) {
        e.add(rank, "alltoallv wrote byte " + std::to_string(b) + " outside the blocks");
        return;
      }
    }
  }
}

TEST_F(DaemonCollectivesTest, AlltoallvUnevenCountsWithZeros) {
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    run_ranks(world, socket(), [&](gw_comm_t c, int rank, int w, RankErrors& e) {
      for (uint32_t seed = 1; seed <= 4; ++seed) {
        check_alltoallv(c, rank, w, e, seed, 50, false);
        check_alltoallv(c, rank, w, e, seed, 50, true);
      }
      check_alltoallv(c, rank, w, e, 9, 30000, false);  // slices (64 KiB chunks)
      check_alltoallv(c, rank, w, e, 9, 30000, true);   // slices, in place
      // All zero: nothing moves, every rank returns.
      std::vector<size_t> z(static_cast<size_t>(w), 0);
      int32_t x = 0;
      GW_CHECK_RANK(rank, e,
                    gw_alltoallv(c, &x, z.data(), z.data(), &x, z.data(), z.data(), GW_INT32));
    });
  }
}

// Counts that disagree between two ranks: every rank fails alike, none hangs.
TEST_F(DaemonCollectivesTest, AlltoallvDisagreeingCountsFailEveryRank) {
  run_ranks(3, socket(), [&](gw_comm_t c, int rank, int, RankErrors& e) {
    int32_t a[8] = {}, b[8] = {};
    size_t sc[3] = {2, 2, 2}, rc[3] = {2, 2, 2}, dsp[3] = {0, 2, 4};
    if (rank == 1) rc[0] = 1;
    const gw_status_t s = gw_alltoallv(c, a, sc, dsp, b, rc, dsp, GW_INT32);
    if (s != GW_ERR_INVALID_ARG || last_error().find("recvcounts") == std::string::npos) {
      e.add(rank, "disagreeing counts: status " + std::to_string(s) + ": " + last_error());
    }
    // The communicator is still usable.
    GW_CHECK_RANK(rank, e, gw_barrier(c));
  });
}

// Every i-form, issued back to back (an iallreduce first: its own path, one after the queued
// ones: queued behind them), completed in reverse order, some by gw_test; then a blocking call.
void check_iforms(gw_comm_t c, int rank, int w, RankErrors& e) {
  const auto p = static_cast<size_t>(w);
  const size_t n = 3000;  // 12 KB per block: several chunks for some calls
  const int root = w - 1;
  std::vector<int32_t> ar_in(n), ar_out(n), ar2_in(n), ar2_out(n), bc(n), ag_in(n), ag_out(n * p),
      rs_in(n * p), rs_out(n), aa_in(n * p), aa_out(n * p), rd_in(n), rd_out(n), ga_in(n),
      ga_out(n * p), sc_in(n * p), sc_out(n);
  std::vector<int32_t> av_in(p * 2), av_out(p * 2);
  std::vector<size_t> av_cnt(p), av_dsp(p);
  for (size_t i = 0; i < n; ++i) {
    ar_in[i] = rank + static_cast<int>(i);
    ar2_in[i] = 2 * rank + 1;
    bc[i] = rank == root ? static_cast<int>(i) * 3 : -1;
    ag_in[i] = rank * 100 + static_cast<int>(i % 50);
    rd_in[i] = rank + 1;
    ga_in[i] = rank * 7 + static_cast<int>(i % 13);
  }
  for (size_t i = 0; i < n * p; ++i) {
    rs_in[i] = rank + static_cast<int>(i % 17);
    aa_in[i] = rank * 1000 + static_cast<int>(i / n);  // block j for rank j
    sc_in[i] = rank == root ? static_cast<int>(i) : -1;
  }
  for (size_t j = 0; j < p; ++j) {  // rank r sends j+1 elements (<= 2) ... of value r*10+j
    av_cnt[j] = (static_cast<size_t>(rank) + j) % 3 == 0 ? 0 : 1;
    av_dsp[j] = 2 * j;
    av_in[2 * j] = rank * 10 + static_cast<int>(j);
  }
  // rank j's count toward me must equal mine from it: (me + j) % 3 is symmetric.
  std::vector<gw_request_t> q(10, nullptr);
  GW_CHECK_RANK(rank, e, gw_iallreduce(c, ar_in.data(), ar_out.data(), n, GW_INT32, GW_SUM, &q[0]));
  GW_CHECK_RANK(rank, e, gw_ibroadcast(c, bc.data(), n, GW_INT32, root, &q[1]));
  GW_CHECK_RANK(rank, e, gw_iallgather(c, ag_in.data(), ag_out.data(), n, GW_INT32, &q[2]));
  GW_CHECK_RANK(rank, e,
                gw_ireduce_scatter(c, rs_in.data(), rs_out.data(), n, GW_INT32, GW_MAX, &q[3]));
  GW_CHECK_RANK(rank, e, gw_ialltoall(c, aa_in.data(), aa_out.data(), n, GW_INT32, &q[4]));
  GW_CHECK_RANK(rank, e,
                gw_ialltoallv(c, av_in.data(), av_cnt.data(), av_dsp.data(), av_out.data(),
                              av_cnt.data(), av_dsp.data(), GW_INT32, &q[5]));
  GW_CHECK_RANK(rank, e,
                gw_ireduce(c, rd_in.data(), rd_out.data(), n, GW_INT32, GW_SUM, root, &q[6]));
  GW_CHECK_RANK(rank, e, gw_igather(c, ga_in.data(), ga_out.data(), n, GW_INT32, 0, &q[7]));
  GW_CHECK_RANK(rank, e, gw_iscatter(c, sc_in.data(), sc_out.data(), n, GW_INT32, root, &q[8]));
  GW_CHECK_RANK(rank, e,
                gw_iallreduce(c, ar2_in.data(), ar2_out.data(), n, GW_INT32, GW_MAX, &q[9]));
  for (int k = 9; k >= 0; --k) {
    if (q[k] == nullptr) return;
    if (k % 3 == 0) {  // gw_test until done (bounded)
      int done = 0;
      gw_status_t s = GW_OK;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (done == 0 && s == GW_OK && std::chrono::steady_clock::now() < until) {
        s = gw_test(q[k], &done);
        if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (s != GW_OK || done == 0)
        e.add(rank, "gw_test " + std::to_string(k) + ": " + last_error());
      if (s != GW_OK || done == 0) continue;
      // gw_test freed it when done
    } else {
      GW_CHECK_RANK(rank, e, gw_wait(q[k], 30000));
    }
  }
  auto fail = [&](const char* what, size_t i) {
    e.add(rank, std::string(what) + " wrong at " + std::to_string(i));
  };
  const int tri = w * (w - 1) / 2;
  for (size_t i = 0; i < n; ++i) {
    if (ar_out[i] != tri + w * static_cast<int>(i)) return fail("iallreduce", i);
    if (ar2_out[i] != 2 * (w - 1) + 1) return fail("iallreduce (queued)", i);
    if (bc[i] != static_cast<int>(i) * 3) return fail("ibroadcast", i);
    if (rs_out[i] != (w - 1) + static_cast<int>((rank * n + i) % 17))
      return fail("ireduce_scatter", i);
    if (sc_out[i] != static_cast<int>(rank * n + i)) return fail("iscatter", i);
    if (rank == root && rd_out[i] != tri + w) return fail("ireduce", i);
  }
  for (size_t i = 0; i < n * p; ++i) {
    const int r = static_cast<int>(i / n);
    if (ag_out[i] != r * 100 + static_cast<int>((i % n) % 50)) return fail("iallgather", i);
    if (aa_out[i] != r * 1000 + rank) return fail("ialltoall", i);
    if (rank == 0 && ga_out[i] != r * 7 + static_cast<int>((i % n) % 13)) return fail("igather", i);
  }
  for (size_t j = 0; j < p; ++j) {
    if (av_cnt[j] == 1 && av_out[2 * j] != static_cast<int>(j) * 10 + rank)
      return fail("ialltoallv", j);
  }
  int32_t one = 1, sum = 0;
  GW_CHECK_RANK(rank, e, gw_allreduce(c, &one, &sum, 1, GW_INT32, GW_SUM));
  if (sum != w) e.add(rank, "allreduce after the i-forms");
}

TEST_F(DaemonCollectivesTest, EveryIFormCompletedOutOfOrder) {
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    run_ranks(world, socket(), check_iforms);
  }
}

// Destroy with i-forms pending: rank 0 queues many and destroys at once, before rank 1 has
// issued any (so none of rank 0's can have completed): each ends in GW_ERR_ABORTED, and no buffer
// changes afterwards. Rank 1 issues its own later and destroys: aborted, or the peer is gone.
TEST_F(DaemonCollectivesTest, DestroyEndsPendingIForms) {
  run_ranks(
      2, socket(),
      [&](gw_comm_t c, int rank, int, RankErrors& e) {
        const size_t n = 40000, k = 12;
        if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        std::vector<std::vector<float>> in(k, std::vector<float>(n, 1.0f)),
            out(k, std::vector<float>(2 * n, -1.0f));
        std::vector<gw_request_t> q(k, nullptr);
        for (size_t i = 0; i < k; ++i) {
          gw_status_t s =
              i % 2 == 0
                  ? gw_ireduce(c, in[i].data(), out[i].data(), n, GW_FLOAT32, GW_SUM, 0, &q[i])
                  : gw_igather(c, in[i].data(), out[i].data(), n, GW_FLOAT32, 0, &q[i]);
          if (s != GW_OK) {
            if (rank == 0) e.add(rank, "i-form " + std::to_string(i) + ": " + last_error());
            q[i] = nullptr;
          }
        }
        const auto t0 = std::chrono::steady_clock::now();
        if (gw_comm_destroy(c) != GW_OK) e.add(rank, "destroy: " + last_error());
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        if (ms > 10000) e.add(rank, "destroy took " + std::to_string(ms) + " ms");
        const auto snapshot = out;
        for (size_t i = 0; i < k; ++i) {
          if (q[i] == nullptr) continue;
          const gw_status_t s = gw_wait(q[i], 10000);
          if (rank == 0 ? s != GW_ERR_ABORTED : (s != GW_ERR_ABORTED && s != GW_ERR_PEER)) {
            e.add(rank, "pending i-form " + std::to_string(i) + " ended with " + std::to_string(s) +
                            ": " + last_error());
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (out != snapshot) e.add(rank, "a buffer changed after gw_comm_destroy returned");
      },
      /*destroy_inside=*/true);
}

// gw_comm_abort with i-forms queued (the peer issues none, so none can complete): each ends in
// GW_ERR_ABORTED at once, the running one included, and the buffers stay as they were.
TEST_F(DaemonCollectivesTest, AbortEndsQueuedIForms) {
  std::atomic<bool> rank0_done{false};
  run_ranks(2, socket(), [&](gw_comm_t c, int rank, int, RankErrors& e) {
    if (rank == 1) {  // issues nothing until rank 0 has aborted and checked
      for (int i = 0; i < 3000 && !rank0_done.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return;
    }
    const size_t n = 1000, k = 6;
    std::vector<std::vector<int32_t>> in(k, std::vector<int32_t>(n, 3)),
        out(k, std::vector<int32_t>(2 * n, -1));
    std::vector<gw_request_t> q(k, nullptr);
    for (size_t i = 0; i < k; ++i) {
      GW_CHECK_RANK(
          rank, e,
          i % 2 ? gw_iscatter(c, in[i].data(), out[i].data(), n / 2, GW_INT32, 1, &q[i])
                : gw_ireduce(c, in[i].data(), out[i].data(), n, GW_INT32, GW_MAX, 0, &q[i]));
    }
    GW_CHECK_RANK(rank, e, gw_comm_abort(c));
    for (size_t i = 0; i < k; ++i) {
      if (q[i] == nullptr) continue;
      const gw_status_t s = gw_wait(q[i], 10000);
      if (s != GW_ERR_ABORTED) {
        e.add(rank, "i-form " + std::to_string(i) + " after abort: " + std::to_string(s) + ": " +
                        last_error());
      }
      if (out[i] != std::vector<int32_t>(2 * n, -1)) {
        e.add(rank, "i-form " + std::to_string(i) + " wrote its buffer though aborted");
      }
    }
    rank0_done = true;
  });
}

// The figures: each call at 2 trainers, 4 MiB of float32 per rank, daemon against direct mode
// (medians of 11 after 2 warm-up calls; printed, not asserted: a loaded machine).
TEST_F(DaemonCollectivesTest, FiguresAgainstDirectMode) {
  const size_t n = (4u << 20) / 4;
  const char* names[] = {"allreduce", "reduce",       "gather",         "scatter",
                         "alltoallv", "ireduce+wait", "ibroadcast+wait"};
  constexpr int kCalls = 7;
  double med[2][kCalls] = {};
  for (int mode = 0; mode < 2; ++mode) {
    run_ranks(
        2, mode == 1 ? socket() : "",
        [&](gw_comm_t c, int rank, int, RankErrors& e) {
          std::vector<float> a(2 * n, 1.0f), b(2 * n, 0.0f);
          const size_t half = n / 2;
          size_t cnt[2] = {half, half}, dsp[2] = {0, half};
          for (int call = 0; call < kCalls; ++call) {
            std::vector<double> t;
            for (int it = 0; it < 13; ++it) {
              const auto t0 = std::chrono::steady_clock::now();
              gw_status_t s = GW_OK;
              gw_request_t q = nullptr;
              switch (call) {
                case 0:
                  s = gw_allreduce(c, a.data(), b.data(), n, GW_FLOAT32, GW_SUM);
                  break;
                case 1:
                  s = gw_reduce(c, a.data(), b.data(), n, GW_FLOAT32, GW_SUM, 0);
                  break;
                case 2:
                  s = gw_gather(c, a.data(), b.data(), n, GW_FLOAT32, 0);
                  break;
                case 3:
                  s = gw_scatter(c, a.data(), b.data(), n, GW_FLOAT32, 0);
                  break;
                case 4:
                  s = gw_alltoallv(c, a.data(), cnt, dsp, b.data(), cnt, dsp, GW_FLOAT32);
                  break;
                case 5:
                  s = gw_ireduce(c, a.data(), b.data(), n, GW_FLOAT32, GW_SUM, 0, &q);
                  if (s == GW_OK) s = gw_wait(q, 30000);
                  break;
                default:
                  s = gw_ibroadcast(c, a.data(), n, GW_FLOAT32, 0, &q);
                  if (s == GW_OK) s = gw_wait(q, 30000);
              }
              if (s != GW_OK) {
                e.add(rank, std::string(names[call]) + ": " + last_error());
                return;
              }
              if (it >= 2)
                t.push_back(
                    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                        .count());
            }
            std::sort(t.begin(), t.end());
            if (rank == 0) med[mode][call] = t[t.size() / 2];
          }
        },
        false, "16M", "128M");
  }
  // The machine's ceiling in the same run: one 4 MiB memcpy (a staged call makes a few).
  std::vector<double> mt;
  {
    std::vector<float> a(n, 1.0f), b(n);
    for (int it = 0; it < 9; ++it) {
      const auto t0 = std::chrono::steady_clock::now();
      std::memcpy(b.data(), a.data(), n * 4);
      mt.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      a[static_cast<size_t>(it)] = b[static_cast<size_t>(it) + 1];
    }
    std::sort(mt.begin(), mt.end());
  }
  std::printf("FIGURE memcpy-4MiB      %8.2f (the machine's ceiling, this run)\n", mt[4]);
  std::printf("FIGURES 2 trainers, 4 MiB float32, median ms: call direct daemon\n");
  for (int call = 0; call < kCalls; ++call) {
    std::printf("FIGURE %-16s %8.2f %8.2f\n", names[call], med[0][call], med[1][call]);
  }
}

// A trainer (a child process: this binary again, as DaemonCollectivesChild.Trainer) killed while
// its ireduce runs: the others' calls end in GW_ERR_PEER within their deadline.
TEST_F(DaemonCollectivesTest, KilledTrainerEndsTheOthersCallsWithPeer) {
  gw::testing::CleanEnv env;
  const std::string addr = "127.0.0.1:" + std::to_string(gw::testing::free_port());
  ::setenv("GW_DAEMON", ("unix:" + socket()).c_str(), 1);
  ::setenv("GW_DAEMON_ARENA", "32M", 1);
  ::setenv("GW_DC_CHILD_STORE", addr.c_str(), 1);
  char self[4096] = {};
  ASSERT_GT(::readlink("/proc/self/exe", self, sizeof(self) - 1), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::execl(self, self, "--gtest_filter=DaemonCollectivesChild.Trainer",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ASSERT_GT(child, 0);
  ::unsetenv("GW_DC_CHILD_STORE");
  constexpr int kTimeoutMs = 8000;
  RankErrors errors;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      gw_config_t cfg = GW_CONFIG_INIT;
      cfg.rank = r;
      cfg.world_size = 3;
      cfg.store_addr = addr.c_str();
      cfg.timeout_ms = kTimeoutMs;
      gw_comm_t c = nullptr;
      if (gw_comm_init(&c, &cfg) != GW_OK) return errors.add(r, "init: " + last_error());
      std::vector<float> a(40000, 1.0f), b(3 * 40000);
      GW_CHECK_RANK(r, errors, gw_barrier(c));
      gw_status_t s = GW_OK;
      double ms = 0;
      for (int i = 0; i < 1000 && s == GW_OK; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        s = i % 2 ? gw_gather(c, a.data(), b.data(), a.size(), GW_FLOAT32, 0)
                  : gw_reduce(c, a.data(), b.data(), a.size(), GW_FLOAT32, GW_SUM, 0);
        ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                 .count();
      }
      if (s != GW_ERR_PEER) errors.add(r, "ended with " + std::to_string(s) + ": " + last_error());
      if (ms > kTimeoutMs + 4000)
        errors.add(r, "the failing call took " + std::to_string(ms) + " ms");
      (void)gw_comm_destroy(c);
    });
  }
  for (auto& t : threads) t.join();
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "child status " << status;
  ::unsetenv("GW_DAEMON_ARENA");
  for (const auto& e : errors.list) ADD_FAILURE() << e;
}

// The killed trainer (rank 2 of KilledTrainerEndsTheOthersCallsWithPeer); skips unless started
// by it.
TEST(DaemonCollectivesChild, Trainer) {
  const char* store = ::getenv("GW_DC_CHILD_STORE");
  if (store == nullptr) GTEST_SKIP() << "started only by KilledTrainerEndsTheOthersCallsWithPeer";
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.rank = 2;
  cfg.world_size = 3;
  cfg.store_addr = store;
  cfg.timeout_ms = 8000;
  gw_comm_t c = nullptr;
  ASSERT_EQ(gw_comm_init(&c, &cfg), GW_OK) << last_error();
  ASSERT_EQ(gw_barrier(c), GW_OK) << last_error();
  std::vector<float> a(40000, 1.0f), b(3 * 40000);
  ASSERT_EQ(gw_reduce(c, a.data(), b.data(), a.size(), GW_FLOAT32, GW_SUM, 0), GW_OK);
  gw_request_t q = nullptr;
  ASSERT_EQ(gw_igather(c, a.data(), b.data(), a.size(), GW_FLOAT32, 0, &q), GW_OK);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ::raise(SIGKILL);
}

// 2 daemons (two host identities) x 2 trainers (child processes: this binary again, as
// DaemonCollectivesChild.TwoHosts), ranks interleaved over the hosts: the rooted calls, uneven
// all-to-all-v and every i-form cross the daemons.
TEST(DaemonCollectivesTwoHosts, TwoDaemonsTwoTrainersEach) {
  gw::testing::CleanEnv env;
  gw::testing::TwoHosts hosts(GW_GRADWIRED_PATH, "gw-dc", {"dc-host-a", "dc-host-b"});
  ASSERT_TRUE(hosts.ready());
  gw::testing::reap_within(hosts.start("DaemonCollectivesChild.TwoHosts", 4,
                                       {"GW_DAEMON_ARENA=32M", "GW_DAEMON_CHUNK=65536"}),
                           240, "trainer");
}

// A trainer of TwoDaemonsTwoTrainersEach; skips unless started by it.
TEST(DaemonCollectivesChild, TwoHosts) {
  const auto place = gw::testing::trainer_place();
  if (!place) GTEST_SKIP() << "started only by TwoDaemonsTwoTrainersEach";
  const int rank = place->rank;
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.rank = rank;
  cfg.world_size = place->world;
  cfg.store_addr = place->store.c_str();
  cfg.timeout_ms = 30000;
  gw_comm_t c = nullptr;
  ASSERT_EQ(gw_comm_init(&c, &cfg), GW_OK) << last_error();
  char summary[512] = {};
  size_t need = 0;
  ASSERT_EQ(gw_comm_describe(c, "summary", summary, sizeof(summary), &need), GW_OK);
  EXPECT_NE(std::string(summary).find("2 hosts, 2 trainers here"), std::string::npos) << summary;
  RankErrors e;
  check_rooted(c, rank, 4, e, 37);
  check_rooted(c, rank, 4, e, 20000);
  for (uint32_t seed = 1; seed <= 3; ++seed) check_alltoallv(c, rank, 4, e, seed, 40, false);
  check_alltoallv(c, rank, 4, e, 5, 20000, true);
  check_iforms(c, rank, 4, e);
  EXPECT_EQ(gw_comm_destroy(c), GW_OK) << last_error();
  for (const auto& m : e.list) ADD_FAILURE() << m;
}

}  // namespace
#endif  // GW_GRADWIRED_PATH
