// The C ABI through the real libgradwire.so: bad input of every kind, handle misuse (NULL,
// foreign, destroyed, aborted), a world of one doing every collective, and 2-4 ranks as threads
// rendezvousing over the TCP store.
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
#include "tests/support/free_port.h"
#include "tests/support/test_env.h"

namespace {

using gw::testing::CleanEnv;

std::string last() { return gw_last_error(); }

#define EXPECT_GW(code, call)                                   \
  do {                                                          \
    gw_status_t gw_s_ = (call);                                 \
    EXPECT_EQ(gw_s_, code) << #call << ": " << gw_last_error(); \
    if ((code) != GW_OK) {                                      \
      EXPECT_STRNE(gw_last_error(), "") << #call;               \
    }                                                           \
  } while (0)

TEST(CapiTest, VersionAndStatusStrings) {
  std::string v = gw_version();
  EXPECT_EQ(v, std::to_string(GW_VERSION_MAJOR) + "." + std::to_string(GW_VERSION_MINOR) + "." +
                   std::to_string(GW_VERSION_PATCH));
  const std::pair<gw_status_t, const char*> codes[] = {{GW_OK, "GW_OK"},
                                                       {GW_ERR_INVALID_ARG, "GW_ERR_INVALID_ARG"},
                                                       {GW_ERR_TIMEOUT, "GW_ERR_TIMEOUT"},
                                                       {GW_ERR_PEER, "GW_ERR_PEER"},
                                                       {GW_ERR_SYSTEM, "GW_ERR_SYSTEM"},
                                                       {GW_ERR_UNSUPPORTED, "GW_ERR_UNSUPPORTED"},
                                                       {GW_ERR_NO_MEMORY, "GW_ERR_NO_MEMORY"},
                                                       {GW_ERR_ABORTED, "GW_ERR_ABORTED"},
                                                       {GW_ERR_INTERNAL, "GW_ERR_INTERNAL"}};
  for (const auto& [code, name] : codes) {
    std::string s = gw_status_string(code);
    EXPECT_EQ(s.rfind(std::string(name) + ":", 0), 0u) << s;
  }
  ASSERT_NE(gw_status_string(static_cast<gw_status_t>(99)), nullptr);
  ASSERT_NE(gw_status_string(static_cast<gw_status_t>(-1)), nullptr);
}

TEST(CapiTest, LibraryExportsOnlyTheCApi) {
  void* lib = dlopen(GW_LIBGRADWIRE_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  for (const char* sym : {"gw_comm_init",
                          "gw_comm_init_from_env",
                          "gw_comm_destroy",
                          "gw_comm_abort",
                          "gw_comm_rank",
                          "gw_comm_size",
                          "gw_allreduce",
                          "gw_broadcast",
                          "gw_allgather",
                          "gw_reduce_scatter",
                          "gw_alltoall",
                          "gw_barrier",
                          "gw_iallreduce",
                          "gw_wait",
                          "gw_test",
                          "gw_status_string",
                          "gw_last_error",
                          "gw_version",
                          "gw_comm_split",
                          "gw_comm_describe",
                          "gw_allreduce_compressed",
                          "gw_comm_stats",
                          "gw_comm_reset_stats",
                          "gw_comm_release_compression",
                          "gw_mem_alloc",
                          "gw_mem_free"}) {
    EXPECT_NE(dlsym(lib, sym), nullptr) << sym;
  }
  // Internals stay hidden: gw::code_name(gw::Code), gw::config::table().
  EXPECT_EQ(dlsym(lib, "_ZN2gw9code_nameENS_4CodeE"), nullptr);
  EXPECT_EQ(dlsym(lib, "_ZN2gw6config5tableEv"), nullptr);
  dlclose(lib);
}

TEST(CapiTest, NullAndForeignHandles) {
  float x = 1;
  int v = 0;
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_allreduce(nullptr, &x, &x, 1, GW_FLOAT32, GW_SUM));
  EXPECT_NE(last().find("gw_allreduce"), std::string::npos) << last();
  EXPECT_NE(last().find("comm"), std::string::npos) << last();
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_rank(nullptr, &v));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_size(nullptr, &v));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_abort(nullptr));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_barrier(nullptr));
  gw_comm_t sub = reinterpret_cast<gw_comm_t>(0x1234);
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_split(nullptr, 0, 0, &sub));
  EXPECT_NE(last().find("gw_comm_split"), std::string::npos) << last();
  EXPECT_EQ(sub, reinterpret_cast<gw_comm_t>(0x1234));
  EXPECT_GW(GW_OK, gw_comm_destroy(nullptr));

  // Something that was never a communicator is detected, not dereferenced.
  alignas(64) static unsigned char junk[256];
  std::memset(junk, 0xAB, sizeof(junk));
  auto fake = reinterpret_cast<gw_comm_t>(junk);
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_allreduce(fake, &x, &x, 1, GW_FLOAT32, GW_SUM));
  EXPECT_NE(last().find("not a gradwire communicator"), std::string::npos) << last();
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_broadcast(fake, &x, 1, GW_FLOAT32, 0));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_destroy(fake));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_abort(fake));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_split(fake, 0, 0, &sub));

  auto fake_req = reinterpret_cast<gw_request_t>(junk);
  int done = 7;
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_wait(nullptr, 0));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_wait(fake_req, 0));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_test(fake_req, &done));
  EXPECT_EQ(done, 7);  // outputs untouched on failure
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_test(fake_req, nullptr));
}

