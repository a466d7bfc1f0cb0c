// Tensor fusion of small gw_iallreduce calls (capi/fusion_queue.h) through the C ABI, ranks as
// threads: ranks that submit at different speeds and wait in different orders still cut the same
// batches (results exact, no hang); mixed dtypes and ops, a large call and a blocking collective
// between small ones keep their order; gw_test polling alone makes progress; destroy and a dead
// peer fail every queued call; the timeline shows the fused allreduces and their members.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <latch>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/gradwire.h"
#include "tests/support/capi_ranks.h"
#include "tests/support/sanitizers.h"
#include "tests/support/test_env.h"

namespace gw::testing {
namespace {

constexpr int kWorld = 4;

// One small call of a step: its kind decides dtype, op and the values (exact in every dtype).
struct Call {
  int kind;  // 0: f32 sum, 1: i64 max, 2: i32 min, 3: f64 sum, large (not fused)
  size_t count;
  std::vector<uint8_t> buf;
  gw_request_t req = nullptr;
};

size_t elem(int kind) { return kind == 0 ? 4 : kind == 1 ? 8 : kind == 2 ? 4 : 8; }

double value(int kind, int rank, size_t call, size_t j) {
  switch (kind) {
    case 0:
      return static_cast<double>((rank + 1) * static_cast<int>(call % 7 + 1) +
                                 static_cast<int>(j % 5));
    case 1:
    case 2:
      return static_cast<double>(rank * 1000 + static_cast<int>(call) + static_cast<int>(j % 11));
    default:
      return static_cast<double>(rank + 2 * static_cast<int>(j % 13));
  }
}

double expected(int kind, size_t call, size_t j) {
  double s = 0;
  switch (kind) {
    case 0:
    case 3:
      for (int r = 0; r < kWorld; ++r) s += value(kind, r, call, j);
      return s;
    case 1:
      return value(kind, kWorld - 1, call, j);
    default:
      return value(kind, 0, call, j);
  }
}

void fill(Call& c, int rank, size_t idx) {
  c.buf.resize(c.count * elem(c.kind));
  for (size_t j = 0; j < c.count; ++j) {
    const double v = value(c.kind, rank, idx, j);
    if (c.kind == 0) reinterpret_cast<float*>(c.buf.data())[j] = static_cast<float>(v);
    if (c.kind == 1) reinterpret_cast<int64_t*>(c.buf.data())[j] = static_cast<int64_t>(v);
    if (c.kind == 2) reinterpret_cast<int32_t*>(c.buf.data())[j] = static_cast<int32_t>(v);
    if (c.kind == 3) reinterpret_cast<double*>(c.buf.data())[j] = v;
  }
}

gw_status_t submit(gw_comm_t comm, Call& c) {
  static const gw_dtype_t dt[] = {GW_FLOAT32, GW_INT64, GW_INT32, GW_FLOAT64};
  static const gw_op_t op[] = {GW_SUM, GW_MAX, GW_MIN, GW_SUM};
  return gw_iallreduce(comm, c.buf.data(), c.buf.data(), c.count, dt[c.kind], op[c.kind], &c.req);
}

// The first element that differs from the expected sum, or -1.
long first_wrong(const Call& c, size_t idx) {
  for (size_t j = 0; j < c.count; ++j) {
    double got = 0;
    if (c.kind == 0) got = reinterpret_cast<const float*>(c.buf.data())[j];
    if (c.kind == 1) got = static_cast<double>(reinterpret_cast<const int64_t*>(c.buf.data())[j]);
    if (c.kind == 2) got = reinterpret_cast<const int32_t*>(c.buf.data())[j];
    if (c.kind == 3) got = reinterpret_cast<const double*>(c.buf.data())[j];
    if (got != expected(c.kind, idx, j)) return static_cast<long>(j);
  }
  return -1;
}

// The calls of one step, the same on every rank: runs of one kind (several batches), small sizes,
// and a 2 MiB f64 call (kind 3, not fused) in the middle.
std::vector<Call> step_calls(int n) {
  std::vector<Call> calls(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    Call& c = calls[static_cast<size_t>(i)];
    c.kind = (i / 17) % 3;
    c.count = 1 + static_cast<size_t>((i * 37) % 900);
    if (i == n / 2) {
      c.kind = 3;
      c.count = (2u << 20) / 8;
    }
  }
  return calls;
}

class FusionTest : public ::testing::TestWithParam<const char*> {
 protected:
  CleanEnv env_;
};

// Ranks submit with their own jitter, one blocking allreduce among the calls, then wait in four
// different orders (forward, backward, shuffled, gw_test polling): every result exact.
TEST_P(FusionTest, JitteredRanksCutTheSameBatches) {
  ScopedEnv cycle("GW_CYCLE_TIME_MS", "1");
  auto comms = init_ranks(kWorld, "fusion-jitter", GetParam(), 30000);
  on_each_rank(comms, [&](int rank, gw_comm_t comm) {
    if (comm == nullptr) return;
    std::mt19937 rng(static_cast<unsigned>(rank * 7919 + 1));
    for (int step = 0; step < 3; ++step) {
      std::vector<Call> calls = step_calls(120);
      for (size_t i = 0; i < calls.size(); ++i) {
        fill(calls[i], rank, i);
        ASSERT_EQ(submit(comm, calls[i]), GW_OK) << gw_last_error();
        // Each rank its own pace: some sleep often, some never.
        if (rng() % (rank + 2) == 0) {
          std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
        }
        if (i == 80) {  // a blocking collective among the queued ones keeps its place
          int32_t x = rank + 1;
          ASSERT_EQ(gw_allreduce(comm, &x, &x, 1, GW_INT32, GW_SUM), GW_OK) << gw_last_error();
          EXPECT_EQ(x, kWorld * (kWorld + 1) / 2);
        }
      }
      std::vector<size_t> order(calls.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      if (rank == 1) std::reverse(order.begin(), order.end());
      if (rank == 2) std::shuffle(order.begin(), order.end(), rng);
      if (rank == 3) {  // polls them all with gw_test until every one is done
        size_t left = calls.size();
        const int64_t until = now_ms() + 30000;
        while (left > 0 && now_ms() < until) {
          for (Call& c : calls) {
            if (c.req == nullptr) continue;
            int done = 0;
            ASSERT_EQ(gw_test(c.req, &done), GW_OK) << gw_last_error();
            if (done) {
              c.req = nullptr;
              --left;
            }
          }
        }
        ASSERT_EQ(left, 0u) << "gw_test polling never completed them all";
      } else {
        for (size_t i : order) {
          ASSERT_EQ(gw_wait(calls[i].req, -1), GW_OK) << "call " << i << ": " << gw_last_error();
        }
      }
      for (size_t i = 0; i < calls.size(); ++i) {
        EXPECT_EQ(first_wrong(calls[i], i), -1)
            << "rank " << rank << " step " << step << " call " << i << " kind " << calls[i].kind;
      }
    }
  });
  for (gw_comm_t c : comms) EXPECT_EQ(gw_comm_destroy(c), GW_OK) << gw_last_error();
}

// With a cycle time no test reaches, only the waits and tests start rounds: gw_test polling alone
// completes a queued call, and a wait on the last call fuses those before it too.
TEST_P(FusionTest, WaitsAndTestsStartRoundsWithoutTheCycle) {
  ScopedEnv cycle("GW_CYCLE_TIME_MS", "600000");
  auto comms = init_ranks(2, "fusion-poll", GetParam(), 30000);
  on_each_rank(comms, [&](int rank, gw_comm_t comm) {
    if (comm == nullptr) return;
    std::vector<float> a(64, static_cast<float>(rank + 1));
    gw_request_t r = nullptr;
    ASSERT_EQ(gw_iallreduce(comm, a.data(), a.data(), a.size(), GW_FLOAT32, GW_SUM, &r), GW_OK);
    int done = 0;
    const int64_t until = now_ms() + 20000;
    while (!done && now_ms() < until) ASSERT_EQ(gw_test(r, &done), GW_OK) << gw_last_error();
    ASSERT_TRUE(done);
    EXPECT_EQ(a[63], 3.0f);
    std::vector<std::vector<int32_t>> bufs(10, std::vector<int32_t>(16, rank));
    std::vector<gw_request_t> reqs(bufs.size());
    for (size_t i = 0; i < bufs.size(); ++i) {
      ASSERT_EQ(gw_iallreduce(comm, bufs[i].data(), bufs[i].data(), 16, GW_INT32, GW_MAX, &reqs[i]),
                GW_OK);
    }
    for (size_t i = bufs.size(); i-- > 0;)
      ASSERT_EQ(gw_wait(reqs[i], -1), GW_OK) << gw_last_error();
    for (auto& b : bufs) EXPECT_EQ(b[0], 1);
  });
  for (gw_comm_t c : comms) EXPECT_EQ(gw_comm_destroy(c), GW_OK) << gw_last_error();
}

// Destroying a communicator with calls still queued fails each of them, saying why.
TEST_P(FusionTest, DestroyFailsQueuedCalls) {
  ScopedEnv cycle("GW_CYCLE_TIME_MS", "600000");
  auto comms = init_ranks(2, "fusion-destroy", GetParam(), 30000);
  on_each_rank(comms, [&](int rank, gw_comm_t comm) {
    if (comm == nullptr) return;
    std::vector<std::vector<float>> bufs(5, std::vector<float>(32, 1.0f));
    std::vector<gw_request_t> reqs(bufs.size());
    for (size_t i = 0; i < bufs.size(); ++i) {
      ASSERT_EQ(
          gw_iallreduce(comm, bufs[i].data(), bufs[i].data(), 32, GW_FLOAT32, GW_SUM, &reqs[i]),
          GW_OK);
    }
    EXPECT_EQ(gw_comm_destroy(comm), GW_OK) << gw_last_error();
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(gw_wait(reqs[i], 5000), GW_ERR_ABORTED) << "rank " << rank << " call " << i;
      EXPECT_NE(std::string(gw_last_error()).find("fusion"), std::string::npos) << gw_last_error();
      EXPECT_EQ(bufs[i][0], 1.0f);  // untouched
    }
  });
}

// A peer that is gone: every call queued on the other rank fails within the deadline.
TEST_P(FusionTest, DeadPeerFailsEveryQueuedCall) {
  auto comms = init_ranks(2, "fusion-dead", GetParam(), 3000);
  ASSERT_NE(comms[1], nullptr);
  on_each_rank(comms, [&](int, gw_comm_t comm) {  // connected first: the peer dies mid-job
    int32_t x = 1;
    if (comm != nullptr) {
      EXPECT_EQ(gw_allreduce(comm, &x, &x, 1, GW_INT32, GW_SUM), GW_OK);
    }
  });
  ASSERT_EQ(gw_comm_destroy(comms[1]), GW_OK) << gw_last_error();  // rank 1 dies
  if (comms[0] == nullptr) return;
  std::vector<std::vector<float>> bufs(8, std::vector<float>(32, 1.0f));
  std::vector<gw_request_t> reqs(bufs.size());
  const int64_t t0 = now_ms();
  for (size_t i = 0; i < bufs.size(); ++i) {
    const gw_status_t s =
        gw_iallreduce(comms[0], bufs[i].data(), bufs[i].data(), 32, GW_FLOAT32, GW_SUM, &reqs[i]);
    if (s != GW_OK) reqs[i] = nullptr;  // refused at once: also a failure
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (reqs[i] != nullptr) {
      EXPECT_NE(gw_wait(reqs[i], -1), GW_OK) << "call " << i;
    }
  }
  const int64_t took = now_ms() - t0;
  // A sanitizer's slowdown says nothing of the deadline: there the time is a figure only.
  if (!kSanitizer) {
    EXPECT_LT(took, 3000 + 20000) << "the queued calls failed only after " << took << " ms";
  }
  std::printf("[ figure ] dead peer: %zu queued calls failed after %lld ms (deadline 3000 ms)\n",
              reqs.size(), static_cast<long long>(took));
  EXPECT_EQ(gw_comm_destroy(comms[0]), GW_OK) << gw_last_error();
}

INSTANTIATE_TEST_SUITE_P(Transports, FusionTest, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return std::string(info.param); });

// The timeline shows a fused allreduce as one event with its member count and bytes, and one
// event per member with its wait. The timeline is written at exit, so a child process runs the
// two ranks (as threads) and the parent reads its file.
int timeline_child() {
  std::vector<gw_status_t> worst(2, GW_OK);
  std::latch queued(2);
  auto comms = init_ranks(2, "fusion-timeline", "tcp", 30000);
  if (comms[0] == nullptr || comms[1] == nullptr) return 2;
  on_each_rank(comms, [&](int rank, gw_comm_t comm) {
    std::vector<std::vector<float>> bufs(20, std::vector<float>(256, 1.0f));
    std::vector<gw_request_t> reqs(bufs.size());
    for (size_t i = 0; i < bufs.size(); ++i) {
      gw_status_t s =
          gw_iallreduce(comm, bufs[i].data(), bufs[i].data(), 256, GW_FLOAT32, GW_SUM, &reqs[i]);
      if (s != GW_OK) worst[rank] = s;
    }
    // Every rank has all 20 queued before either waits: the first round fuses them all.
    queued.arrive_and_wait();
    for (auto* r : reqs) {
      if (gw_wait(r, -1) != GW_OK) worst[rank] = GW_ERR_INTERNAL;
    }
    for (auto& b : bufs) {
      if (b[0] != 2.0f) worst[rank] = GW_ERR_INTERNAL;
    }
  });
  for (gw_comm_t c : comms) gw_comm_destroy(c);
  return worst[0] != GW_OK || worst[1] != GW_OK ? 3 : 0;
}

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

TEST(FusionTimelineTest, FusedAllreduceAndMembersInTheTrace) {
  CleanEnv env;
  const std::string pattern =
      ::testing::TempDir() + "fusion_timeline_" + std::to_string(::getpid()) + "_%r.json";
  ScopedEnv tl("GW_TIMELINE", pattern.c_str());
  ScopedEnv cycle("GW_CYCLE_TIME_MS", "600000");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) std::exit(timeline_child());  // exit() closes the timeline
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "the child's ranks failed";
  // The file carries the rank of the first communicator the child made: either thread's.
  std::string trace;
  for (const char* r : {"0", "1"}) {
    const std::string path =
        ::testing::TempDir() + "fusion_timeline_" + std::to_string(::getpid()) + "_" + r + ".json";
    std::ifstream f(path);
    if (!f.good()) continue;
    std::stringstream ss;
    ss << f.rdbuf();
    trace += ss.str();
    std::remove(path.c_str());
  }
  ASSERT_FALSE(trace.empty()) << "no timeline from " << pattern;
  // Both ranks write into the first communicator's file (one process): two fused events of 20.
  EXPECT_EQ(occurrences(trace, "\"name\":\"fused_allreduce\""), 2u) << trace.substr(0, 4000);
  EXPECT_EQ(occurrences(trace, "\"tensors\":20,\"bytes\":20480"), 2u);
  EXPECT_EQ(occurrences(trace, "\"name\":\"fusion_member\""), 40u);
  EXPECT_EQ(occurrences(trace, "\"waited_for_batch_us\":"), 40u);
  EXPECT_EQ(occurrences(trace, "\"name\":\"fusion_negotiate\""), 2u);
}

}  // namespace
}  // namespace gw::testing
