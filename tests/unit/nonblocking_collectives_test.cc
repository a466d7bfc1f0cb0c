// The i-forms of every collective through the C ABI (direct mode), ranks as threads: each against
// the same data as its blocking call, requests of every kind in flight together and waited for
// in any order, interleaved with point-to-point from other threads, destroy and abort with
// pending requests, bad arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/capi_world.h"

namespace {

using gw::testing::get_elem;
using gw::testing::gw_dtype_bytes;
using gw::testing::kAllDtypes;
using gw::testing::last_error;
using gw::testing::put_elem;
using gw::testing::RankErrors;
using gw::testing::run_world;

int value(int r, size_t i, int salt) { return static_cast<int>((r + i + salt) % 5) + 1; }

// Buffers of one round of every i-form, the expected results computed on the side.
struct Round {
  gw_dtype_t d;
  size_t n;
  int world, rank, root;
  size_t es;
  std::vector<uint8_t> bcast, ag_in, ag_out, rs_in, rs_out, a2a_in, a2a_out, a2av_in, a2av_out,
      red_in, red_out, ga_in, ga_out, sc_in, sc_out, ar_in, ar_out;
  std::vector<size_t> a2av_counts, a2av_displs;

  Round(gw_dtype_t dt, size_t count, int w, int r, int rt)
      : d(dt), n(count), world(w), rank(r), root(rt), es(gw_dtype_bytes(dt)) {
    const auto p = static_cast<size_t>(w);
    auto make = [&](size_t elems, int salt, bool fill) {
      std::vector<uint8_t> b(std::max<size_t>(1, elems * es), 0xEE);
      if (fill) {
        for (size_t i = 0; i < elems; ++i) put_elem(d, b.data(), i, value(r, i, salt));
      }
      return b;
    };
    bcast = make(n, 1, true);
    ag_in = make(n, 2, true);
    ag_out = make(p * n, 0, false);
    rs_in = make(p * n, 3, true);
    rs_out = make(n, 0, false);
    a2a_in = make(p * n, 4, true);
    a2a_out = make(p * n, 0, false);
    // alltoallv: n + j elements to rank j (each rank the same split), packed.
    a2av_counts.resize(p);
    a2av_displs.resize(p);
    size_t at = 0;
    for (size_t j = 0; j < p; ++j) {
      a2av_counts[j] = n + j;
      a2av_displs[j] = at;
      at += n + j;
    }
    a2av_in = make(at, 5, true);
    red_in = make(n, 6, true);
    red_out = make(n, 0, false);
    ga_in = make(n, 7, true);
    ga_out = make(p * n, 0, false);
    sc_in = make(p * n, 8, true);
    sc_out = make(n, 0, false);
    ar_in = make(n, 9, true);
    ar_out = make(n, 0, false);
  }

  // Starts every i-form; the requests in issue order.
  std::vector<gw_request_t> start(gw_comm_t c, RankErrors& e) {
    std::vector<gw_request_t> q(10, nullptr);
    // The alltoallv receive counts: n + rank from every rank.
    a2av_recv_counts.assign(static_cast<size_t>(world), n + rank);
    a2av_recv_displs.resize(static_cast<size_t>(world));
    for (size_t j = 0; j < a2av_recv_displs.size(); ++j) a2av_recv_displs[j] = j * (n + rank);
    a2av_out.assign(std::max<size_t>(1, world * (n + rank) * es), 0xEE);
    GW_CHECK_RANK(rank, e, gw_ibroadcast(c, bcast.data(), n, d, root, &q[0]));
    GW_CHECK_RANK(rank, e, gw_iallgather(c, ag_in.data(), ag_out.data(), n, d, &q[1]));
    GW_CHECK_RANK(rank, e, gw_ireduce_scatter(c, rs_in.data(), rs_out.data(), n, d, GW_SUM, &q[2]));
    GW_CHECK_RANK(rank, e, gw_ialltoall(c, a2a_in.data(), a2a_out.data(), n, d, &q[3]));
    GW_CHECK_RANK(
        rank, e,
        gw_ialltoallv(c, a2av_in.data(), a2av_counts.data(), a2av_displs.data(), a2av_out.data(),
                      a2av_recv_counts.data(), a2av_recv_displs.data(), d, &q[4]));
    GW_CHECK_RANK(rank, e, gw_ireduce(c, red_in.data(), red_out.data(), n, d, GW_MAX, root, &q[5]));
    GW_CHECK_RANK(rank, e, gw_igather(c, ga_in.data(), ga_out.data(), n, d, root, &q[6]));
    GW_CHECK_RANK(rank, e, gw_iscatter(c, sc_in.data(), sc_out.data(), n, d, root, &q[7]));
    GW_CHECK_RANK(rank, e, gw_ibarrier(c, &q[8]));
    GW_CHECK_RANK(rank, e, gw_iallreduce(c, ar_in.data(), ar_out.data(), n, d, GW_SUM, &q[9]));
    return q;
  }