TEST(CapiTest, InitRejectsBadConfiguration) {
  CleanEnv env;
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.world_size = 1;
  gw_comm_t sentinel = reinterpret_cast<gw_comm_t>(0x1234);
  gw_comm_t c = sentinel;
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_init(nullptr, &cfg));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_init(&c, nullptr));
  EXPECT_NE(last().find("config"), std::string::npos);
  cfg.rank = -1;
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_init(&c, &cfg));
  cfg.rank = 1;
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_init(&c, &cfg));  // rank == world_size
  EXPECT_NE(last().find("rank"), std::string::npos) << last();
  cfg.rank = 0;
  cfg.world_size = -2;
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_init(&c, &cfg));
  cfg.world_size = 1;
  cfg.timeout_ms = -5;
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_init(&c, &cfg));
  cfg.timeout_ms = 0;
  for (const char* bad : {"nonsense", "host:", "host:0", "host:99999", ":1", "[::1"}) {
    cfg.store_addr = bad;
    EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_init(&c, &cfg));
    EXPECT_NE(last().find("store_addr"), std::string::npos) << last();
  }
  cfg.store_addr = nullptr;
  cfg.world_size = 2;  // more than one rank needs a store address
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_init(&c, &cfg));
  EXPECT_NE(last().find("store"), std::string::npos) << last();
  cfg.world_size = 1;
  cfg.transport = "";
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_init(&c, &cfg));
  cfg.transport = nullptr;
  setenv("GW_TIMEOUT_MS", "soon", 1);  // malformed knobs are refused, not guessed
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_init(&c, &cfg));
  EXPECT_NE(last().find("GW_TIMEOUT_MS"), std::string::npos) << last();
  unsetenv("GW_TIMEOUT_MS");
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_init_from_env(&c));  // no launcher at all
  EXPECT_NE(last().find("GW_RANK"), std::string::npos) << last();
  setenv("GW_RANK", "3", 1);
  setenv("GW_WORLD_SIZE", "2", 1);
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_init_from_env(&c));
  EXPECT_NE(last().find("GW_RANK"), std::string::npos) << last();
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_init_from_env(nullptr));
  // A NULL config.transport means GW_TRANSPORT, for gw_comm_init_from_env too (it was ignored).
  setenv("GW_RANK", "0", 1);
  setenv("GW_WORLD_SIZE", "1", 1);
  setenv("GW_TRANSPORT", "carrier-pigeon", 1);
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_init_from_env(&c));
  EXPECT_NE(last().find("carrier-pigeon"), std::string::npos) << last();
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_init(&c, &cfg));
  EXPECT_NE(last().find("carrier-pigeon"), std::string::npos) << last();
  unsetenv("GW_TRANSPORT");
  unsetenv("GW_RANK");
  unsetenv("GW_WORLD_SIZE");
  EXPECT_EQ(c, sentinel);
}

// A communicator of one rank needs no store, so a half-set MASTER_ADDR/MASTER_PORT does not stop
// it (torch's distributed_test.py sets MASTER_ADDR alone and makes one-rank groups); two ranks
// still get the error.
// A communicator of world size 1 is made, sums one value and is destroyed.
void expect_one_rank_comm_works() {
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.world_size = 1;
  gw_comm_t c = nullptr;
  EXPECT_GW(GW_OK, gw_comm_init(&c, &cfg));
  ASSERT_NE(c, nullptr);
  float x = 2.5f;
  EXPECT_GW(GW_OK, gw_allreduce(c, &x, &x, 1, GW_FLOAT32, GW_SUM));
  EXPECT_EQ(x, 2.5f);
  EXPECT_GW(GW_OK, gw_comm_destroy(c));
}

TEST(CapiTest, OneRankIgnoresAHalfSetMasterAddress) {
  CleanEnv env;
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  expect_one_rank_comm_works();
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.world_size = 2;
  gw_comm_t c = nullptr;
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_init(&c, &cfg));
  EXPECT_NE(last().find("MASTER_PORT"), std::string::npos) << last();
  unsetenv("MASTER_ADDR");
}

// Under torchrun MASTER_PORT is torch's own TCPStore: a one-rank communicator (a one-rank
// group, dist.new_group([0])) must not try to host a store there, and does not need one.
TEST(CapiTest, OneRankUsesNoStoreFromTheEnvironment) {
  CleanEnv env;
  const int held = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(held, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(held, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(held, 4), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(getsockname(held, reinterpret_cast<sockaddr*>(&a), &len), 0);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(ntohs(a.sin_port)).c_str(), 1);
  expect_one_rank_comm_works();
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
  close(held);
}

// --- gw_config_t's size
// ----------------------------------------------------------------------------

TEST(CapiConfigTest, ConfigInitSetsSizeAndDefaults) {
  CleanEnv env;
  gw_config_t cfg = GW_CONFIG_INIT;
  EXPECT_EQ(cfg.size, sizeof(gw_config_t));
  EXPECT_EQ(cfg.rank, 0);
  EXPECT_EQ(cfg.world_size, 0);
  EXPECT_EQ(cfg.store_addr, nullptr);
  EXPECT_EQ(cfg.transport, nullptr);
  EXPECT_EQ(cfg.timeout_ms, 0);
  EXPECT_EQ(cfg.job_token, nullptr);
  cfg.world_size = 1;
  gw_comm_t c = nullptr;
  EXPECT_GW(GW_OK, gw_comm_init(&c, &cfg));
  int size = 0;
  EXPECT_GW(GW_OK, gw_comm_size(c, &size));
  EXPECT_EQ(size, 1);
  EXPECT_GW(GW_OK, gw_comm_destroy(c));
}

// A caller built against an older, shorter gw_config_t: the library reads only config.size bytes
// and gives every field beyond them its default. The bytes past the caller's size hold values
// that would fail (or differ) if they were read.
TEST(CapiConfigTest, OlderShorterConfigGetsDefaultsForMissingFields) {
  CleanEnv env;
  const size_t ends[] = {
      offsetof(gw_config_t, world_size) + sizeof(int),  // the least gw_comm_init needs
      offsetof(gw_config_t, store_addr) + 4,            // a field cut in half is not read either
      offsetof(gw_config_t, transport),
      offsetof(gw_config_t, timeout_ms),
      offsetof(gw_config_t, job_token),
  };
  for (size_t end : ends) {
    gw_config_t cfg = GW_CONFIG_INIT;
    cfg.rank = 0;
    cfg.world_size = 1;
    // Every field the caller's struct does not have holds something gw_comm_init would refuse.
    cfg.store_addr = "not-an-address";
    cfg.transport = "carrier-pigeon";
    cfg.timeout_ms = -5;
    cfg.job_token = "unread";
    if (end > offsetof(gw_config_t, store_addr)) cfg.store_addr = nullptr;
    if (end > offsetof(gw_config_t, transport)) cfg.transport = nullptr;
    if (end > offsetof(gw_config_t, timeout_ms)) cfg.timeout_ms = 20000;
    cfg.size = end;
    gw_comm_t c = nullptr;
    EXPECT_GW(GW_OK, gw_comm_init(&c, &cfg));
    ASSERT_NE(c, nullptr) << "size " << end;
    float x = 2;
    EXPECT_GW(GW_OK, gw_allreduce(c, &x, &x, 1, GW_FLOAT32, GW_SUM));
    EXPECT_GW(GW_OK, gw_comm_destroy(c));
  }
}

TEST(CapiConfigTest, BadSizesAreRefused) {
  CleanEnv env;
  gw_comm_t sentinel = reinterpret_cast<gw_comm_t>(0x1234);
  gw_comm_t c = sentinel;
  gw_config_t zero{};  // zero-initialised without GW_CONFIG_INIT: size 0
  zero.world_size = 1;
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_init(&c, &zero));
  EXPECT_NE(last().find("config.size"), std::string::npos) << last();
  EXPECT_NE(last().find("GW_CONFIG_INIT"), std::string::npos) << last();
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.world_size = 1;
  for (size_t small : {size_t{1}, sizeof(size_t), offsetof(gw_config_t, world_size) + 3}) {
    cfg.size = small;
    EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_init(&c, &cfg));
    EXPECT_NE(last().find("too small"), std::string::npos) << last();
  }
  // Larger than this library's struct: built against a newer header whose fields would be lost.
  cfg.size = sizeof(gw_config_t) + 8;
  EXPECT_GW(GW_ERR_UNSUPPORTED, gw_comm_init(&c, &cfg));
  EXPECT_NE(last().find("newer"), std::string::npos) << last();
  EXPECT_EQ(c, sentinel);
}

