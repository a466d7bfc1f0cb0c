// Point-to-point through the C ABI (gw_send / gw_recv / gw_isend / gw_irecv, direct mode): ranks
// as threads of this process rendezvousing over the TCP store, as capi_test does. Ordering,
// any-source, truncation, a larger receive's real size, self-sends, interleaving
// with collectives from several threads, 1..8 ranks, every dtype, a dead peer, the deadline,
// destroy and abort with pending requests, bad arguments. The eager (standard-mode) sends' own
// rules: p2p_eager_test.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/gradwire.h"
#include "tests/support/capi_world.h"
#include "tests/support/local_daemon.h"
#include "tests/support/sanitizers.h"
#include "tests/support/test_env.h"

namespace {

// ASan or TSan (gcc's macros, or clang's feature test for TSan): the timing bounds are skipped.
constexpr bool kSanitizedBuild = gw::testing::kSanitized || gw::testing::kThreadSanitizer;

using namespace gw::testing;  // run_world, RankErrors, GW_CHECK_RANK (capi_world.h)

// A byte pattern that names (src, dst, tag, index).
uint8_t pattern(int src, int dst, int tag, size_t i) {
  return static_cast<uint8_t>(src * 31 + dst * 17 + tag * 7 + i * 13 + (i >> 8));
}

// Every rank sends one message to every rank (itself too) and receives one from every rank, all
// posted before any wait, receives first on odd ranks.
void all_pairs(gw_comm_t comm, int rank, int world, RankErrors& errors, size_t count, gw_dtype_t dt,
               int tag) {
  const size_t bytes = count * gw_dtype_bytes(dt);
  std::vector<std::vector<uint8_t>> out(world), in(world);
  std::vector<gw_request_t> reqs;
  auto post_sends = [&] {
    for (int p = 0; p < world; ++p) {
      out[p].resize(bytes);
      for (size_t i = 0; i < bytes; ++i) out[p][i] = pattern(rank, p, tag, i);
      gw_request_t q = nullptr;
      GW_CHECK_RANK(rank, errors, gw_isend(comm, out[p].data(), count, dt, p, tag, &q));
      if (q) reqs.push_back(q);
    }
  };
  auto post_recvs = [&] {
    for (int p = 0; p < world; ++p) {
      in[p].assign(bytes, 0);
      gw_request_t q = nullptr;
      GW_CHECK_RANK(rank, errors, gw_irecv(comm, in[p].data(), count, dt, p, tag, &q));
      if (q) reqs.push_back(q);
    }
  };
  if (rank % 2) {
    post_recvs();
    post_sends();
  } else {
    post_sends();
    post_recvs();
  }
  for (auto q : reqs) GW_CHECK_RANK(rank, errors, gw_wait(q, -1));
  for (int p = 0; p < world; ++p) {
    for (size_t i = 0; i < bytes; ++i) {
      if (in[p][i] != pattern(p, rank, tag, i)) {
        errors.add(rank, "wrong byte " + std::to_string(i) + " from rank " + std::to_string(p) +
                             " (" + std::to_string(bytes) + " bytes, dtype " + std::to_string(dt) +
                             ")");
        break;
      }
    }
  }
}

TEST(P2PTest, AllPairsAtOneToEightRanks) {
  for (int world = 1; world <= 8; ++world) {
    SCOPED_TRACE("world " + std::to_string(world));
    run_world(world, "auto", 60000, [](gw_comm_t c, int rank, int world, RankErrors& e) {
      all_pairs(c, rank, world, e, 1000, GW_INT32, 3);
      all_pairs(c, rank, world, e, 0, GW_UINT8, 4);
      all_pairs(c, rank, world, e, 300000, GW_UINT8, 5);  // past the eager size
    });
  }
}

TEST(P2PTest, EveryDtypeAndSizeOverTcpAndShm) {
  for (const char* transport : {"tcp", "shm"}) {
    SCOPED_TRACE(transport);
    run_world(2, transport, 60000, [](gw_comm_t c, int rank, int world, RankErrors& e) {
      int tag = 10;
      for (gw_dtype_t dt : kAllDtypes) {
        // 0, 1, around the eager size (16 KiB), several chunks (512 KiB each).
        for (size_t bytes : {size_t{0}, size_t{8}, size_t{16384}, size_t{16392}, size_t{1600008}}) {
          all_pairs(c, rank, world, e, bytes / gw_dtype_bytes(dt), dt, tag++);
        }
      }
    });
  }
}

TEST(P2PTest, OrderIsKeptPerSenderAndTag) {
  run_world(3, "tcp", 60000, [](gw_comm_t c, int rank, int world, RankErrors& e) {
    constexpr int kN = 40;
    if (rank > 0) {
      // Eager and rendezvous messages mixed, two tags interleaved.
      std::vector<std::vector<int64_t>> bufs(2 * kN);
      std::vector<gw_request_t> reqs;
      for (int i = 0; i < kN; ++i) {
        for (int t = 0; t < 2; ++t) {
          auto& b = bufs[2 * i + t];
          b.assign(i % 3 == 0 ? 5000 : 3, 1000 * rank + 100 * t + i);
          gw_request_t q = nullptr;
          GW_CHECK_RANK(rank, e, gw_isend(c, b.data(), b.size(), GW_INT64, 0, 7 + t, &q));
          reqs.push_back(q);
        }
      }
      for (auto q : reqs) GW_CHECK_RANK(rank, e, gw_wait(q, -1));
    } else {
      // Let the messages arrive first (unexpected), then receive tag 8 before tag 7.
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      for (int t : {1, 0}) {
        for (int src = 1; src < world; ++src) {
          for (int i = 0; i < kN; ++i) {
            std::vector<int64_t> b(5000, -1);
            gw_request_t q = nullptr;
            GW_CHECK_RANK(rank, e, gw_irecv(c, b.data(), b.size(), GW_INT64, src, 7 + t, &q));
            size_t n = 0;
            int from = -2;
            GW_CHECK_RANK(rank, e, gw_wait_recv(q, -1, &n, &from));
            const size_t want = i % 3 == 0 ? 5000 : 3;
            if (n != want || from != src || b[0] != 1000 * src + 100 * t + i ||
                b[want - 1] != b[0]) {
              e.add(rank, "message " + std::to_string(i) + " of rank " + std::to_string(src) +
                              " tag " + std::to_string(7 + t) + " out of order or wrong: got " +
                              std::to_string(b[0]) + ", " + std::to_string(n) + " elements");
              return;
            }
          }
        }
      }
    }
  });
}

TEST(P2PTest, AnySourceTakesEveryRankAndReportsIt) {
  run_world(4, "auto", 60000, [](gw_comm_t c, int rank, int world, RankErrors& e) {
    if (rank == 0) {
      std::set<int> seen;
      for (int k = 0; k < 2 * (world - 1); ++k) {
        std::vector<int32_t> b(4000, -1);
        gw_request_t q = nullptr;
        GW_CHECK_RANK(rank, e, gw_irecv(c, b.data(), b.size(), GW_INT32, GW_ANY_SOURCE, 9, &q));
        size_t n = 0;
        int src = -2;
        GW_CHECK_RANK(rank, e, gw_wait_recv(q, -1, &n, &src));
        const size_t want = k % 2 ? 4000 : 10;  // not known per source: check by content
        (void)want;
        if (src < 1 || src >= world || b[0] != src || (n != 10 && n != 4000) || b[n - 1] != src) {
          e.add(rank, "any-source receive got source " + std::to_string(src) + ", value " +
                          std::to_string(b[0]) + ", count " + std::to_string(n));
        }
        seen.insert(src);
      }
      if (seen.size() != static_cast<size_t>(world - 1)) e.add(rank, "not every source seen");
    } else {
      std::vector<int32_t> small(10, rank), large(4000, rank);
      GW_CHECK_RANK(rank, e, gw_send(c, small.data(), small.size(), GW_INT32, 0, 9));
      GW_CHECK_RANK(rank, e, gw_send(c, large.data(), large.size(), GW_INT32, 0, 9));
    }
  });
}

// A rendezvous-size message (past 16 KiB) fails both sides; an eager one only the receive (its
// send completed already: p2p_eager_test.cc).
TEST(P2PTest, TruncationFailsTheReceiveAndALargerReceiveGetsTheRealSize) {
  run_world(2, "tcp", 60000, [](gw_comm_t c, int rank, int, RankErrors& e) {
    for (size_t count : {size_t{100}, size_t{300000}}) {  // eager and rendezvous
      std::vector<int32_t> b(2 * count, rank);
      if (rank == 0) {
        const bool eager = count * 4 <= 16384;
        gw_status_t s = gw_send(c, b.data(), count, GW_INT32, 1, 1);
        if (eager
                ? s != GW_OK
                : s != GW_ERR_INVALID_ARG || last_error().find("truncated") == std::string::npos) {
          e.add(rank, "truncated send: status " + std::to_string(s) + ": " + last_error());
        }
        GW_CHECK_RANK(rank, e,
                      gw_send(c, b.data(), count, GW_INT32, 1, 1));  // the link still works
      } else {
        gw_status_t s = gw_recv(c, b.data(), count / 2, GW_INT32, 0, 1);
        if (s != GW_ERR_INVALID_ARG || last_error().find("truncated") == std::string::npos ||
            last_error().find(std::to_string(count * 4)) == std::string::npos) {
          e.add(rank, "truncated receive: status " + std::to_string(s) + ": " + last_error());
        }
        gw_request_t q = nullptr;
        GW_CHECK_RANK(rank, e, gw_irecv(c, b.data(), 2 * count, GW_INT32, 0, 1, &q));
        size_t n = 0;
        int src = -2;
        GW_CHECK_RANK(rank, e, gw_wait_recv(q, -1, &n, &src));
        if (n != count || src != 0 || b[count - 1] != 0 || b[count] != 1) {
          e.add(rank,
                "larger receive: count " + std::to_string(n) + ", source " + std::to_string(src));
        }
      }
    }
  });
}

TEST(P2PTest, SelfSendAnyOrder) {
  run_world(1, "auto", 60000, [](gw_comm_t c, int rank, int, RankErrors& e) {
    std::vector<double> a(50000), b(50000, 0);
    for (size_t i = 0; i < a.size(); ++i) a[i] = 0.5 * static_cast<double>(i);
    gw_request_t s = nullptr, r = nullptr;
    GW_CHECK_RANK(rank, e, gw_isend(c, a.data(), a.size(), GW_FLOAT64, 0, 2, &s));  // send first
    GW_CHECK_RANK(rank, e, gw_recv(c, b.data(), b.size(), GW_FLOAT64, GW_ANY_SOURCE, 2));
    GW_CHECK_RANK(rank, e, gw_wait(s, -1));
    if (a != b) e.add(rank, "self-send (send first) data");
    std::fill(b.begin(), b.end(), 0);
    GW_CHECK_RANK(rank, e, gw_irecv(c, b.data(), b.size(), GW_FLOAT64, 0, 3, &r));  // receive first
    GW_CHECK_RANK(rank, e, gw_send(c, a.data(), a.size(), GW_FLOAT64, 0, 3));
    int src = -2;
    GW_CHECK_RANK(rank, e, gw_wait_recv(r, -1, nullptr, &src));
    if (a != b || src != 0) e.add(rank, "self-send (receive first) data");
    // A truncated rendezvous-size self-send fails both sides; an eager one only the receive.
    GW_CHECK_RANK(rank, e, gw_isend(c, a.data(), 5000, GW_FLOAT64, 0, 4, &s));
    if (gw_recv(c, b.data(), 2500, GW_FLOAT64, 0, 4) != GW_ERR_INVALID_ARG) {
      e.add(rank, "truncated self receive passed");
    }
    if (gw_wait(s, -1) != GW_ERR_INVALID_ARG) e.add(rank, "truncated self send passed");
    GW_CHECK_RANK(rank, e, gw_isend(c, a.data(), 10, GW_FLOAT64, 0, 4, &s));
    GW_CHECK_RANK(rank, e, gw_wait(s, -1));  // eager: done before any receive
    if (gw_recv(c, b.data(), 5, GW_FLOAT64, 0, 4) != GW_ERR_INVALID_ARG) {
      e.add(rank, "truncated eager self receive passed");
    }
  });
}

TEST(P2PTest, InterleavesWithCollectivesFromSeveralThreads) {
  run_world(3, "auto", 60000, [](gw_comm_t c, int rank, int world, RankErrors& e) {
    std::atomic<bool> stop{false};
    // Another thread: point-to-point round the ring, both directions.
    std::thread p2p([&] {
      const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
      for (int i = 0; i < 30; ++i) {
        std::vector<float> out(i % 2 ? 70000 : 7, static_cast<float>(rank * 100 + i));
        std::vector<float> in(out.size(), -1);
        gw_request_t s = nullptr, r = nullptr;
        GW_CHECK_RANK(rank, e, gw_irecv(c, in.data(), in.size(), GW_FLOAT32, prev, 11, &r));
        GW_CHECK_RANK(rank, e, gw_isend(c, out.data(), out.size(), GW_FLOAT32, next, 11, &s));
        GW_CHECK_RANK(rank, e, gw_wait(s, -1));
        GW_CHECK_RANK(rank, e, gw_wait(r, -1));
        if (in.back() != static_cast<float>(prev * 100 + i)) e.add(rank, "ring message wrong");
      }
    });
    // This thread: collectives, with a send to the next rank posted across them.
    for (int i = 0; i < 20; ++i) {
      const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
      int32_t v = rank + i, got = -1;
      gw_request_t s = nullptr;
      GW_CHECK_RANK(rank, e, gw_isend(c, &v, 1, GW_INT32, next, 12, &s));
      std::vector<float> x(20000, 1.0f);
      GW_CHECK_RANK(rank, e, gw_allreduce(c, x.data(), x.data(), x.size(), GW_FLOAT32, GW_SUM));
      if (x[19999] != static_cast<float>(world)) e.add(rank, "allreduce value");
      GW_CHECK_RANK(rank, e, gw_recv(c, &got, 1, GW_INT32, prev, 12));
      GW_CHECK_RANK(rank, e, gw_wait(s, -1));
      if (got != prev + i) e.add(rank, "message across the allreduce wrong");
      GW_CHECK_RANK(rank, e, gw_barrier(c));
    }
    p2p.join();
    stop = true;
  });
}

// Runs op on `rank`, checks it ends with GW_ERR_TIMEOUT after about the deadline (1.5 s).
void expect_deadline(int rank, RankErrors& e, const std::function<gw_status_t()>& op) {
  const auto t0 = std::chrono::steady_clock::now();
  gw_status_t s = op();
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  if (s != GW_ERR_TIMEOUT) e.add(rank, "status " + std::to_string(s) + ": " + last_error());
  if (ms < 1000 || ms > 10000) e.add(rank, "ended after " + std::to_string(ms) + " ms");
}

// Polls a request with gw_test alone until it ends (false: it failed or 10 s passed).
bool poll_until_done(gw_request_t q, int rank, RankErrors& errors) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    int done = 0;
    if (gw_test(q, &done) != GW_OK) {
      errors.add(rank, std::string("gw_test: ") + gw_last_error());
      return false;
    }
    if (done) return true;
    // A polling caller does something else between tests; here: give the core away, so that on
    // a machine with more threads than cores the peer rank runs (a pure spin waits a time slice).
    std::this_thread::yield();
    if (std::chrono::steady_clock::now() > until) {
      errors.add(rank, "request not done after 10 s of gw_test");
      return false;
    }
  }
}

