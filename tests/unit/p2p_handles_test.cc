// The C ABI's handles on the point-to-point fast path (capi/handle_table.h): a communicator handle
// is resolved without a lock, request handles are reused slots, gw_send/gw_recv make no request
// at all. Stale handles (destroyed communicators, completed requests) still give a clear error,
// also while another thread destroys the communicator under running calls; many outstanding
// requests get distinct handles and their slots are reused, not grown per message; destroy with
// many pending requests ends each of them once.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/gradwire.h"
#include "tests/support/capi_world.h"
#include "tests/support/test_env.h"

namespace {

using namespace gw::testing;  // run_world, RankErrors, GW_CHECK_RANK (capi_world.h)

bool says(const std::string& s, const char* word) { return s.find(word) != std::string::npos; }

// Every point-to-point entry point on a destroyed communicator and on completed requests.
TEST(P2PHandlesTest, StaleHandlesOnTheFastPath) {
  run_world(
      1, "auto", 30000,
      [](gw_comm_t c, int rank, int, RankErrors& e) {
        int32_t x = 5, y = 0;
        gw_request_t s = nullptr, r = nullptr;
        GW_CHECK_RANK(rank, e, gw_isend(c, &x, 1, GW_INT32, 0, 1, &s));
        GW_CHECK_RANK(rank, e, gw_irecv(c, &y, 1, GW_INT32, 0, 1, &r));
        GW_CHECK_RANK(rank, e, gw_wait(s, -1));
        size_t n = 0;
        int src = -1;
        GW_CHECK_RANK(rank, e, gw_wait_recv(r, -1, &n, &src));
        if (y != 5 || n != 1 || src != 0) e.add(rank, "self message not received");
        // Completed requests: every call refuses them, outputs untouched.
        int done = 7;
        if (gw_wait(s, 0) != GW_ERR_INVALID_ARG || !says(last_error(), "already completed")) {
          e.add(rank, "wait on a completed request: " + last_error());
        }
        if (gw_test(r, &done) != GW_ERR_INVALID_ARG || done != 7) {
          e.add(rank, "test on a completed request: " + last_error());
        }
        if (gw_wait_recv(r, 0, &n, &src) != GW_ERR_INVALID_ARG) {
          e.add(rank, "wait_recv on a completed request: " + last_error());
        }
        GW_CHECK_RANK(rank, e, gw_comm_destroy(c));
        auto stale = [&](gw_status_t got, const char* call) {
          if (got != GW_ERR_INVALID_ARG || !says(last_error(), "destroyed")) {
            e.add(rank, std::string(call) + " on a destroyed comm: " + std::to_string(got) + ": " +
                            last_error());
          }
        };
        gw_request_t q = nullptr;
        stale(gw_send(c, &x, 1, GW_INT32, 0, 2), "gw_send");
        stale(gw_recv(c, &y, 1, GW_INT32, 0, 2), "gw_recv");
        stale(gw_isend(c, &x, 1, GW_INT32, 0, 2, &q), "gw_isend");
        stale(gw_irecv(c, &y, 1, GW_INT32, 0, 2, &q), "gw_irecv");
        if (q != nullptr) e.add(rank, "a request was made on a destroyed comm");
        stale(gw_comm_destroy(c), "gw_comm_destroy");
      },
      /*destroy_inside=*/true);
}

// Threads sending to themselves through the lock-free lookup while another destroys the
// communicator: each call either works or fails cleanly (aborted, or the handle destroyed); none
// crashes or hangs, and every request made is ended.
TEST(P2PHandlesTest, DestroyUnderRunningFastPathCalls) {
  run_world(
      1, "auto", 30000,
      [](gw_comm_t c, int rank, int, RankErrors& e) {
        std::atomic<bool> go{false};
        std::atomic<int> ok_calls{0}, bad{0};
        std::vector<std::thread> callers;
        for (int t = 0; t < 3; ++t) {
          callers.emplace_back([&, t] {
            while (!go.load()) std::this_thread::yield();
            for (int i = 0; i < 200000; ++i) {
              int32_t x = i, y = -1;
              gw_status_t s = gw_send(c, &x, 1, GW_INT32, 0, t);
              if (s == GW_OK) s = gw_recv(c, &y, 1, GW_INT32, 0, t);
              if (s == GW_OK) {
                ++ok_calls;
                continue;
              }
              const std::string why = last_error();
              if (s != GW_ERR_ABORTED && !(s == GW_ERR_INVALID_ARG && says(why, "destroyed"))) {
                ++bad;
                e.add(rank, "call during destroy: " + std::to_string(s) + ": " + why);
              }
              if (s == GW_ERR_INVALID_ARG) return;  // the handle is gone for good
            }
          });
        }
        go = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        GW_CHECK_RANK(rank, e, gw_comm_destroy(c));
        for (auto& t : callers) t.join();
        std::printf("[ figure ] %d send+recv pairs before the destroy, %d bad results\n",
                    ok_calls.load(), bad.load());
      },
      /*destroy_inside=*/true);
}

// Many requests outstanding at once (more than one slab of the table): distinct handles, every
// message right; over several rounds the slots are reused, not one new slot per message.
TEST(P2PHandlesTest, RequestPoolReuseUnderManyOutstanding) {
  constexpr int kPerRound = 600;  // each way, per rank: 2400 handles live at the peak
  constexpr int kRounds = 5;
  std::mutex mu;
  std::set<gw_request_t> ever;
  run_world(2, "auto", 60000, [&](gw_comm_t c, int rank, int, RankErrors& e) {
    const int peer = 1 - rank;
    std::vector<int32_t> out(kPerRound), in(kPerRound);
    for (int round = 0; round < kRounds; ++round) {
      std::vector<gw_request_t> reqs;
      for (int i = 0; i < kPerRound; ++i) {
        in[i] = -1;
        gw_request_t q = nullptr;
        GW_CHECK_RANK(rank, e, gw_irecv(c, &in[i], 1, GW_INT32, peer, i, &q));
        reqs.push_back(q);
      }
      for (int i = 0; i < kPerRound; ++i) {
        out[i] = rank * 1000000 + round * 10000 + i;
        gw_request_t q = nullptr;
        GW_CHECK_RANK(rank, e, gw_isend(c, &out[i], 1, GW_INT32, peer, i, &q));
        reqs.push_back(q);
      }
      const std::set<gw_request_t> distinct(reqs.begin(), reqs.end());
      if (distinct.size() != reqs.size() || distinct.count(nullptr) != 0) {
        e.add(rank, "outstanding requests share a handle");
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        ever.insert(reqs.begin(), reqs.end());
      }
      for (auto q : reqs) GW_CHECK_RANK(rank, e, gw_wait(q, -1));
      for (int i = 0; i < kPerRound; ++i) {
        if (in[i] != peer * 1000000 + round * 10000 + i) {
          e.add(rank, "round " + std::to_string(round) + ": message " + std::to_string(i) +
                          " wrong: " + std::to_string(in[i]));
          break;
        }
      }
      GW_CHECK_RANK(rank, e, gw_barrier(c));  // both ranks' handles of this round are back
    }
  });
  // At most 2 x 2 x kPerRound live at once; one new handle per message would be kRounds times
  // that. Slots free before the test (other tests' requests) may add up to a few slabs.
  const size_t peak = 2 * 2 * kPerRound;
  EXPECT_LT(ever.size(), 2 * peak) << "handles over " << kRounds << " rounds";
}

// Destroy with many pending requests (receives never matched, sends to oneself never received):
// each ends once with GW_ERR_ABORTED, after which its handle is refused; a new communicator's
// requests then reuse the slots and work.
TEST(P2PHandlesTest, DestroyWithPendingPooledRequests) {
  constexpr int kPending = 700;
  std::vector<gw_request_t> pending;
  std::vector<int32_t> sink(kPending);
  std::vector<int32_t> big(8192);  // past the eager size: a send to oneself waits for its receive
  run_world(
      1, "auto", 30000,
      [&](gw_comm_t c, int rank, int, RankErrors& e) {
        for (int i = 0; i < kPending; ++i) {
          gw_request_t q = nullptr;
          if (i % 2) {
            GW_CHECK_RANK(rank, e, gw_irecv(c, &sink[i], 1, GW_INT32, 0, 100 + i, &q));
          } else {
            GW_CHECK_RANK(rank, e, gw_isend(c, big.data(), big.size(), GW_INT32, 0, 100 + i, &q));
          }
          pending.push_back(q);
        }
        GW_CHECK_RANK(rank, e, gw_comm_destroy(c));
        int aborted = 0;
        for (auto q : pending) {
          if (gw_wait(q, 5000) == GW_ERR_ABORTED) ++aborted;
        }
        if (aborted != kPending) {
          e.add(rank, std::to_string(aborted) + " of " + std::to_string(kPending) + " aborted");
        }
        for (auto q : pending) {
          int done = 0;
          if (gw_test(q, &done) != GW_ERR_INVALID_ARG) e.add(rank, "an ended request was taken");
        }
      },
      /*destroy_inside=*/true);
  // A new communicator: its requests (in the freed slots) work; the old handles stay refused
  // until their slots are taken again.
  run_world(1, "auto", 30000, [&](gw_comm_t c, int rank, int, RankErrors& e) {
    for (int i = 0; i < 100; ++i) {
      int32_t x = i, y = -1;
      gw_request_t s = nullptr, r = nullptr;
      GW_CHECK_RANK(rank, e, gw_irecv(c, &y, 1, GW_INT32, 0, 5, &r));
      GW_CHECK_RANK(rank, e, gw_isend(c, &x, 1, GW_INT32, 0, 5, &s));
      GW_CHECK_RANK(rank, e, gw_wait(s, -1));
      GW_CHECK_RANK(rank, e, gw_wait(r, -1));
      if (y != i) e.add(rank, "message " + std::to_string(i) + " wrong");
    }
  });
}

}  // namespace