// --- a world of one -----------------------------------------------------------------------------

class SingleRankTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gw_config_t cfg = GW_CONFIG_INIT;
    cfg.rank = 0;
    cfg.world_size = 1;
    cfg.timeout_ms = 20000;
    ASSERT_EQ(gw_comm_init(&comm_, &cfg), GW_OK) << gw_last_error();
  }
  void TearDown() override {
    if (comm_ != nullptr) {
      EXPECT_EQ(gw_comm_destroy(comm_), GW_OK) << gw_last_error();
    }
  }
  gw_comm_t comm_ = nullptr;
  CleanEnv env_;
};

TEST_F(SingleRankTest, RankAndSize) {
  int r = -1;
  int s = -1;
  EXPECT_GW(GW_OK, gw_comm_rank(comm_, &r));
  EXPECT_GW(GW_OK, gw_comm_size(comm_, &s));
  EXPECT_EQ(r, 0);
  EXPECT_EQ(s, 1);
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_rank(comm_, nullptr));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_size(comm_, nullptr));
}

// gw_comm_describe: the resolved parts of the start-up line; a short buffer gets a truncated,
// terminated copy and the length it needs; an unknown key names the known ones.
TEST_F(SingleRankTest, DescribeGivesTheResolvedValues) {
  char buf[64];
  size_t needed = 0;
  EXPECT_GW(GW_OK, gw_comm_describe(comm_, "transport", buf, sizeof(buf), &needed));
  EXPECT_STREQ(buf, "none");
  EXPECT_EQ(needed, 5u);
  EXPECT_GW(GW_OK, gw_comm_describe(comm_, "summary", nullptr, 0, &needed));
  EXPECT_GT(needed, 10u);
  char two[3] = {'x', 'x', 'x'};
  EXPECT_GW(GW_OK, gw_comm_describe(comm_, "summary", two, sizeof(two), nullptr));
  EXPECT_EQ(std::string(two), "on");  // "one rank: ..." cut to 2 bytes and a NUL
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_describe(comm_, "colour", buf, sizeof(buf), nullptr));
  EXPECT_NE(last().find("transport"), std::string::npos) << last();
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_describe(comm_, nullptr, buf, sizeof(buf), nullptr));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_describe(comm_, "transport", nullptr, 4, nullptr));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_describe(nullptr, "transport", buf, sizeof(buf), nullptr));
}

TEST_F(SingleRankTest, EveryCollective) {
  std::vector<float> in = {1.5f, -2.0f, 3.25f, 0.0f};
  for (gw_op_t op : {GW_SUM, GW_PROD, GW_MIN, GW_MAX, GW_AVG}) {
    std::vector<float> out(in.size(), -99.0f);
    EXPECT_GW(GW_OK, gw_allreduce(comm_, in.data(), out.data(), in.size(), GW_FLOAT32, op));
    EXPECT_EQ(out, in) << "op " << op;
  }
  std::vector<double> d = {1e300, -1e-300, 7};
  std::vector<double> d0 = d;
  EXPECT_GW(GW_OK, gw_allreduce(comm_, d.data(), d.data(), d.size(), GW_FLOAT64, GW_SUM));
  EXPECT_EQ(d, d0);
  std::vector<int64_t> i64 = {INT64_MAX, INT64_MIN, 5};
  std::vector<int64_t> i64o(3);
  EXPECT_GW(GW_OK, gw_allreduce(comm_, i64.data(), i64o.data(), 3, GW_INT64, GW_MAX));
  EXPECT_EQ(i64o, i64);
  std::vector<int32_t> i32 = {1, 2, 3};
  std::vector<int32_t> i32o(3);
  EXPECT_GW(GW_OK, gw_allreduce(comm_, i32.data(), i32o.data(), 3, GW_INT32, GW_AVG));
  EXPECT_EQ(i32o, i32);
  std::vector<uint8_t> u8 = {0, 255, 7};
  EXPECT_GW(GW_OK, gw_allreduce(comm_, u8.data(), u8.data(), 3, GW_UINT8, GW_MIN));
  EXPECT_EQ(u8, (std::vector<uint8_t>{0, 255, 7}));
  std::vector<uint16_t> half = {0x3C00, 0xC000};  // 1.0, -2.0 as float16 and bfloat16 bits
  std::vector<uint16_t> halfo(2);
  EXPECT_GW(GW_OK, gw_allreduce(comm_, half.data(), halfo.data(), 2, GW_FLOAT16, GW_SUM));
  EXPECT_EQ(halfo, half);
  std::vector<uint16_t> bf = {0x3F80, 0xC000};
  EXPECT_GW(GW_OK, gw_allreduce(comm_, bf.data(), halfo.data(), 2, GW_BFLOAT16, GW_SUM));
  EXPECT_EQ(halfo, bf);

  std::vector<int32_t> b = {4, 5, 6};
  EXPECT_GW(GW_OK, gw_broadcast(comm_, b.data(), b.size(), GW_INT32, 0));
  EXPECT_EQ(b, (std::vector<int32_t>{4, 5, 6}));
  std::vector<float> g(in.size());
  EXPECT_GW(GW_OK, gw_allgather(comm_, in.data(), g.data(), in.size(), GW_FLOAT32));
  EXPECT_EQ(g, in);
  std::vector<float> rs(in.size());
  EXPECT_GW(GW_OK, gw_reduce_scatter(comm_, in.data(), rs.data(), in.size(), GW_FLOAT32, GW_SUM));
  EXPECT_EQ(rs, in);
  std::vector<float> a2a(in.size());
  EXPECT_GW(GW_OK, gw_alltoall(comm_, in.data(), a2a.data(), in.size(), GW_FLOAT32));
  EXPECT_EQ(a2a, in);
  EXPECT_GW(GW_OK, gw_alltoall(comm_, a2a.data(), a2a.data(), a2a.size(), GW_FLOAT32));
  EXPECT_EQ(a2a, in);
  EXPECT_GW(GW_OK, gw_barrier(comm_));
  // count 0: buffers may be NULL.
  EXPECT_GW(GW_OK, gw_allreduce(comm_, nullptr, nullptr, 0, GW_FLOAT32, GW_SUM));
  EXPECT_GW(GW_OK, gw_broadcast(comm_, nullptr, 0, GW_FLOAT32, 0));
  EXPECT_GW(GW_OK, gw_allgather(comm_, nullptr, nullptr, 0, GW_INT64));
  EXPECT_GW(GW_OK, gw_reduce_scatter(comm_, nullptr, nullptr, 0, GW_UINT8, GW_MAX));
  EXPECT_GW(GW_OK, gw_alltoall(comm_, nullptr, nullptr, 0, GW_BFLOAT16));
}

