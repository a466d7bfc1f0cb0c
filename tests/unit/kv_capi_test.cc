// The parameter server through the C ABI (gw_kv_*), ranks as threads with co-located servers
// (GW_KV_SERVERS=0), and again in daemon mode against a gradwired of the test's own: every mode's
// rule with a worker held back by the test, the update rules' exact values, values spread over
// every server's partitions, and bad input refused, never applied.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/gradwire.h"
#include "tests/support/capi_ranks.h"
#include "tests/support/local_daemon.h"
#include "tests/support/test_env.h"

namespace {

using gw::testing::run_capi_ranks;
using gw::testing::thread_rank_config;

constexpr int kTimeoutMs = 20000;

// Runs body(rank, kv) on `world` threads, each with its communicator and store of `cfg`.
void with_store(int world, const gw_kv_config_t& cfg,
                const std::function<void(int rank, gw_kv_t kv)>& body) {
  ASSERT_EQ(gw_config_set("GW_TIMEOUT_MS", "20000"), GW_OK);
  run_capi_ranks(world, [&](int r, const std::string& addr) {
    gw_config_t c = thread_rank_config(r, world, addr, "kv-test", kTimeoutMs);
    c.transport = "tcp";
    gw_comm_t comm = nullptr;
    ASSERT_EQ(gw_comm_init(&comm, &c), GW_OK) << gw_last_error();
    gw_kv_t kv = nullptr;
    ASSERT_EQ(gw_kv_create(comm, &cfg, &kv), GW_OK) << gw_last_error();
    body(r, kv);
    EXPECT_EQ(gw_kv_destroy(kv), GW_OK) << gw_last_error();
    EXPECT_EQ(gw_comm_destroy(comm), GW_OK);
  });
}

// world workers push_pull 3 clocks: each pull is the clock's sum, exactly.
void bsp_pushpull_case(int world) {
  gw_kv_config_t cfg = GW_KV_CONFIG_INIT;
  cfg.partition_bytes = 64;  // 16 floats: 100 floats are 7 partitions over the servers
  constexpr size_t n = 100;
  with_store(world, cfg, [&](int r, gw_kv_t kv) {
    std::vector<float> zero(n, 0.f);
    ASSERT_EQ(gw_kv_init(kv, 42, zero.data(), n, GW_FLOAT32), GW_OK) << gw_last_error();
    for (int step = 0; step < 3; ++step) {
      std::vector<float> v(n), out(n, -1.f);
      for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((r + 1) * (step + 1) + i);
      ASSERT_EQ(gw_kv_pushpull(kv, 42, v.data(), out.data(), n, GW_FLOAT32, 0), GW_OK)
          << gw_last_error();
      for (size_t i = 0; i < n; ++i) {
        // The clock's sum: (1+..+world)(step+1) + world i.
        ASSERT_EQ(out[i], static_cast<float>(world * (world + 1) / 2 * (step + 1) + world * i))
            << "step " << step << " i " << i;
      }
      ASSERT_EQ(gw_kv_clock(kv), GW_OK) << gw_last_error();
    }
    gw_kv_stats_t st{sizeof(gw_kv_stats_t), 0, 0, 0, 0};
    ASSERT_EQ(gw_kv_stats(kv, &st), GW_OK);
    EXPECT_EQ(st.clock, 3u);
    EXPECT_EQ(st.dropped_pushes, 0u);
  });
}

void bsp_held_back_case() {
  gw_kv_config_t cfg = GW_KV_CONFIG_INIT;
  std::barrier sync(2);
  std::atomic<bool> released{false};
  with_store(2, cfg, [&](int r, gw_kv_t kv) {
    double init = 0;
    ASSERT_EQ(gw_kv_init(kv, 1, &init, 1, GW_FLOAT64), GW_OK);
    sync.arrive_and_wait();
    double g = r + 1.0, out = -1;
    if (r == 0) {
      gw_request_t req = nullptr;
      ASSERT_EQ(gw_kv_ipushpull(kv, 1, &g, &out, 1, GW_FLOAT64, 0, &req), GW_OK);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      int done = 1;
      ASSERT_EQ(gw_test(req, &done), GW_OK);
      EXPECT_EQ(done, 0) << "bsp answered before worker 1 pushed";
      released = true;
      sync.arrive_and_wait();
      ASSERT_EQ(gw_wait(req, -1), GW_OK) << gw_last_error();
      EXPECT_EQ(out, 3.0);
    } else {
      sync.arrive_and_wait();  // held back until worker 0 checked its pull is waiting
      ASSERT_TRUE(released);
      ASSERT_EQ(gw_kv_pushpull(kv, 1, &g, &out, 1, GW_FLOAT64, 0), GW_OK) << gw_last_error();
      EXPECT_EQ(out, 3.0);
    }
  });
}

void ssp_case() {
  gw_kv_config_t cfg = GW_KV_CONFIG_INIT;
  cfg.mode = GW_KV_SSP;
  cfg.staleness = 1;
  std::barrier sync(2);
  with_store(2, cfg, [&](int r, gw_kv_t kv) {
    float init = 0;
    ASSERT_EQ(gw_kv_init(kv, 5, &init, 1, GW_FLOAT32), GW_OK);
    sync.arrive_and_wait();
    if (r == 0) {
      float one = 1, out = -1;
      // Clock 0 and 1: within the staleness of worker 1 (held at clock 0): no wait.
      for (int c = 0; c < 2; ++c) {
        ASSERT_EQ(gw_kv_push(kv, 5, &one, 1, GW_FLOAT32, 0), GW_OK);
        ASSERT_EQ(gw_kv_pull(kv, 5, &out, 1, GW_FLOAT32, 0), GW_OK) << gw_last_error();
        EXPECT_EQ(out, static_cast<float>(c + 1));
        ASSERT_EQ(gw_kv_clock(kv), GW_OK);
      }
      // Clock 2 needs worker 1 to have finished clock 0.
      gw_request_t req = nullptr;
      ASSERT_EQ(gw_kv_ipull(kv, 5, &out, 1, GW_FLOAT32, 0, &req), GW_OK);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      int done = 1;
      ASSERT_EQ(gw_test(req, &done), GW_OK);
      EXPECT_EQ(done, 0) << "ssp:1 answered a pull at clock 2 with a worker at clock 0";
      sync.arrive_and_wait();
      ASSERT_EQ(gw_wait(req, -1), GW_OK) << gw_last_error();
      EXPECT_EQ(out, 12.f);  // its two pushes and worker 1's push of clock 0
    } else {
      sync.arrive_and_wait();
      float ten = 10;
      ASSERT_EQ(gw_kv_push(kv, 5, &ten, 1, GW_FLOAT32, 0), GW_OK);
      ASSERT_EQ(gw_kv_clock(kv), GW_OK);
    }
  });
}

void asp_sync_case() {
  gw_kv_config_t asp = GW_KV_CONFIG_INIT;
  asp.mode = GW_KV_ASP;
  with_store(2, asp, [&](int r, gw_kv_t kv) {
    int32_t init = 0, out = -1;
    ASSERT_EQ(gw_kv_init(kv, 3, &init, 1, GW_INT32), GW_OK);
    if (r == 0) {
      for (int c = 0; c < 5; ++c) ASSERT_EQ(gw_kv_clock(kv), GW_OK);
      // Worker 1 may be anywhere: the pull answers at once with whatever was applied.
      ASSERT_EQ(gw_kv_pull(kv, 3, &out, 1, GW_INT32, 0), GW_OK) << gw_last_error();
      EXPECT_TRUE(out == 0 || out == 7) << out;
    } else {
      int32_t seven = 7;
      ASSERT_EQ(gw_kv_push(kv, 3, &seven, 1, GW_INT32, 0), GW_OK);
    }
  });

  gw_kv_config_t sync_cfg = GW_KV_CONFIG_INIT;
  sync_cfg.mode = GW_KV_SYNC;
  sync_cfg.sync_k = 2;
  std::barrier sync(3);
  with_store(3, sync_cfg, [&](int r, gw_kv_t kv) {
    float init = 0, out = -1;
    ASSERT_EQ(gw_kv_init(kv, 9, &init, 1, GW_FLOAT32), GW_OK);
    sync.arrive_and_wait();
    float g = static_cast<float>(r + 1);
    if (r < 2) {
      ASSERT_EQ(gw_kv_pushpull(kv, 9, &g, &out, 1, GW_FLOAT32, 0), GW_OK) << gw_last_error();
      EXPECT_EQ(out, 3.f);  // workers 0 and 1 closed clock 0
      ASSERT_EQ(gw_kv_clock(kv), GW_OK);
      sync.arrive_and_wait();
      sync.arrive_and_wait();
    } else {
      sync.arrive_and_wait();  // held back until clock 0 closed without it
      ASSERT_EQ(gw_kv_pushpull(kv, 9, &g, &out, 1, GW_FLOAT32, 0), GW_OK) << gw_last_error();
      EXPECT_EQ(out, 3.f);  // its push was dropped
      gw_kv_stats_t st{sizeof(gw_kv_stats_t), 0, 0, 0, 0};
      ASSERT_EQ(gw_kv_stats(kv, &st), GW_OK);
      EXPECT_EQ(st.dropped_pushes, 1u);
      ASSERT_EQ(gw_kv_clock(kv), GW_OK);
      ASSERT_EQ(gw_kv_stats(kv, &st), GW_OK);
      EXPECT_EQ(st.clock, 1u);
      sync.arrive_and_wait();
    }
  });
}

void sgd_case() {
  gw_kv_config_t cfg = GW_KV_CONFIG_INIT;
  cfg.update = GW_KV_UPDATE_SGD;
  cfg.lr = 0.5;
  cfg.momentum = 0.5;
  with_store(2, cfg, [&](int r, gw_kv_t kv) {
    double w[2] = {10, -10};
    ASSERT_EQ(gw_kv_init(kv, 77, w, 2, GW_FLOAT64), GW_OK);
    // Clock 0: grads {2,6} and {6,2}: mean {4,4}; v = 4; w -= 2 -> {8, -12}.
    double g0[2] = {r == 0 ? 2.0 : 6.0, r == 0 ? 6.0 : 2.0};
    double out[2];
    ASSERT_EQ(gw_kv_pushpull(kv, 77, g0, out, 2, GW_FLOAT64, 0), GW_OK) << gw_last_error();
    EXPECT_EQ(out[0], 8.0);
    EXPECT_EQ(out[1], -12.0);
    ASSERT_EQ(gw_kv_clock(kv), GW_OK);
    // Clock 1: mean {4,4}; v = 0.5*4 + 4 = 6; w -= 3 -> {5, -15}.
    double g1[2] = {4, 4};
    ASSERT_EQ(gw_kv_pushpull(kv, 77, g1, out, 2, GW_FLOAT64, 0), GW_OK) << gw_last_error();
    EXPECT_EQ(out[0], 5.0);
    EXPECT_EQ(out[1], -15.0);
  });
}

void bad_input_case() {
  gw_kv_config_t cfg = GW_KV_CONFIG_INIT;
  cfg.mode = GW_KV_ASP;
  with_store(1, cfg, [&](int, gw_kv_t kv) {
    float v[4] = {1, 2, 3, 4}, out[4] = {};
    ASSERT_EQ(gw_kv_init(kv, 1, v, 4, GW_FLOAT32), GW_OK);
    auto refused = [&](gw_status_t s, const char* text) {
      EXPECT_EQ(s, GW_ERR_INVALID_ARG) << text;
      EXPECT_NE(std::string(gw_last_error()).find(text), std::string::npos) << gw_last_error();
    };
    refused(gw_kv_push(nullptr, 1, v, 4, GW_FLOAT32, 0), "kv is NULL");
    refused(gw_kv_push(kv, 1, nullptr, 4, GW_FLOAT32, 0), "value");
    refused(gw_kv_push(kv, 1, v, 4, static_cast<gw_dtype_t>(99), 0), "dtype");
    refused(gw_kv_push(kv, 2, v, 4, GW_FLOAT32, 0), "key 2 is unknown");
    refused(gw_kv_push(kv, 1, v, 3, GW_FLOAT32, 0), "holds 4 elements");
    refused(gw_kv_push(kv, 1, v, 4, GW_INT32, 0), "holds 4 elements of float32");
    refused(gw_kv_pull(kv, 1, out, 0, GW_FLOAT32, 0), "count is 0");
    refused(gw_kv_init(kv, 1, v, 2, GW_FLOAT32), "was initialised with 4");
    refused(gw_kv_pushpull(kv, 1, v, v + 1, 3, GW_FLOAT32, 0), "overlap");
    refused(gw_kv_ipush(kv, 1, v, 4, GW_FLOAT32, 0, nullptr), "req");
    refused(gw_kv_stats(kv, nullptr), "out is NULL");
    ASSERT_EQ(gw_kv_pull(kv, 1, out, 4, GW_FLOAT32, 0), GW_OK);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], v[i]);  // nothing refused was applied
  });
}