// gw_test moves the engine itself: a ping-pong driven only by gw_isend/gw_irecv and gw_test loops
// (no blocking wait) does not wait for the progress thread's 1 ms period. Round trips measured on
// rank 0. A trip that waits for that period takes about 1 ms (it did, before gw_test moved the
// engine: every trip 1-1.1 ms), so a fifth of the trips under 300 us shows the engine moved by the
// callers themselves. Not the median: beside a parallel test and the suite's background builds the
// median has been 0.9-4 ms with the fastest trips still at 7-14 us. Best of up to 5 rounds.
TEST(P2PTest, TestAloneDrivesAPingPong) {
  // A timing bound: under a sanitizer (5-15x slower, TSan's scheduler) it says nothing.
  if (kSanitizedBuild) GTEST_SKIP() << "timing bound; not under a sanitizer";
  constexpr int kWarm = 20, kTrips = 200;
  constexpr double kBoundUs = 300;
  double best_p20_us = 1e18;
  for (int round = 0; round < 5 && best_p20_us >= kBoundUs; ++round) {
    std::vector<double> rtt_us;
    run_world(2, "shm", 60000, [&](gw_comm_t c, int rank, int, RankErrors& e) {
      const int peer = 1 - rank;
      for (int i = 0; i < kWarm + kTrips; ++i) {
        int64_t out = int64_t{i} * 2 + rank, in = -1;
        gw_request_t rq = nullptr, sq = nullptr;
        const auto t0 = std::chrono::steady_clock::now();
        if (gw_irecv(c, &in, 1, GW_INT64, peer, 7, &rq) != GW_OK) {
          e.add(rank, std::string("irecv: ") + gw_last_error());
          return;
        }
        if (rank == 1 && !poll_until_done(rq, rank, e)) return;
        if (gw_isend(c, &out, 1, GW_INT64, peer, 7, &sq) != GW_OK) {
          e.add(rank, std::string("isend: ") + gw_last_error());
          return;
        }
        if (rank == 0 && !poll_until_done(rq, rank, e)) return;
        if (!poll_until_done(sq, rank, e)) return;
        if (rank == 0 && i >= kWarm) {
          rtt_us.push_back(
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                  .count());
        }
        if (in != int64_t{i} * 2 + peer) {
          e.add(rank, "trip " + std::to_string(i) + ": got " + std::to_string(in));
          return;
        }
      }
    });
    if (HasFailure()) return;
    ASSERT_EQ(rtt_us.size(), static_cast<size_t>(kTrips));
    std::sort(rtt_us.begin(), rtt_us.end());
    const double p20 = rtt_us[rtt_us.size() / 5];
    std::printf(
        "gw_test-driven shm ping-pong, round %d: round trip min %.1f us, 20th percentile %.1f, "
        "median %.1f\n",
        round, rtt_us.front(), p20, rtt_us[rtt_us.size() / 2]);
    best_p20_us = std::min(best_p20_us, p20);
  }
  EXPECT_LT(best_p20_us, kBoundUs) << "best 20th-percentile round trip of up to 5 rounds";
}