TEST_F(SingleRankTest, AsyncAllreduce) {
  std::vector<float> in(1000);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i);
  std::vector<float> out(in.size());
  gw_request_t req = nullptr;
  EXPECT_GW(GW_OK,
            gw_iallreduce(comm_, in.data(), out.data(), in.size(), GW_FLOAT32, GW_SUM, &req));
  ASSERT_NE(req, nullptr);
  EXPECT_GW(GW_OK, gw_wait(req, -1));
  EXPECT_EQ(out, in);
  // The request is gone once it has reported completion.
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_wait(req, 0));

  std::fill(out.begin(), out.end(), 0.0f);
  EXPECT_GW(GW_OK,
            gw_iallreduce(comm_, in.data(), out.data(), in.size(), GW_FLOAT32, GW_MAX, &req));
  int done = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done && std::chrono::steady_clock::now() < deadline) {
    ASSERT_EQ(gw_test(req, &done), GW_OK) << gw_last_error();
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(done, 1);
  EXPECT_EQ(out, in);
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_test(req, &done));
}

TEST_F(SingleRankTest, BadArguments) {
  float x[4] = {1, 2, 3, 4};
  float y[4] = {};
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_allreduce(comm_, nullptr, y, 4, GW_FLOAT32, GW_SUM));
  EXPECT_NE(last().find("sendbuf"), std::string::npos) << last();
  EXPECT_NE(last().find("gw_allreduce"), std::string::npos) << last();
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_allreduce(comm_, x, nullptr, 4, GW_FLOAT32, GW_SUM));
  EXPECT_NE(last().find("recvbuf"), std::string::npos) << last();
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_allreduce(comm_, x, y, 4, static_cast<gw_dtype_t>(42), GW_SUM));
  EXPECT_NE(last().find("dtype"), std::string::npos) << last();
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_allreduce(comm_, x, y, 4, static_cast<gw_dtype_t>(-1), GW_SUM));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_allreduce(comm_, x, y, 4, GW_FLOAT32, static_cast<gw_op_t>(17)));
  EXPECT_NE(last().find("op"), std::string::npos) << last();
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_allreduce(comm_, x, y, 4, GW_FLOAT32, static_cast<gw_op_t>(-3)));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_allreduce(comm_, x, y, SIZE_MAX / 2, GW_FLOAT32, GW_SUM));
  EXPECT_NE(last().find("overflow"), std::string::npos) << last();
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_allreduce(comm_, x, y, SIZE_MAX / 8 + 1, GW_INT64, GW_SUM));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_allreduce(comm_, x, x + 1, 2, GW_FLOAT32, GW_SUM));  // overlap
  EXPECT_NE(last().find("overlap"), std::string::npos) << last();

  EXPECT_GW(GW_ERR_INVALID_ARG, gw_broadcast(comm_, x, 4, GW_FLOAT32, 1));
  EXPECT_NE(last().find("root"), std::string::npos) << last();
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_broadcast(comm_, x, 4, GW_FLOAT32, -1));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_broadcast(comm_, nullptr, 4, GW_FLOAT32, 0));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_broadcast(comm_, x, 4, static_cast<gw_dtype_t>(7), 0));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_broadcast(comm_, x, SIZE_MAX, GW_FLOAT64, 0));

  EXPECT_GW(GW_ERR_INVALID_ARG, gw_allgather(comm_, nullptr, y, 4, GW_FLOAT32));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_allgather(comm_, x, nullptr, 4, GW_FLOAT32));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_allgather(comm_, x, y, SIZE_MAX / 3, GW_FLOAT32));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_allgather(comm_, x, y, 4, static_cast<gw_dtype_t>(100)));

  EXPECT_GW(GW_ERR_INVALID_ARG, gw_reduce_scatter(comm_, nullptr, y, 4, GW_FLOAT32, GW_SUM));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_reduce_scatter(comm_, x, nullptr, 4, GW_FLOAT32, GW_SUM));
  EXPECT_GW(GW_ERR_INVALID_ARG,
            gw_reduce_scatter(comm_, x, y, 4, GW_FLOAT32, static_cast<gw_op_t>(5)));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_reduce_scatter(comm_, x, y, SIZE_MAX / 2, GW_INT32, GW_SUM));

  EXPECT_GW(GW_ERR_INVALID_ARG, gw_alltoall(comm_, nullptr, y, 4, GW_FLOAT32));
  EXPECT_NE(last().find("sendbuf"), std::string::npos) << last();
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_alltoall(comm_, x, nullptr, 4, GW_FLOAT32));
  EXPECT_NE(last().find("recvbuf"), std::string::npos) << last();
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_alltoall(comm_, x, x + 1, 2, GW_FLOAT32));
  EXPECT_NE(last().find("overlap"), std::string::npos) << last();
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_alltoall(comm_, x, y, SIZE_MAX / 2, GW_INT32));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_alltoall(comm_, x, y, 4, static_cast<gw_dtype_t>(-3)));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_alltoall(nullptr, x, y, 4, GW_FLOAT32));

  gw_request_t req = nullptr;
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_iallreduce(comm_, x, y, 4, GW_FLOAT32, GW_SUM, nullptr));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_iallreduce(comm_, nullptr, y, 4, GW_FLOAT32, GW_SUM, &req));
  EXPECT_GW(GW_ERR_INVALID_ARG,
            gw_iallreduce(comm_, x, y, 4, static_cast<gw_dtype_t>(9), GW_SUM, &req));
  EXPECT_EQ(req, nullptr);  // untouched
  EXPECT_GW(GW_OK, gw_iallreduce(comm_, x, y, 4, GW_FLOAT32, GW_SUM, &req));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_wait(req, -7));
  EXPECT_GW(GW_OK, gw_wait(req, -1));

  // Nothing above broke the communicator.
  EXPECT_GW(GW_OK, gw_allreduce(comm_, x, y, 4, GW_FLOAT32, GW_SUM));
  EXPECT_EQ(y[3], 4.0f);
}

