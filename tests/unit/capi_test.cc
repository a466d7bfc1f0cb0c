// The C ABI through the real libgradwire.so: version and status strings, the exported symbols,
// bad input of every kind, handle misuse (NULL, foreign, destroyed, aborted), the config struct's
// sizes, and a world of one doing every collective. Several ranks: capi_ranks_test.cc; split:
// capi_split_test.cc (one binary, capi_test).
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

}  // namespace