  std::vector<size_t> a2av_recv_counts, a2av_recv_displs;

  // The first wrong element, or "".
  std::string check() const {
    const auto p = static_cast<size_t>(world);
    auto at = [&](const std::vector<uint8_t>& b, size_t i) { return get_elem(d, b.data(), i); };
    auto bad = [&](const char* what, size_t i, int got, int want) {
      return std::string(what) + " dtype " + std::to_string(d) + " element " + std::to_string(i) +
             ": " + std::to_string(got) + " != " + std::to_string(want);
    };
    for (size_t i = 0; i < n; ++i) {
      if (at(bcast, i) != value(root, i, 1))
        return bad("ibroadcast", i, at(bcast, i), value(root, i, 1));
      int sum = 0, mx = 0, rs = 0;
      for (int r = 0; r < world; ++r) {
        sum += value(r, i, 9);
        mx = std::max(mx, value(r, i, 6));
        rs += value(r, rank * n + i, 3);
      }
      if (at(ar_out, i) != sum) return bad("iallreduce", i, at(ar_out, i), sum);
      if (at(rs_out, i) != rs) return bad("ireduce_scatter", i, at(rs_out, i), rs);
      if (rank == root && at(red_out, i) != mx) return bad("ireduce", i, at(red_out, i), mx);
      if (at(sc_out, i) != value(root, rank * n + i, 8)) {
        return bad("iscatter", i, at(sc_out, i), value(root, rank * n + i, 8));
      }
      for (size_t r = 0; r < p; ++r) {
        const int ri = static_cast<int>(r);
        if (at(ag_out, r * n + i) != value(ri, i, 2))
          return bad("iallgather", r * n + i, at(ag_out, r * n + i), value(ri, i, 2));
        if (at(a2a_out, r * n + i) != value(ri, rank * n + i, 4)) {
          return bad("ialltoall", r * n + i, at(a2a_out, r * n + i), value(ri, rank * n + i, 4));
        }
        if (rank == root && at(ga_out, r * n + i) != value(ri, i, 7)) {
          return bad("igather", r * n + i, at(ga_out, r * n + i), value(ri, i, 7));
        }
      }
    }
    for (size_t r = 0; r < p; ++r) {
      // Rank r's block for this rank starts at sum_{j < rank} (n + j) of its input.
      size_t from = 0;
      for (int j = 0; j < rank; ++j) from += n + j;
      for (size_t k = 0; k < n + rank; ++k) {
        const int want = value(static_cast<int>(r), from + k, 5);
        const int got = at(a2av_out, r * (n + rank) + k);
        if (got != want) return bad("ialltoallv", r * (n + rank) + k, got, want);
      }
    }
    return "";
  }
};

TEST(NonblockingCollectivesTest, EveryIFormInFlightTogetherOneToEightRanks) {
  for (int world : {1, 2, 3, 5, 8}) {
    SCOPED_TRACE("world " + std::to_string(world));
    run_world(world, "auto", 60000, [&](gw_comm_t c, int rank, int w, RankErrors& e) {
      int round = 0;
      for (gw_dtype_t d : kAllDtypes) {
        const int root = (round++) % w;
        Round rd(d, 13, w, rank, root);
        std::vector<gw_request_t> q = rd.start(c, e);
        // Waited for in reverse order, some by polling.
        for (size_t i = q.size(); i-- > 0;) {
          if (q[i] == nullptr) continue;
          if (i % 2) {
            GW_CHECK_RANK(rank, e, gw_wait(q[i], -1));
          } else {
            int done = 0;
            gw_status_t s = GW_OK;
            while (s == GW_OK && !done) s = gw_test(q[i], &done);
            if (s != GW_OK) e.add(rank, "gw_test: " + last_error());
          }
        }
        const std::string bad = rd.check();
        if (!bad.empty()) e.add(rank, bad);
      }
    });
  }
}

// One thread per rank issues collectives (blocking and not) while two others exchange
// point-to-point messages round the ring.
TEST(NonblockingCollectivesTest, InterleavedWithPointToPointFromSeveralThreads) {
  run_world(4, "auto", 60000, [&](gw_comm_t c, int rank, int w, RankErrors& e) {
    std::thread p2p([&] {
      for (int k = 0; k < 40; ++k) {
        int32_t out = rank * 1000 + k, in = -1;
        gw_request_t s = nullptr;
        GW_CHECK_RANK(rank, e, gw_isend(c, &out, 1, GW_INT32, (rank + 1) % w, 5, &s));
        GW_CHECK_RANK(rank, e, gw_recv(c, &in, 1, GW_INT32, (rank + w - 1) % w, 5));
        if (s) GW_CHECK_RANK(rank, e, gw_wait(s, -1));
        if (in != ((rank + w - 1) % w) * 1000 + k) e.add(rank, "p2p: wrong message");
      }
    });
    for (int k = 0; k < 6; ++k) {
      Round rd(GW_FLOAT32, 100 + k, w, rank, k % w);
      std::vector<gw_request_t> q = rd.start(c, e);
      int32_t x = rank;
      GW_CHECK_RANK(rank, e, gw_allreduce(c, &x, &x, 1, GW_INT32, GW_SUM));  // waits for them
      if (x != w * (w - 1) / 2) e.add(rank, "blocking allreduce after i-forms");
      for (gw_request_t r : q) {
        if (r) GW_CHECK_RANK(rank, e, gw_wait(r, -1));
      }
      const std::string bad = rd.check();
      if (!bad.empty()) e.add(rank, bad);
    }
    p2p.join();
  });
}

// A rank whose peers never join (they stay alive until it is done): abort and destroy end its
// pending requests of every kind with GW_ERR_ABORTED.
TEST(NonblockingCollectivesTest, DestroyAndAbortEndPendingRequests) {
  for (bool destroy : {false, true}) {
    SCOPED_TRACE(destroy ? "destroy" : "abort");
    std::atomic<bool> done{false};
    run_world(
        3, "auto", 60000,
        [&](gw_comm_t c, int rank, int, RankErrors& e) {
          if (rank != 0) {
            while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
            gw_comm_destroy(c);
            return;
          }
          int32_t a[8] = {}, b[24] = {};
          size_t counts[3] = {1, 1, 1}, displs[3] = {0, 1, 2};
          std::vector<gw_request_t> q(6, nullptr);
          GW_CHECK_RANK(rank, e, gw_ibarrier(c, &q[0]));
          GW_CHECK_RANK(rank, e, gw_ireduce(c, a, b, 8, GW_INT32, GW_SUM, 0, &q[1]));
          GW_CHECK_RANK(rank, e, gw_igather(c, a, b, 8, GW_INT32, 0, &q[2]));
          GW_CHECK_RANK(rank, e, gw_ibroadcast(c, a, 8, GW_INT32, 1, &q[3]));
          GW_CHECK_RANK(rank, e,
                        gw_ialltoallv(c, a, counts, displs, b, counts, displs, GW_INT32, &q[4]));
          GW_CHECK_RANK(rank, e, gw_iallreduce(c, a, b, 8, GW_INT32, GW_SUM, &q[5]));
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          if (destroy) {
            GW_CHECK_RANK(rank, e, gw_comm_destroy(c));
          } else {
            GW_CHECK_RANK(rank, e, gw_comm_abort(c));
          }
          for (size_t i = 0; i < q.size(); ++i) {
            int fin = 0;
            gw_status_t s = GW_OK;
            if (i % 2) {
              s = gw_wait(q[i], -1);
            } else {
              while (s == GW_OK && !fin) s = gw_test(q[i], &fin);
            }
            if (s != GW_ERR_ABORTED) {
              e.add(rank, "request " + std::to_string(i) + ": status " + std::to_string(s) + ": " +
                              last_error());
            }
          }
          if (!destroy) GW_CHECK_RANK(rank, e, gw_comm_destroy(c));
          done.store(true);
        },
        true);
  }
}

TEST(NonblockingCollectivesTest, BadArgumentsMakeNoRequest) {
  run_world(2, "auto", 60000, [](gw_comm_t c, int rank, int, RankErrors& e) {
    if (rank == 1) return;
    int32_t x[8] = {};
    size_t one[2] = {1, 1}, d[2] = {0, 0};
    gw_request_t q = nullptr;
    auto expect = [&](gw_status_t s, const char* what, const char* word) {
      if (s != GW_ERR_INVALID_ARG || last_error().find(word) == std::string::npos || q != nullptr) {
        e.add(rank, std::string(what) + ": status " + std::to_string(s) + ": " + last_error());
      }
    };
    expect(gw_ibroadcast(c, x, 1, GW_INT32, 3, &q), "ibroadcast root", "root");
    expect(gw_ibroadcast(c, x, 1, GW_INT32, 0, nullptr), "ibroadcast NULL request", "request");
    expect(gw_ibarrier(c, nullptr), "ibarrier NULL request", "request");
    expect(gw_iallgather(c, x, nullptr, 1, GW_INT32, &q), "iallgather NULL recvbuf", "recvbuf");
    expect(gw_ireduce_scatter(c, x, x, 1, GW_INT32, static_cast<gw_op_t>(11), &q),
           "ireduce_scatter op", "op");
    expect(gw_ialltoall(c, x, x + 1, 2, GW_INT32, &q), "ialltoall overlap", "overlap");
    expect(gw_ialltoallv(c, x, one, d, x + 4, one, d, GW_INT32, &q), "ialltoallv overlap",
           "overlap");
    expect(gw_ireduce(c, x, x, 1, GW_INT32, GW_SUM, -1, &q), "ireduce root", "root");
    expect(gw_igather(c, x, nullptr, 1, GW_INT32, 0, &q), "igather NULL recvbuf", "recvbuf");
    expect(gw_iscatter(c, nullptr, x, 1, GW_INT32, 0, &q), "iscatter NULL sendbuf", "sendbuf");
  });
}

}  // namespace