// Direct mode: gw_mem_alloc is aligned host memory the collectives take like any other buffer.
TEST_F(SingleRankTest, MemAllocInDirectMode) {
  void* p = nullptr;
  ASSERT_EQ(gw_mem_alloc(comm_, 4096, &p), GW_OK) << gw_last_error();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  auto* f = static_cast<float*>(p);
  for (int i = 0; i < 1024; ++i) f[i] = static_cast<float>(i);
  EXPECT_EQ(gw_allreduce(comm_, p, p, 1024, GW_FLOAT32, GW_SUM), GW_OK) << gw_last_error();
  EXPECT_EQ(f[1023], 1023.0f);
  EXPECT_EQ(gw_mem_alloc(comm_, 0, &p), GW_ERR_INVALID_ARG);
  EXPECT_EQ(gw_mem_alloc(comm_, 16, nullptr), GW_ERR_INVALID_ARG);
  float local = 0;
  EXPECT_EQ(gw_mem_free(comm_, &local), GW_ERR_INVALID_ARG);
  EXPECT_NE(std::string(gw_last_error()).find("gw_mem_alloc"), std::string::npos);
  EXPECT_EQ(gw_mem_free(comm_, p), GW_OK);
  EXPECT_EQ(gw_mem_free(comm_, p), GW_ERR_INVALID_ARG);  // twice
  EXPECT_EQ(gw_mem_free(comm_, nullptr), GW_OK);
  // Left for gw_comm_destroy to free.
  ASSERT_EQ(gw_mem_alloc(comm_, 100, &p), GW_OK);
}

TEST_F(SingleRankTest, SplitNeedsAnOutputPointer) {
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_split(comm_, 0, 0, nullptr));
  EXPECT_NE(last().find("newcomm"), std::string::npos) << last();
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_split(comm_, -1, 0, nullptr));
  EXPECT_GW(GW_OK, gw_barrier(comm_));  // nothing was started
}

TEST_F(SingleRankTest, CallsOnADestroyedComm) {
  gw_comm_t c = comm_;
  comm_ = nullptr;
  EXPECT_GW(GW_OK, gw_comm_destroy(c));
  float x = 1;
  int v = 0;
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_allreduce(c, &x, &x, 1, GW_FLOAT32, GW_SUM));
  EXPECT_NE(last().find("destroyed"), std::string::npos) << last();
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_rank(c, &v));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_barrier(c));
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_abort(c));
  gw_comm_t sub = nullptr;
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_split(c, 0, 0, &sub));
  EXPECT_EQ(sub, nullptr);
  EXPECT_GW(GW_ERR_INVALID_ARG, gw_comm_destroy(c));  // double destroy
}

TEST_F(SingleRankTest, CallsOnAnAbortedComm) {
  EXPECT_GW(GW_OK, gw_comm_abort(comm_));
  EXPECT_GW(GW_OK, gw_comm_abort(comm_));  // idempotent
  float x[2] = {1, 2};
  gw_request_t req = nullptr;
  EXPECT_GW(GW_ERR_ABORTED, gw_allreduce(comm_, x, x, 2, GW_FLOAT32, GW_SUM));
  EXPECT_NE(last().find("abort"), std::string::npos) << last();
  EXPECT_GW(GW_ERR_ABORTED, gw_broadcast(comm_, x, 2, GW_FLOAT32, 0));
  EXPECT_GW(GW_ERR_ABORTED, gw_allgather(comm_, x, x, 1, GW_FLOAT32));
  EXPECT_GW(GW_ERR_ABORTED, gw_reduce_scatter(comm_, x, x, 1, GW_FLOAT32, GW_SUM));
  EXPECT_GW(GW_ERR_ABORTED, gw_alltoall(comm_, x, x, 1, GW_FLOAT32));
  EXPECT_GW(GW_ERR_ABORTED, gw_barrier(comm_));
  EXPECT_GW(GW_ERR_ABORTED, gw_iallreduce(comm_, x, x, 2, GW_FLOAT32, GW_SUM, &req));
  EXPECT_EQ(req, nullptr);
  gw_comm_t sub = reinterpret_cast<gw_comm_t>(0x1234);
  EXPECT_GW(GW_ERR_ABORTED, gw_comm_split(comm_, 0, 0, &sub));
  EXPECT_GW(GW_ERR_ABORTED, gw_comm_split(comm_, -1, 0, &sub));
  EXPECT_EQ(sub, reinterpret_cast<gw_comm_t>(0x1234));
  int r = -1;
  EXPECT_GW(GW_OK, gw_comm_rank(comm_, &r));  // getters still answer
  EXPECT_EQ(r, 0);
}

// --- several ranks as threads over the TCP store -------------------------------------------------

using gw::testing::free_port;

struct RankResult {
  gw_status_t init = GW_ERR_INTERNAL;
  std::string error;
  bool checked = false;
};