TEST(KvCapiTest, BspPushPullIsAnAllreduceOverPartitionsOnEveryServer) { bsp_pushpull_case(3); }
TEST(KvCapiTest, BspPullWaitsForAHeldBackWorker) { bsp_held_back_case(); }
TEST(KvCapiTest, SspPullWaitsOnlyBeyondTheStaleness) { ssp_case(); }
TEST(KvCapiTest, AspNeverWaitsAndSyncDropsTheStraggler) { asp_sync_case(); }
TEST(KvCapiTest, ServerSgdWithMomentumExact) { sgd_case(); }
// codec "fp16": two workers' pushes arrive as their fp16 rounding, summed exactly; an integer key
// is refused at init.
void fp16_case() {
  gw_kv_config_t cfg = GW_KV_CONFIG_INIT;
  cfg.partition_bytes = 64;
  cfg.codec = "fp16";
  constexpr size_t n = 100;
  with_store(2, cfg, [&](int r, gw_kv_t kv) {
    std::vector<float> zero(n, 0.f), v(n), out(n, -1.f);
    ASSERT_EQ(gw_kv_init(kv, 8, zero.data(), n, GW_FLOAT32), GW_OK) << gw_last_error();
    // Even i: i + 0.25 (exact in fp16); odd i: 1 + 2^-12, which fp16 rounds to 1.
    for (size_t i = 0; i < n; ++i) v[i] = i % 2 == 0 ? i + 0.25f : 1.0f + 1.0f / 4096;
    ASSERT_EQ(gw_kv_pushpull(kv, 8, v.data(), out.data(), n, GW_FLOAT32, 0), GW_OK)
        << gw_last_error();
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i], i % 2 == 0 ? 2 * (i + 0.25f) : 2.0f) << "rank " << r << " i " << i;
    }
    ASSERT_EQ(gw_kv_clock(kv), GW_OK) << gw_last_error();
    std::vector<int32_t> ints(4, 1);
    EXPECT_EQ(gw_kv_init(kv, 9, ints.data(), 4, GW_INT32), GW_ERR_INVALID_ARG);
    EXPECT_NE(std::string(gw_last_error()).find("floating values only"), std::string::npos)
        << gw_last_error();
  });
}

