// Eager (standard-mode) point-to-point sends through the C ABI (direct mode, ranks as threads as
// in p2p_test.cc): a send of at most the eager size (16 KiB) completes once its RTS, the payload
// inside, is handed to the transport, without waiting for the receive; larger sends keep the
// rendezvous and complete only once received. Checked structurally (who waits for whom, through
// flags the ranks share), never by timing: an eager send done before its receive is posted, order
// of eager and rendezvous sends with one tag, truncation failing only the receive, delivery after
// the sender destroyed its communicator, a receiver that destroys right after its receive, a
// dead sender's last messages, the deadline of an eager send nobody can take, frames reused
// across messages of changing sizes.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/gradwire.h"
#include "tests/support/capi_world.h"

namespace {

using namespace gw::testing;  // run_world, RankErrors, GW_CHECK_RANK (capi_world.h)

constexpr size_t kEager = 16384;  // PointToPoint::kEagerBytes

// Waits (up to 20 s) until flag is set; false if it never was.
bool await(const std::atomic<bool>& flag) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!flag.load()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Polls q with gw_test alone until it is done or, when stop is given, until stop is set (then
// *done stays 0). false: gw_test failed or 20 s passed.
bool poll(gw_request_t q, int* done, const std::atomic<bool>* stop, int rank, RankErrors& e) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  *done = 0;
  while (!*done) {
    if (gw_test(q, done) != GW_OK) {
      e.add(rank, std::string("gw_test: ") + gw_last_error());
      return false;
    }
    if (*done || (stop && stop->load())) return true;
    if (std::chrono::steady_clock::now() > until) {
      e.add(rank, "request not done after 20 s of gw_test");
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// Rank 0 sends to rank 1, which posts its receive only once rank 0 said its send is done (or,
// for the rendezvous size, that it stopped polling it): an eager send completes without its
// receive, a rendezvous one does not (it is still running when the receive is posted).
TEST(P2PEagerTest, EagerSendCompletesBeforeTheReceiveIsPosted) {
  for (const char* transport : {"tcp", "shm"}) {
    SCOPED_TRACE(transport);
    for (size_t bytes : {size_t{0}, size_t{8}, kEager, kEager + 8}) {
      SCOPED_TRACE(std::to_string(bytes) + " bytes");
      std::atomic<bool> sender_done{false}, receiver_posted{false};
      run_world(2, transport, 60000, [&](gw_comm_t c, int rank, int, RankErrors& e) {
        std::vector<uint8_t> buf(bytes + 1, static_cast<uint8_t>(rank == 0 ? 7 : 0));
        uint8_t warm = 0;
        if (rank == 1) {
          // The link up first (rank 1's engine listening), then the receive only once rank 0
          // is done with its send (eager) or has seen it not done while nothing was posted.
          GW_CHECK_RANK(rank, e, gw_recv(c, &warm, 1, GW_UINT8, 0, 1));
          if (!await(sender_done)) e.add(rank, "rank 0 never said its send was done");
          receiver_posted = true;
          size_t n = 0;
          gw_request_t q = nullptr;
          GW_CHECK_RANK(rank, e, gw_irecv(c, buf.data(), bytes, GW_UINT8, 0, 2, &q));
          GW_CHECK_RANK(rank, e, gw_wait_recv(q, -1, &n, nullptr));
          if (n != bytes || (bytes > 0 && (buf[0] != 7 || buf[bytes - 1] != 7))) {
            e.add(rank, "received " + std::to_string(n) + " bytes, wrong content");
          }
          return;
        }
        GW_CHECK_RANK(rank, e, gw_send(c, &warm, 1, GW_UINT8, 1, 1));
        gw_request_t q = nullptr;
        GW_CHECK_RANK(rank, e, gw_isend(c, buf.data(), bytes, GW_UINT8, 1, 2, &q));
        if (q == nullptr) return;
        int done = 0;
        if (bytes <= kEager) {
          if (!poll(q, &done, nullptr, rank, e)) return;
          if (receiver_posted) e.add(rank, "the receive was posted before the send was done");
          std::fill(buf.begin(), buf.end(), 0);  // the buffer is free: the message is a copy
          sender_done = true;
          return;
        }
        // Rendezvous: polled for 300 ms (the receive is not posted meanwhile), not done.
        std::atomic<bool> stop{false};
        std::thread timer([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          stop = true;
        });
        const bool polled = poll(q, &done, &stop, rank, e);
        timer.join();
        if (polled && done) e.add(rank, "a rendezvous-size send completed with no receive");
        sender_done = true;
        if (!done) GW_CHECK_RANK(rank, e, gw_wait(q, -1));
      });
    }
  }
}

// One tag, sizes alternating around the eager size, all sent before rank 1 posts anything: each
// eager send completes at once, even behind a rendezvous one still waiting for its receive;
// rank 1 then receives them in send order (every one of them unexpected by then).
TEST(P2PEagerTest, MixedEagerAndRendezvousSendsKeepTheirOrderOnOneTag) {
  for (const char* transport : {"tcp", "shm"}) {
    SCOPED_TRACE(transport);
    std::atomic<bool> sent{false};
    run_world(2, transport, 60000, [&](gw_comm_t c, int rank, int, RankErrors& e) {
      constexpr int kN = 24;
      auto size_of = [](int i) -> size_t { return i % 3 == 1 ? 3000 : (i % 3 == 2 ? 0 : 5); };
      int32_t warm = 0;
      if (rank == 0) {
        GW_CHECK_RANK(rank, e, gw_send(c, &warm, 1, GW_INT32, 1, 1));
        std::vector<std::vector<int64_t>> bufs(kN);
        std::vector<gw_request_t> reqs(kN, nullptr);
        for (int i = 0; i < kN; ++i) {
          bufs[i].assign(size_of(i), 1000 + i);
          GW_CHECK_RANK(rank, e,
                        gw_isend(c, bufs[i].data(), bufs[i].size(), GW_INT64, 1, 9, &reqs[i]));
        }
        // Every eager send is done before rank 1 posts a receive; the rendezvous ones are not.
        for (int i = 0; i < kN; ++i) {
          if (reqs[i] == nullptr || size_of(i) * 8 > kEager) continue;
          int done = 0;
          if (!poll(reqs[i], &done, nullptr, rank, e)) return;
          reqs[i] = nullptr;
        }
        sent = true;
        for (auto q : reqs) {
          if (q) GW_CHECK_RANK(rank, e, gw_wait(q, -1));
        }
        return;
      }
      GW_CHECK_RANK(rank, e, gw_recv(c, &warm, 1, GW_INT32, 0, 1));
      if (!await(sent)) e.add(rank, "rank 0 never finished its eager sends");
      std::vector<std::vector<int64_t>> in(kN, std::vector<int64_t>(3000, -1));
      std::vector<gw_request_t> reqs(kN, nullptr);
      for (int i = 0; i < kN; ++i) {
        GW_CHECK_RANK(rank, e, gw_irecv(c, in[i].data(), in[i].size(), GW_INT64, 0, 9, &reqs[i]));
      }
      for (int i = 0; i < kN; ++i) {
        size_t n = 0;
        GW_CHECK_RANK(rank, e, gw_wait_recv(reqs[i], -1, &n, nullptr));
        if (n != size_of(i) || (n > 0 && (in[i][0] != 1000 + i || in[i][n - 1] != 1000 + i))) {
          e.add(rank, "receive " + std::to_string(i) + ": " + std::to_string(n) +
                          " elements, first " + std::to_string(in[i][0]));
        }
      }
    });
  }
}

// An eager message larger than its receive: the send completed (GW_OK), the receive fails with
// "message truncated" naming the message's real size; the next message is received whole.
TEST(P2PEagerTest, TruncatedEagerMessageFailsOnlyTheReceive) {
  run_world(2, "auto", 60000, [](gw_comm_t c, int rank, int, RankErrors& e) {
    std::vector<int32_t> b(1000, rank == 0 ? 5 : 0);
    if (rank == 0) {
      GW_CHECK_RANK(rank, e, gw_send(c, b.data(), 1000, GW_INT32, 1, 3));  // 4000 bytes
      GW_CHECK_RANK(rank, e, gw_send(c, b.data(), 1000, GW_INT32, 1, 3));
      GW_CHECK_RANK(rank, e, gw_send(c, b.data(), 10, GW_INT32, 0, 4));  // to itself
      if (gw_recv(c, b.data(), 2, GW_INT32, 0, 4) != GW_ERR_INVALID_ARG ||
          last_error().find("truncated") == std::string::npos) {
        e.add(rank, "truncated self receive: " + last_error());
      }
      return;
    }
    gw_request_t q = nullptr;
    GW_CHECK_RANK(rank, e, gw_irecv(c, b.data(), 500, GW_INT32, 0, 3, &q));
    gw_status_t s = gw_wait_recv(q, -1, nullptr, nullptr);
    if (s != GW_ERR_INVALID_ARG || last_error().find("truncated") == std::string::npos ||
        last_error().find("4000") == std::string::npos) {
      e.add(rank, "truncated receive: status " + std::to_string(s) + ": " + last_error());
    }
    size_t n = 0;
    GW_CHECK_RANK(rank, e, gw_irecv(c, b.data(), 1000, GW_INT32, 0, 3, &q));
    GW_CHECK_RANK(rank, e, gw_wait_recv(q, -1, &n, nullptr));
    if (n != 1000 || b[999] != 5) e.add(rank, "the next message: " + std::to_string(n));
  });
}

// The sender sends eager messages and destroys its communicator at once; the receiver posts its
// receives only after that destroy returned: every message arrives (destroy flushed the frames of
// the completed sends, and the receiver keeps what arrived from a rank that left). Both ranks as
// the sender (rank 0 also hosts the store).
TEST(P2PEagerTest, SendThenDestroyStillDelivers) {
  for (const char* transport : {"tcp", "shm"}) {
    for (int sender : {0, 1}) {
      SCOPED_TRACE(std::string(transport) + ", sender rank " + std::to_string(sender));
      std::atomic<bool> destroyed{false};
      run_world(
          2, transport, 60000,
          [&](gw_comm_t c, int rank, int, RankErrors& e) {
            constexpr int kN = 20;
            auto size_of = [](int i) -> size_t { return i == kN - 1 ? kEager : 1 + 97 * i; };
            if (rank == sender) {
              for (int i = 0; i < kN; ++i) {
                std::vector<uint8_t> b(size_of(i), static_cast<uint8_t>(i + 1));
                GW_CHECK_RANK(rank, e, gw_send(c, b.data(), b.size(), GW_UINT8, 1 - rank, 4));
              }
              GW_CHECK_RANK(rank, e, gw_comm_destroy(c));
              destroyed = true;
              return;
            }
            // The first receive starts this rank's engine (the sender connects to it).
            std::vector<uint8_t> b(kEager, 0);
            size_t n = 0;
            gw_request_t q = nullptr;
            GW_CHECK_RANK(rank, e, gw_irecv(c, b.data(), b.size(), GW_UINT8, sender, 4, &q));
            if (!await(destroyed)) e.add(rank, "the sender never destroyed");
            for (int i = 0; i < kN; ++i) {
              if (i > 0) {
                std::fill(b.begin(), b.end(), 0);
                gw_status_t s = gw_irecv(c, b.data(), b.size(), GW_UINT8, sender, 4, &q);
                if (s != GW_OK) {
                  e.add(rank, "message " + std::to_string(i) + ": irecv: " + last_error());
                  break;
                }
              }
              gw_status_t s = gw_wait_recv(q, -1, &n, nullptr);
              if (s != GW_OK || n != size_of(i) || b[0] != i + 1 || b[n - 1] != i + 1) {
                e.add(rank, "message " + std::to_string(i) + ": status " + std::to_string(s) +
                                " (" + last_error() + "), " + std::to_string(n) + " bytes");
                break;
              }
            }
            GW_CHECK_RANK(rank, e, gw_comm_destroy(c));
          },
          true);
    }
  }
}

// A receiver that destroys its communicator right after its first receive, from a sender it never
// sent to, comes 300 ms late: the sender's blocking eager send still ends with GW_OK (it failed
// with GW_ERR_PEER or ran to its deadline when it waited for an ACK, 3 runs in 3). Three rounds.
TEST(P2PEagerTest, ReceiverThatLeavesAfterItsReceiveDoesNotFailTheSender) {
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    run_world(2, "tcp", 30000, [](gw_comm_t c, int rank, int, RankErrors& e) {
      int32_t v = 41 + rank;
      if (rank == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        GW_CHECK_RANK(rank, e, gw_recv(c, &v, 1, GW_INT32, 0, 3));
        if (v != 41) e.add(rank, "got " + std::to_string(v));
        return;  // destroyed at once by run_world
      }
      GW_CHECK_RANK(rank, e, gw_send(c, &v, 1, GW_INT32, 1, 3));
    });
  }
}

// A sender that sends eager messages and then dies (abort, destroy): the receiver still receives
// what it sent, then a further receive from it ends with GW_ERR_PEER, promptly.
TEST(P2PEagerTest, DeadSendersLastMessagesArriveThenPeerError) {
  std::atomic<bool> dead{false};
  run_world(
      2, "tcp", 30000,
      [&](gw_comm_t c, int rank, int, RankErrors& e) {
        if (rank == 1) {
          for (int32_t i = 0; i < 3; ++i) GW_CHECK_RANK(rank, e, gw_send(c, &i, 1, GW_INT32, 0, 2));
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          gw_comm_abort(c);
          gw_comm_destroy(c);
          dead = true;
          return;
        }
        int32_t x = -1;
        gw_request_t q = nullptr;
        GW_CHECK_RANK(rank, e, gw_irecv(c, &x, 1, GW_INT32, 1, 7, &q));  // never sent
        if (!await(dead)) e.add(rank, "rank 1 never died");
        gw_status_t s = gw_wait(q, 20000);
        if (s != GW_ERR_PEER || last_error().find("rank 1") == std::string::npos) {
          e.add(rank, "pending receive: status " + std::to_string(s) + ": " + last_error());
        }
        for (int32_t i = 0; i < 3; ++i) {
          GW_CHECK_RANK(rank, e, gw_recv(c, &x, 1, GW_INT32, 1, 2));
          if (x != i) e.add(rank, "message " + std::to_string(i) + ": got " + std::to_string(x));
        }
        s = gw_recv(c, &x, 1, GW_INT32, 1, 2);
        if (s != GW_ERR_PEER) e.add(rank, "a fourth receive: status " + std::to_string(s));
        gw_comm_destroy(c);
      },
      true);
}

// The engine reuses its frame buffers (a spare list per peer) and copies a message that meets a
// posted receive straight from its control slot: eager messages of changing sizes, first all
// unexpected (rank 1 receives only once rank 0 sent them all), then all matching posted receives
// (rank 0 sends only once rank 1 posted them all), each arrive whole, with their own size.
TEST(P2PEagerTest, ReusedFramesCarryEachMessageWhole) {
  for (const char* transport : {"tcp", "shm"}) {
    SCOPED_TRACE(transport);
    std::atomic<bool> all_sent{false}, all_posted{false};
    run_world(2, transport, 60000, [&](gw_comm_t c, int rank, int, RankErrors& e) {
      constexpr int kN = 40;
      const size_t sizes[] = {kEager, 1, 0, 777, 8, kEager - 1, 32};
      auto size_of = [&](int i) { return sizes[i % 7]; };
      auto byte_of = [](int i, size_t j) { return static_cast<uint8_t>(i * 31 + j * 7 + 1); };
      uint8_t warm = 0;
      for (int phase = 0; phase < 2; ++phase) {
        const int tag = 20 + phase;
        if (rank == 0) {
          if (phase == 0) GW_CHECK_RANK(rank, e, gw_send(c, &warm, 1, GW_UINT8, 1, 1));
          if (phase == 1 && !await(all_posted)) e.add(rank, "rank 1 never posted its receives");
          std::vector<std::vector<uint8_t>> bufs(kN);
          for (int i = 0; i < kN; ++i) {
            bufs[i].resize(size_of(i));
            for (size_t j = 0; j < bufs[i].size(); ++j) bufs[i][j] = byte_of(i, j);
            GW_CHECK_RANK(rank, e, gw_send(c, bufs[i].data(), bufs[i].size(), GW_UINT8, 1, tag));
          }
          if (phase == 0) all_sent = true;
          continue;
        }
        if (phase == 0) {
          GW_CHECK_RANK(rank, e, gw_recv(c, &warm, 1, GW_UINT8, 0, 1));
          if (!await(all_sent)) e.add(rank, "rank 0 never sent its messages");
        }
        std::vector<std::vector<uint8_t>> bufs(kN, std::vector<uint8_t>(kEager, 0xee));
        std::vector<gw_request_t> reqs(kN, nullptr);
        for (int i = 0; i < kN; ++i) {
          GW_CHECK_RANK(rank, e, gw_irecv(c, bufs[i].data(), kEager, GW_UINT8, 0, tag, &reqs[i]));
        }
        if (phase == 1) all_posted = true;
        for (int i = 0; i < kN; ++i) {
          if (reqs[i] == nullptr) continue;
          size_t n = 0;
          GW_CHECK_RANK(rank, e, gw_wait_recv(reqs[i], -1, &n, nullptr));
          bool whole = n == size_of(i);
          for (size_t j = 0; whole && j < n; ++j) whole = bufs[i][j] == byte_of(i, j);
          if (whole && n < kEager) whole = bufs[i][n] == 0xee;  // nothing written past it
          if (!whole) {
            e.add(rank, "phase " + std::to_string(phase) + ", message " + std::to_string(i) + ": " +
                            std::to_string(n) + " bytes, wrong size or content");
          }
        }
      }
    });
  }
}

// An eager send to a rank that never makes a point-to-point call cannot reach the transport (no
// connection): it ends with GW_ERR_TIMEOUT at the deadline (1.5 s), not with GW_OK.
TEST(P2PEagerTest, EagerSendNobodyCanTakeEndsAtTheDeadline) {
  run_world(2, "tcp", 1500, [](gw_comm_t c, int rank, int, RankErrors& e) {
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      return;
    }
    int32_t x = 0;
    const auto t0 = std::chrono::steady_clock::now();
    gw_status_t s = gw_send(c, &x, 1, GW_INT32, 1, 5);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    if (s != GW_ERR_TIMEOUT) e.add(rank, "status " + std::to_string(s) + ": " + last_error());
    if (ms < 1000 || ms > 10000) e.add(rank, "ended after " + std::to_string(ms) + " ms");
  });
}

}  // namespace