// Every rank: init, allreduce (sum and max), iallreduce with gw_wait, iallreduce with gw_test,
// broadcast from the last rank, barrier, destroy. Checks values itself.
void run_rank(int rank, int world, const std::string& addr, const char* transport,
              RankResult* out) {
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.rank = rank;
  cfg.world_size = world;
  cfg.store_addr = addr.c_str();
  cfg.transport = transport;
  cfg.timeout_ms = 30000;
  cfg.job_token = "capi-test-token";
  gw_comm_t comm = nullptr;
  out->init = gw_comm_init(&comm, &cfg);
  if (out->init != GW_OK) {
    out->error = gw_last_error();
    return;
  }
  auto fail = [&](const std::string& what) {
    if (out->error.empty()) out->error = what + ": " + gw_last_error();
  };
  // What was resolved: a transport name, never "auto"; tcp names its interface and address.
  char what[256];
  if (gw_comm_describe(comm, "transport", what, sizeof(what), nullptr) != GW_OK) {
    fail("describe transport");
  } else if (std::string(what) != (std::string(transport) == "auto" ? "shm" : transport)) {
    fail(std::string("described transport ") + what + " for " + transport);
  }
  if (gw_comm_describe(comm, "interface", what, sizeof(what), nullptr) != GW_OK) {
    fail("describe interface");
  } else if (std::string(transport) == "tcp" &&
             std::string(what).find(":127.0.0.1") == std::string::npos) {
    fail(std::string("described interface ") + what);
  }
  if (gw_comm_describe(comm, "allreduce", what, sizeof(what), nullptr) != GW_OK ||
      std::string(what).empty()) {
    fail("describe allreduce");
  }
  constexpr size_t kCount = 100003;  // odd: uneven ring chunks
  std::vector<float> in(kCount);
  std::vector<float> out_buf(kCount);
  for (size_t i = 0; i < kCount; ++i) in[i] = static_cast<float>((rank + 1) * (i % 97));
  if (gw_allreduce(comm, in.data(), out_buf.data(), kCount, GW_FLOAT32, GW_SUM) != GW_OK) {
    fail("allreduce");
  }
  const float tri = static_cast<float>(world * (world + 1) / 2);
  for (size_t i = 0; i < kCount; ++i) {
    if (out_buf[i] != tri * static_cast<float>(i % 97)) {
      fail("allreduce sum value at " + std::to_string(i));
      break;
    }
  }
  std::vector<int64_t> iv = {rank, -rank, 1000 + rank};
  if (gw_allreduce(comm, iv.data(), iv.data(), 3, GW_INT64, GW_MAX) != GW_OK) fail("allreduce max");
  if (iv != std::vector<int64_t>{world - 1, 0, 1000 + world - 1}) fail("allreduce max value");

  gw_request_t req = nullptr;
  std::vector<double> d(4096, rank + 0.5);
  std::vector<double> dout(4096);
  if (gw_iallreduce(comm, d.data(), dout.data(), d.size(), GW_FLOAT64, GW_SUM, &req) != GW_OK ||
      gw_wait(req, -1) != GW_OK) {
    fail("iallreduce + wait");
  } else if (dout[4095] != world * world / 2.0) {
    fail("iallreduce value");
  }
  std::vector<int32_t> a(777, rank);
  if (gw_iallreduce(comm, a.data(), a.data(), a.size(), GW_INT32, GW_SUM, &req) != GW_OK) {
    fail("iallreduce (test)");
  } else {
    int done = 0;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!done && std::chrono::steady_clock::now() < deadline) {
      if (gw_test(req, &done) != GW_OK) {
        fail("gw_test");
        break;
      }
      if (!done) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (!done) fail("gw_test never finished");
    if (a[776] != world * (world - 1) / 2) fail("iallreduce (test) value");
  }
  std::vector<uint8_t> b(1000, static_cast<uint8_t>(rank == world - 1 ? 42 : 0));
  if (gw_broadcast(comm, b.data(), b.size(), GW_UINT8, world - 1) != GW_OK) fail("broadcast");
  if (b[999] != 42) fail("broadcast value");
  // alltoall: block j of rank r holds 1000 * r + j, so rank r receives 1000 * j + r from rank j.
  std::vector<int64_t> send(static_cast<size_t>(world) * 3), recv(send.size());
  for (size_t i = 0; i < send.size(); ++i) send[i] = 1000 * rank + static_cast<int64_t>(i / 3);
  if (gw_alltoall(comm, send.data(), recv.data(), 3, GW_INT64) != GW_OK) fail("alltoall");
  for (size_t i = 0; i < recv.size(); ++i) {
    if (recv[i] != 1000 * static_cast<int64_t>(i / 3) + rank) {
      fail("alltoall value at " + std::to_string(i));
      break;
    }
  }
  if (gw_barrier(comm) != GW_OK) fail("barrier");
  if (gw_comm_destroy(comm) != GW_OK) fail("destroy");
  out->checked = true;
}