TEST(KvCapiTest, BadInputIsRefusedAndNeverApplied) { bad_input_case(); }
TEST(KvCapiTest, Fp16PushesArriveAsTheirRoundingSummed) { fp16_case(); }

TEST(KvCapiTest, BadConfigsAreRefused) {
  ASSERT_EQ(gw_config_set("GW_TIMEOUT_MS", "20000"), GW_OK);
  run_capi_ranks(1, [&](int r, const std::string& addr) {
    gw_config_t c = thread_rank_config(r, 1, addr, "kv-test", kTimeoutMs);
    gw_comm_t comm = nullptr;
    ASSERT_EQ(gw_comm_init(&comm, &c), GW_OK) << gw_last_error();
    gw_kv_t kv = nullptr;
    auto refused = [&](gw_kv_config_t cfg, gw_status_t want, const char* text) {
      EXPECT_EQ(gw_kv_create(comm, &cfg, &kv), want) << text;
      EXPECT_NE(std::string(gw_last_error()).find(text), std::string::npos) << gw_last_error();
      EXPECT_EQ(kv, nullptr);
    };
    gw_kv_config_t cfg = GW_KV_CONFIG_INIT;
    EXPECT_EQ(gw_kv_create(comm, nullptr, &kv), GW_ERR_INVALID_ARG);
    EXPECT_EQ(gw_kv_create(comm, &cfg, nullptr), GW_ERR_INVALID_ARG);
    gw_kv_config_t bad = cfg;
    bad.size = 0;
    refused(bad, GW_ERR_INVALID_ARG, "cfg.size is 0");
    bad = cfg;
    bad.mode = static_cast<gw_kv_mode_t>(7);
    refused(bad, GW_ERR_INVALID_ARG, "not a gw_kv_mode_t");
    bad = cfg;
    bad.mode = GW_KV_SYNC;
    bad.sync_k = 2;
    refused(bad, GW_ERR_INVALID_ARG, "sync_k 2");
    bad = cfg;
    bad.update = GW_KV_UPDATE_SGD;
    refused(bad, GW_ERR_INVALID_ARG, "lr");
    bad = cfg;
    bad.codec = "powersgd:4";
    refused(bad, GW_ERR_INVALID_ARG, "not a byte codec");
    bad = cfg;
    bad.codec = "zstd";
    refused(bad, GW_ERR_INVALID_ARG, "cfg.codec 'zstd'");
    bad = cfg;
    bad.partition_bytes = 8;
    refused(bad, GW_ERR_INVALID_ARG, "partition_bytes");
    EXPECT_EQ(gw_kv_destroy(nullptr), GW_ERR_INVALID_ARG);
    EXPECT_EQ(gw_comm_destroy(comm), GW_OK);
  });
}