// gw_test returns at once while its peer's connection is being set up: the store lookup, which
// waits for the peer's handles (up to 20 ms a try), stays with the progress thread. Rank 1 makes
// its first point-to-point call 300 ms late; rank 0 polls its send meanwhile. Rank 1 destroys
// its communicator right after its receive: an eager send waits for no answer (before eager
// sends, the sender could miss its ACK then, and both ranks ended with a barrier).
TEST(P2PTest, TestDoesNotWaitForTheStoreDuringSetUp) {
  if (kSanitizedBuild) GTEST_SKIP() << "timing bound; not under a sanitizer";
  std::vector<double> call_us;
  run_world(2, "tcp", 60000, [&](gw_comm_t c, int rank, int, RankErrors& e) {
    int32_t v = 41 + rank;
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      GW_CHECK_RANK(rank, e, gw_recv(c, &v, 1, GW_INT32, 0, 3));
      if (v != 41) e.add(rank, "got " + std::to_string(v));
      return;
    }
    gw_request_t q = nullptr;
    GW_CHECK_RANK(rank, e, gw_isend(c, &v, 1, GW_INT32, 1, 3, &q));
    if (q == nullptr) return;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (int done = 0; !done;) {
      const auto t0 = std::chrono::steady_clock::now();
      if (gw_test(q, &done) != GW_OK) {
        e.add(rank, std::string("gw_test: ") + gw_last_error());
        return;
      }
      const auto t1 = std::chrono::steady_clock::now();
      call_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      if (t1 > until) {
        e.add(rank, "send not done after 10 s");
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  if (HasFailure()) return;
  ASSERT_GT(call_us.size(), 10u);  // rank 1 came 300 ms late
  std::sort(call_us.begin(), call_us.end());
  double total_us = 0;
  for (double t : call_us) total_us += t;
  std::printf("gw_test during set-up: %zu calls, median %.1f us, max %.1f us, %.1f ms in all\n",
              call_us.size(), call_us[call_us.size() / 2], call_us.back(), total_us / 1000);
  // With the lookup in the caller's pass, most of the 300 ms went into 20 ms waits on the store:
  // every call took about 20 ms. The median, not the total: on a loaded machine a few calls are
  // preempted for milliseconds.
  EXPECT_LT(call_us[call_us.size() / 2], 5000.0) << "median gw_test call while rank 1 was late";
}

TEST(P2PTest, DeadlineEndsAnUnmatchedReceive) {
  run_world(2, "tcp", 1500, [](gw_comm_t c, int rank, int, RankErrors& e) {
    int32_t x = 0;
    if (rank == 0) {
      expect_deadline(rank, e, [&] { return gw_recv(c, &x, 1, GW_INT32, 1, 5); });  // no sender
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    }
  });
}

// A rendezvous-size send (an eager one completes without its receive: p2p_eager_test.cc).
TEST(P2PTest, DeadlineEndsAnUnmatchedSend) {
  run_world(2, "tcp", 1500, [](gw_comm_t c, int rank, int, RankErrors& e) {
    std::vector<int32_t> x(8192);
    int32_t y = 0;
    if (rank == 1) {
      expect_deadline(rank, e, [&] {
        return gw_send(c, x.data(), x.size(), GW_INT32, 0, 6);  // no receiver
      });
    } else {
      gw_request_t q = nullptr;  // another tag: the link is up, the message never matched
      GW_CHECK_RANK(rank, e, gw_irecv(c, &y, 1, GW_INT32, 1, 7, &q));
      gw_status_t s = gw_wait(q, -1);  // the sender's deadline closes the link, or its own
      if (s != GW_ERR_TIMEOUT && s != GW_ERR_PEER) e.add(rank, "status " + std::to_string(s));
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    }
  });
}

TEST(P2PTest, DeadPeerEndsPendingOpsWithPeerError) {
  // Rank 1 dies only once rank 0's receive is posted: the receive must be pending when the peer
  // goes (a fixed 200 ms was not always enough under TSan on a loaded 2-core machine: the
  // receive was then posted after the death and failed at once, ci27, 2026-12-02).
  std::atomic<bool> posted{false};
  run_world(
      2, "tcp", 30000,
      [&posted](gw_comm_t c, int rank, int, RankErrors& e) {
        int32_t x = 1;
        if (rank == 1) {
          GW_CHECK_RANK(rank, e, gw_send(c, &x, 1, GW_INT32, 0, 1));  // the link is up
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
          while (!posted.load() && std::chrono::steady_clock::now() < until) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          gw_comm_abort(c);  // dies: its connections close
          gw_comm_destroy(c);
          return;
        }
        GW_CHECK_RANK(rank, e, gw_recv(c, &x, 1, GW_INT32, 1, 1));
        std::vector<uint8_t> big(1 << 20);
        gw_request_t r = nullptr;
        GW_CHECK_RANK(rank, e, gw_irecv(c, big.data(), big.size(), GW_UINT8, 1, 2, &r));
        posted.store(true);
        if (r == nullptr) {
          gw_comm_destroy(c);
          return;  // the post failed (recorded above): nothing to wait for
        }
        const auto t0 = std::chrono::steady_clock::now();
        gw_status_t s = gw_wait(r, -1);
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - t0)
                            .count();
        if (s != GW_ERR_PEER || last_error().find("rank 1") == std::string::npos) {
          e.add(rank, "status " + std::to_string(s) + ": " + last_error());
        }
        if (ms > 15000) e.add(rank, "peer error took " + std::to_string(ms) + " ms");
        // Later ops with that peer fail at once.
        if (gw_send(c, &x, 1, GW_INT32, 1, 3) != GW_ERR_PEER) e.add(rank, "later send passed");
        gw_comm_destroy(c);
      },
      true);
}

TEST(P2PTest, DestroyAndAbortEndPendingRequests) {
  std::atomic<int> started{0};
  run_world(
      2, "auto", 60000,
      [&](gw_comm_t c, int rank, int, RankErrors& e) {
        int32_t x = 0, y = 0;
        std::vector<int32_t> z(8192);  // past the eager size: waits for its receive
        gw_request_t r1 = nullptr, r2 = nullptr, s1 = nullptr;
        GW_CHECK_RANK(rank, e, gw_irecv(c, &x, 1, GW_INT32, 1 - rank, 1, &r1));
        GW_CHECK_RANK(rank, e, gw_irecv(c, &y, 1, GW_INT32, GW_ANY_SOURCE, 2, &r2));
        // Self, never received.
        GW_CHECK_RANK(rank, e, gw_isend(c, z.data(), z.size(), GW_INT32, rank, 3, &s1));
        // Both engines started (their handles published in the store, which rank 0's
        // communicator may host) before either rank ends its communicator.
        ++started;
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (started.load() < 2 && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        if (started.load() < 2) e.add(rank, "the other rank never started its requests");
        if (rank == 0) {
          gw_comm_abort(c);
          if (gw_wait(r1, -1) != GW_ERR_ABORTED) e.add(rank, "abort: " + last_error());
          GW_CHECK_RANK(rank, e, gw_comm_destroy(c));
        } else {
          GW_CHECK_RANK(rank, e, gw_comm_destroy(c));
          if (gw_wait(r1, -1) != GW_ERR_ABORTED) e.add(rank, "destroy: " + last_error());
        }
        if (gw_wait(r2, -1) != GW_ERR_ABORTED) e.add(rank, "any-source: " + last_error());
        int done = 0;
        if (gw_test(s1, &done) != GW_ERR_ABORTED || done != 1)
          e.add(rank, "self send: " + last_error());
      },
      true);
}

// A thread blocked in gw_wait moves the engine itself (the progress thread stands aside); destroy
// and abort from another thread still end its wait, with the abort.
TEST(P2PTest, DestroyOrAbortEndsAWaitOfAnotherThread) {
  run_world(
      2, "auto", 60000,
      [](gw_comm_t c, int rank, int, RankErrors& e) {
        int32_t x = 0;
        gw_request_t r = nullptr;
        GW_CHECK_RANK(rank, e, gw_irecv(c, &x, 1, GW_INT32, 1 - rank, 9, &r));  // never sent
        gw_status_t got = GW_OK;
        std::thread waiter([&] { got = gw_wait(r, -1); });
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (rank == 0) gw_comm_abort(c);
        GW_CHECK_RANK(rank, e, gw_comm_destroy(c));
        waiter.join();
        if (got != GW_ERR_ABORTED) e.add(rank, "wait of another thread: " + last_error());
      },
      true);
}

TEST(P2PTest, BadArguments) {
  run_world(2, "auto", 60000, [](gw_comm_t c, int rank, int, RankErrors& e) {
    if (rank == 1) return;
    int32_t x = 0;
    gw_request_t q = nullptr;
    auto expect = [&](gw_status_t s, const char* what, const char* word) {
      if (s != GW_ERR_INVALID_ARG || last_error().find(word) == std::string::npos) {
        e.add(rank, std::string(what) + ": status " + std::to_string(s) + ": " + last_error());
      }
    };
    expect(gw_send(c, &x, 1, GW_INT32, 1, -1), "negative tag", "tag");
    expect(gw_irecv(c, &x, 1, GW_INT32, 1, -5, &q), "negative tag (irecv)", "tag");
    expect(gw_send(c, &x, 1, GW_INT32, 2, 0), "peer out of range", "peer");
    expect(gw_send(c, &x, 1, GW_INT32, GW_ANY_SOURCE, 0), "send to any source", "peer");
    expect(gw_recv(c, &x, 1, GW_INT32, -2, 0), "peer -2", "peer");
    expect(gw_recv(c, &x, 1, GW_INT32, 2, 0), "receive peer out of range", "peer");
    expect(gw_send(c, nullptr, 1, GW_INT32, 1, 0), "NULL buffer", "NULL");
    expect(gw_irecv(c, nullptr, 3, GW_UINT8, 1, 0, &q), "NULL buffer (irecv)", "NULL");
    expect(gw_send(c, &x, SIZE_MAX / 2, GW_INT32, 1, 0), "overflowing count", "overflow");
    expect(gw_isend(c, &x, 1, GW_INT32, 1, 0, nullptr), "NULL request", "request");
    expect(gw_send(c, &x, 1, static_cast<gw_dtype_t>(42), 1, 0), "bad dtype", "dtype");
    expect(gw_send(nullptr, &x, 1, GW_INT32, 1, 0), "NULL comm", "comm");
    expect(gw_wait_recv(nullptr, -1, nullptr, nullptr), "NULL request", "request");
    // A collective's request is not a point-to-point one (and stays valid).
    GW_CHECK_RANK(rank, e, gw_isend(c, nullptr, 0, GW_INT32, 0, 0, &q));  // count 0, NULL: fine
    GW_CHECK_RANK(rank, e, gw_recv(c, nullptr, 0, GW_INT32, 0, 0));
    GW_CHECK_RANK(rank, e, gw_wait(q, -1));
  });
}

#ifdef GW_GRADWIRED_PATH
// Daemon mode has point-to-point through gradwired (tests/daemon/daemon_p2p_test.cc has the
// rules): a world of one sends to itself, blocking and not.
TEST(P2PTest, DaemonModeSelfSend) {
  CleanEnv env;
  gw::testing::LocalDaemon daemon(GW_GRADWIRED_PATH, "gw-p2p");
  ASSERT_TRUE(daemon.use());  // GW_DAEMON names it until the end of the test
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.rank = 0;
  cfg.world_size = 1;
  cfg.timeout_ms = 20000;
  gw_comm_t c = nullptr;
  EXPECT_EQ(gw_comm_init(&c, &cfg), GW_OK) << last_error();
  if (c != nullptr) {
    int32_t x = 42, y = 0;
    EXPECT_EQ(gw_send(c, &x, 1, GW_INT32, 0, 0), GW_OK) << last_error();
    EXPECT_EQ(gw_recv(c, &y, 1, GW_INT32, 0, 0), GW_OK) << last_error();
    EXPECT_EQ(y, 42);
    gw_request_t q = nullptr;
    y = 0;
    EXPECT_EQ(gw_irecv(c, &y, 1, GW_INT32, GW_ANY_SOURCE, 1, &q), GW_OK) << last_error();
    EXPECT_EQ(gw_send(c, &x, 1, GW_INT32, 0, 1), GW_OK) << last_error();
    size_t n = 0;
    int src = -1;
    EXPECT_EQ(gw_wait_recv(q, -1, &n, &src), GW_OK) << last_error();
    EXPECT_EQ(y, 42);
    EXPECT_EQ(n, 1u);
    EXPECT_EQ(src, 0);
    EXPECT_EQ(gw_comm_destroy(c), GW_OK) << last_error();
  }
}
#endif

}  // namespace