// Runs rank_fn on `world` ranks as threads; every rank must have initialized, checked all and
// recorded no error.
void run_checked_ranks(int world, const char* transport,
                       void (*rank_fn)(int, int, const std::string&, const char*, RankResult*)) {
  std::vector<RankResult> results(world);
  gw::testing::run_capi_ranks(world, [&](int r, const std::string& addr) {
    rank_fn(r, world, addr, transport, &results[r]);
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(results[r].init, GW_OK) << "rank " << r << ": " << results[r].error;
    EXPECT_TRUE(results[r].checked) << "rank " << r;
    EXPECT_EQ(results[r].error, "") << "rank " << r;
  }
}

class MultiRankTest : public ::testing::TestWithParam<std::tuple<int, const char*>> {};

TEST_P(MultiRankTest, CollectivesThroughTheCApi) {
  CleanEnv env;
  auto [world, transport] = GetParam();
  run_checked_ranks(world, transport, run_rank);
}

INSTANTIATE_TEST_SUITE_P(Worlds, MultiRankTest,
                         ::testing::Values(std::make_tuple(2, "tcp"), std::make_tuple(3, "tcp"),
                                           std::make_tuple(4, "auto")));

TEST(CapiFailureTest, MissingRankEndsInAnErrorNotAHang) {
  CleanEnv env;
  gw_config_t cfg = GW_CONFIG_INIT;
  std::string addr = "127.0.0.1:" + std::to_string(free_port());
  cfg.rank = 0;
  cfg.world_size = 2;  // rank 1 never comes
  cfg.store_addr = addr.c_str();
  cfg.timeout_ms = 1500;
  gw_comm_t comm = nullptr;
  auto start = std::chrono::steady_clock::now();
  gw_status_t s = gw_comm_init(&comm, &cfg);
  EXPECT_TRUE(s == GW_ERR_TIMEOUT || s == GW_ERR_PEER) << s << ": " << gw_last_error();
  EXPECT_STRNE(gw_last_error(), "");
  EXPECT_EQ(comm, nullptr);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
}

TEST(CapiFailureTest, WrongJobTokenIsRefused) {
  CleanEnv env;
  std::string addr = "127.0.0.1:" + std::to_string(free_port());
  gw_status_t s0 = GW_OK;
  gw_status_t s1 = GW_OK;
  std::string e1;
  std::thread r0([&] {
    gw_config_t cfg = GW_CONFIG_INIT;
    cfg.rank = 0;
    cfg.world_size = 2;
    cfg.store_addr = addr.c_str();
    cfg.timeout_ms = 2000;
    cfg.job_token = "job-A";
    gw_comm_t c = nullptr;
    s0 = gw_comm_init(&c, &cfg);
    if (s0 == GW_OK) gw_comm_destroy(c);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.rank = 1;
  cfg.world_size = 2;
  cfg.store_addr = addr.c_str();
  cfg.timeout_ms = 2000;
  cfg.job_token = "job-B";
  gw_comm_t c = nullptr;
  s1 = gw_comm_init(&c, &cfg);
  e1 = gw_last_error();
  r0.join();
  EXPECT_EQ(s1, GW_ERR_PEER) << e1;
  EXPECT_NE(e1.find("token"), std::string::npos) << e1;
  EXPECT_NE(s0, GW_OK);
}

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
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.rank = rank;
  cfg.world_size = world;
  cfg.store_addr = addr.c_str();
  cfg.transport = transport;
  cfg.timeout_ms = 30000;
  cfg.job_token = "capi-split-token";
  gw_comm_t comm = nullptr;
  out->init = gw_comm_init(&comm, &cfg);
  if (out->init != GW_OK) {
    out->error = gw_last_error();
    return;
  }
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

class SplitTest : public ::testing::TestWithParam<std::tuple<int, const char*>> {};

TEST_P(SplitTest, SubCommunicatorsBesideTheParent) {
  CleanEnv env;
  auto [world, transport] = GetParam();
  run_checked_ranks(world, transport, run_split_rank);
}

INSTANTIATE_TEST_SUITE_P(Worlds, SplitTest,
                         ::testing::Values(std::make_tuple(1, "tcp"), std::make_tuple(2, "tcp"),
                                           std::make_tuple(3, "tcp"), std::make_tuple(4, "tcp"),
                                           std::make_tuple(5, "tcp"), std::make_tuple(6, "auto"),
                                           std::make_tuple(7, "tcp"), std::make_tuple(8, "auto")),
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

// ---- gw_comm_destroy with work pending (issue 16) ---------------------------------------------

using gw::testing::thread_rank_config;

// Two ranks as threads; returns both communicators (rank order) or fails the test.
std::vector<gw_comm_t> two_ranks(const std::string& token, const char* transport = "tcp") {
  return gw::testing::init_ranks(2, token, transport);
}

// The peer never joins the iallreduce: destroy must end it (not leave it running for the deadline,
// writing recvbuf after destroy returned), and the request must report the abort.
TEST(CapiDestroyTest, DestroyAbortsAnIallreduceInFlightAndNothingIsWrittenAfter) {
  CleanEnv env;
  std::vector<gw_comm_t> comms = two_ranks("capi-destroy-async");
  ASSERT_TRUE(comms[0] && comms[1]);
  std::vector<float> send(1 << 16, 1.0f), recv(1 << 16, -5.0f);
  gw_request_t req = nullptr;
  ASSERT_EQ(
      gw_iallreduce(comms[0], send.data(), recv.data(), send.size(), GW_FLOAT32, GW_SUM, &req),
      GW_OK)
      << gw_last_error();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // it is waiting for rank 1 now
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(gw_comm_destroy(comms[0]), GW_OK) << gw_last_error();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  const std::vector<float> after = recv;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(recv, after) << "recvbuf written after gw_comm_destroy returned";
  EXPECT_EQ(gw_wait(req, 1000), GW_ERR_ABORTED) << gw_last_error();
  EXPECT_EQ(gw_wait(req, 0), GW_ERR_INVALID_ARG);  // freed by the wait
  EXPECT_EQ(gw_comm_destroy(comms[1]), GW_OK) << gw_last_error();
}

// A call blocked on another thread (its peer never comes) ends in GW_ERR_ABORTED when the
// communicator is destroyed, promptly, and destroy returns only once the call can no longer touch
// the caller's buffer. (Destroy cannot wait for the caller's next statement: the thread may be
// preempted between the call's return and `returned = true`, so that flag is awaited, not
// asserted at once.)
TEST(CapiDestroyTest, DestroyFromAnotherThreadEndsABlockedCall) {
  CleanEnv env;
  std::vector<gw_comm_t> comms = two_ranks("capi-destroy-blocked");
  ASSERT_TRUE(comms[0] && comms[1]);
  std::vector<float> buf(1 << 16, 1.0f);
  std::atomic<int> result{-1};
  std::atomic<bool> returned{false};
  std::thread blocked([&] {
    result = gw_allreduce(comms[0], buf.data(), buf.data(), buf.size(), GW_FLOAT32, GW_SUM);
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_FALSE(returned.load()) << "the allreduce returned without its peer: " << result.load();
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(gw_comm_destroy(comms[0]), GW_OK) << gw_last_error();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  const std::vector<float> after = buf;
  const auto join_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!returned.load() && std::chrono::steady_clock::now() < join_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(returned.load()) << "the blocked call did not return within 2 s of destroy";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(buf, after) << "buffer written after gw_comm_destroy returned";
  blocked.join();
  EXPECT_EQ(result.load(), GW_ERR_ABORTED);
  EXPECT_EQ(gw_comm_destroy(comms[1]), GW_OK) << gw_last_error();
}

// Rank 0 hosts the store, and destroying its communicator ends the store: it may do so right
// after gw_comm_init, since init returns on rank 0 only once every rank is done with the store
// (others still reading the cost figures used to fail, "connection reset by the peer").
TEST(CapiDestroyTest, RankZeroMayDestroyRightAfterInit) {
  CleanEnv env;
  for (int round = 0; round < 20; ++round) {
    std::vector<gw_status_t> st(3, GW_OK);
    std::vector<std::string> why(3);
    gw::testing::run_capi_ranks(3, [&](int r, const std::string& addr) {
      gw_config_t cfg = thread_rank_config(r, 3, addr, "capi-destroy-early", 10000);
      gw_comm_t c = nullptr;
      st[r] = gw_comm_init(&c, &cfg);
      if (st[r] != GW_OK) why[r] = gw_last_error();
      if (r != 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      gw_comm_destroy(c);
    });
    for (int r = 0; r < 3; ++r) {
      ASSERT_EQ(st[r], GW_OK) << "round " << round << ", rank " << r << ": " << why[r];
    }
  }
}

// ---- leaks (issue 16) --------------------------------------------------------------------------

size_t count_dir(const char* path) {
  size_t n = 0;
  if (DIR* d = opendir(path)) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

size_t rss_kib() {
  std::ifstream f("/proc/self/statm");
  size_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE)) / 1024;
}

// Creating, using and destroying communicators (2 ranks as threads, tcp and shm alternately, one
// allreduce each) leaves the process's descriptors and threads where they were, and its memory
// flat: measured after a warm-up of 100 pairs and again after 1,000 more.
TEST(CapiLeakTest, ThousandCommunicatorsLeaveFdsThreadsAndMemoryFlat) {
  CleanEnv env;
  auto round = [](int i) {
    std::vector<gw_comm_t> comms = two_ranks("capi-leak", i % 2 ? "shm" : "tcp");
    if (!comms[0] || !comms[1]) return false;
    std::vector<gw_status_t> st(2, GW_OK);
    std::vector<std::vector<float>> bufs(2, std::vector<float>(4096, 1.0f));
    gw::testing::on_each_rank(comms, [&](int r, gw_comm_t comm) {
      st[r] =
          gw_allreduce(comm, bufs[r].data(), bufs[r].data(), bufs[r].size(), GW_FLOAT32, GW_SUM);
    });
    EXPECT_EQ(st[0], GW_OK);
    EXPECT_EQ(st[1], GW_OK);
    EXPECT_EQ(bufs[0][7], 2.0f);
    EXPECT_EQ(gw_comm_destroy(comms[0]), GW_OK);
    EXPECT_EQ(gw_comm_destroy(comms[1]), GW_OK);
    return st[0] == GW_OK && st[1] == GW_OK;
  };
  // A joined thread leaves /proc/self/task a moment after pthread_join returns (the kernel clears
  // the thread id before it releases the task): the baseline is the least of counts over 100 ms,
  // and the final count is read again, for up to 2 s, until it comes down to the baseline.
  auto baseline_threads = [] {
    size_t n = count_dir("/proc/self/task");
    for (int i = 0; i < 20; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      n = std::min(n, count_dir("/proc/self/task"));
    }
    return n;
  };
  auto settled_threads = [](size_t want) {
    size_t n = count_dir("/proc/self/task");
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (n != want && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      n = count_dir("/proc/self/task");
    }
    return n;
  };
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(round(i)) << "warm-up round " << i;
  const size_t fds0 = count_dir("/proc/self/fd"), threads0 = baseline_threads();
  const size_t rss0 = rss_kib();
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(round(i)) << "round " << i;
  const size_t fds1 = count_dir("/proc/self/fd"), threads1 = settled_threads(threads0);
  const size_t rss1 = rss_kib();
  std::printf("after 100 / 1100 pairs: %zu / %zu fds, %zu / %zu threads, %zu / %zu KiB resident\n",
              fds0, fds1, threads0, threads1, rss0, rss1);
  EXPECT_EQ(fds1, fds0) << "descriptors leaked over 1,000 communicator pairs";
  EXPECT_EQ(threads1, threads0) << "threads leaked over 1,000 communicator pairs";
  // A leak of even 8 KiB per communicator would add 16 MiB; allocator noise stays far below.
  // Under a sanitizer (quarantine, shadow memory) resident memory says nothing about leaks:
  // LeakSanitizer checks them there instead.
  if (kSanitized) return;
  EXPECT_LT(rss1, rss0 + 8 * 1024)
      << "resident memory grew from " << rss0 << " KiB to " << rss1 << " KiB";
}

// The header's promise for integer GW_AVG: summed in the dtype (wrapping), then divided.
TEST(CapiAvgTest, IntegerAverageWrapsInTheDtypeAsDocumented) {
  CleanEnv env;
  std::vector<gw_comm_t> comms = two_ranks("capi-avg");
  ASSERT_TRUE(comms[0] && comms[1]);
  std::vector<std::vector<uint8_t>> u8(2, std::vector<uint8_t>{255, 3, 200});
  u8[1][1] = 4;
  std::vector<std::vector<int32_t>> i32(2, std::vector<int32_t>{-7, 9});
  std::vector<gw_status_t> st(4, GW_OK);
  gw::testing::on_each_rank(comms, [&](int r, gw_comm_t comm) {
    st[r] = gw_allreduce(comm, u8[r].data(), u8[r].data(), 3, GW_UINT8, GW_AVG);
    st[2 + r] = gw_allreduce(comm, i32[r].data(), i32[r].data(), 2, GW_INT32, GW_AVG);
  });
  for (gw_status_t s : st) EXPECT_EQ(s, GW_OK);
  for (int r = 0; r < 2; ++r) {
    // 255+255 = 510 wraps to 254 in uint8, /2 = 127; 3+4 = 7, /2 = 3; 200+200 wraps to 144, 72.
    EXPECT_EQ(u8[r], (std::vector<uint8_t>{127, 3, 72})) << "rank " << r;
    EXPECT_EQ(i32[r], (std::vector<int32_t>{-7, 9})) << "rank " << r;  // -14/2, 18/2
  }
  EXPECT_EQ(gw_comm_destroy(comms[0]), GW_OK);
  EXPECT_EQ(gw_comm_destroy(comms[1]), GW_OK);
}