TEST(KvCapiTest, PrioritiesAndNonBlockingFormsComplete) {
  gw_kv_config_t cfg = GW_KV_CONFIG_INIT;
  cfg.mode = GW_KV_ASP;
  with_store(2, cfg, [&](int r, gw_kv_t kv) {
    constexpr int kKeys = 8;
    std::vector<std::vector<float>> vals(kKeys, std::vector<float>(1000, 1.f));
    std::vector<std::vector<float>> outs(kKeys, std::vector<float>(1000, 0.f));
    for (int k = 0; k < kKeys; ++k) {
      ASSERT_EQ(gw_kv_init(kv, k, vals[k].data(), 1000, GW_FLOAT32), GW_OK);
    }
    std::vector<gw_request_t> reqs(kKeys);
    for (int k = 0; k < kKeys; ++k) {
      ASSERT_EQ(gw_kv_ipush(kv, k, vals[k].data(), 1000, GW_FLOAT32, k, &reqs[k]), GW_OK);
    }
    for (auto& q : reqs) ASSERT_EQ(gw_wait(q, -1), GW_OK) << gw_last_error();
    ASSERT_EQ(gw_kv_clock(kv), GW_OK);
    for (int k = 0; k < kKeys; ++k) {
      ASSERT_EQ(gw_kv_ipull(kv, k, outs[k].data(), 1000, GW_FLOAT32, -k, &reqs[k]), GW_OK);
    }
    for (auto& q : reqs) ASSERT_EQ(gw_wait(q, -1), GW_OK) << gw_last_error();
    for (int k = 0; k < kKeys; ++k) EXPECT_GE(outs[k][0], 2.f);  // init + its own push at least
  });
}

#ifdef GW_GRADWIRED_PATH
// Daemon mode (docs/parameter-server.md, "Daemon mode"): the ranks, threads of this process, are
// trainers of one gradwired of the test's own, whose job's kv server holds every key. The same
// rules as above, run against it.
class KvCapiDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.use()) << "could not make the daemon's directory"; }
  gw::testing::CleanEnv env_;
  gw::testing::LocalDaemon daemon_{GW_GRADWIRED_PATH, "gw-kv"};
};

TEST_F(KvCapiDaemonTest, BspPushPullIsAnAllreduceWithTwoAndThreeTrainers) {
  bsp_pushpull_case(2);
  bsp_pushpull_case(3);
}
TEST_F(KvCapiDaemonTest, BspPullWaitsForAHeldBackWorker) { bsp_held_back_case(); }
TEST_F(KvCapiDaemonTest, SspPullWaitsOnlyBeyondTheStaleness) { ssp_case(); }
TEST_F(KvCapiDaemonTest, AspNeverWaitsAndSyncDropsTheStraggler) { asp_sync_case(); }
TEST_F(KvCapiDaemonTest, ServerSgdWithMomentumExact) { sgd_case(); }
TEST_F(KvCapiDaemonTest, Fp16PushesArriveAsTheirRoundingSummed) { fp16_case(); }
// A world of one: no rendezvous store; its job's server is its own.
TEST_F(KvCapiDaemonTest, BadInputIsRefusedAndNeverApplied) { bad_input_case(); }

// GW_KV_SERVERS names server processes: in daemon mode the daemons serve, and the store says so.
TEST_F(KvCapiDaemonTest, ServerProcessesAreRefused) {
  gw::testing::ScopedEnv servers("GW_KV_SERVERS", "2");
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.rank = 0;
  cfg.world_size = 1;
  cfg.timeout_ms = kTimeoutMs;
  gw_comm_t c = nullptr;
  ASSERT_EQ(gw_comm_init(&c, &cfg), GW_OK) << gw_last_error();
  gw_kv_config_t kc = GW_KV_CONFIG_INIT;
  gw_kv_t kv = nullptr;
  EXPECT_EQ(gw_kv_create(c, &kc, &kv), GW_ERR_INVALID_ARG);
  EXPECT_NE(std::string(gw_last_error()).find("daemons are its kv servers"), std::string::npos)
      << gw_last_error();
  EXPECT_EQ(kv, nullptr);
  EXPECT_EQ(gw_comm_destroy(c), GW_OK) << gw_last_error();
}
#endif

}  // namespace
