// One rank's mistake at start-up ends every rank at once, naming it: a setting one rank refuses
// (GW_TRANSPORT=tpc, on rank 0 or on another rank), ranks started for different world sizes or by
// different launchers, and a store port held by something that is not a gradwire store. Each case
// runs with GW_TIMEOUT_MS at 60 s: every rank must exit within 2 s of the first one, well before.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/proc_harness.h"
#include "tests/support/prompt_failures.h"

namespace gw::test {
namespace {

constexpr int kTimeoutMs = 60000;   // what a rank would wait without the fixes
constexpr double kSpreadMs = 2000;  // every rank exits within this of the first

// A typo on one rank: that rank fails at once, and says why in the store, so the others fail at
// once naming it and its reason (before: they waited GW_TIMEOUT_MS, then blamed the store).
class OneRankRefusesASetting : public ::testing::TestWithParam<int> {};

TEST_P(OneRankRefusesASetting, EveryRankFailsAtOnceNamingIt) {
  const int bad = GetParam();
  const int world = 3;
  const int port = free_port();
  ASSERT_GT(port, 0);
  ProcGroup g;
  for (int r = 0; r < world; ++r) {
    Env env = tcp_rank_env(r, world, port, kTimeoutMs);
    if (r == bad) env["GW_TRANSPORT"] = "tpc";
    g.start({GW_RANK_MAIN_PATH, "identity"}, env);
  }
  auto results = g.wait_all(kTimeoutMs / 2);
  ASSERT_EQ(results.size(), static_cast<size_t>(world));
  expect_failed_promptly(results, kTimeoutMs / 4, kSpreadMs);
  for (int r = 0; r < world; ++r) {
    const auto& out = results[static_cast<size_t>(r)].output;
    EXPECT_NE(out.find("tpc"), std::string::npos) << "rank " << r << ": " << out;
    if (r != bad) {
      const std::string want = "rank " + std::to_string(bad) + " failed to set up";
      EXPECT_NE(out.find(want), std::string::npos) << "rank " << r << ": " << out;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BadRank, OneRankRefusesASetting, ::testing::Values(0, 2),
                         [](const auto& info) { return "rank" + std::to_string(info.param); });

// A transport named on one rank that cannot run there (verbs without an RDMA device or the
// emulator) is refused before the rendezvous too, not once the transports are made.
TEST(SetupFailureTest, AnUnusableTransportOnOneRankFailsEveryRankAtOnce) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  ProcGroup g;
  for (int r = 0; r < 2; ++r) {
    Env env = tcp_rank_env(r, 2, port, kTimeoutMs);
    if (r == 1) env["GW_TRANSPORT"] = "verbs";
    g.start({GW_RANK_MAIN_PATH, "identity"}, env);
  }
  auto results = g.wait_all(kTimeoutMs / 2);
  ASSERT_EQ(results.size(), 2u);
  if (results[1].exited && results[1].exit_code == 0) GTEST_SKIP() << "verbs runs here";
  expect_failed_promptly(results, kTimeoutMs / 4, kSpreadMs);
  EXPECT_NE(results[1].output.find("cannot run in this process"), std::string::npos)
      << results[1].describe();
  EXPECT_NE(results[0].output.find("rank 1 failed to set up"), std::string::npos)
      << results[0].describe();
}

// Rank 0 not there (yet): a refused connection is retried until the deadline, since a launcher
// may start rank 0 last, but the waiting rank says every 5 s what it waits for, not nothing.
TEST(SetupFailureTest, AWaitForTheStoreIsSaidEveryFewSeconds) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  ProcGroup g;
  Env env = tcp_rank_env(1, 2, port, kTimeoutMs);
  env["GW_TIMEOUT_MS"] = "6500";
  g.start({GW_RANK_MAIN_PATH, "identity"}, env);
  auto results = g.wait_all(30000);
  ASSERT_EQ(results.size(), 1u);
  const auto& res = results[0];
  EXPECT_TRUE(res.exited && res.exit_code != 0) << res.describe();
  EXPECT_NE(res.output.find("waiting for the store at 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << res.describe();
  EXPECT_NE(res.output.find("rank 0 hosts it"), std::string::npos) << res.describe();
}

// Ranks started for different world sizes: each fails once it reads an entry that disagrees
// (everyone reads rank 0's first), naming both sizes (before: both waited out the deadline).
TEST(SetupFailureTest, MismatchedWorldSizesFailEveryRankAtOnce) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  ProcGroup g;
  g.start({GW_RANK_MAIN_PATH, "identity"}, tcp_rank_env(0, 2, port, kTimeoutMs));
  g.start({GW_RANK_MAIN_PATH, "identity"}, tcp_rank_env(1, 3, port, kTimeoutMs));
  auto results = g.wait_all(kTimeoutMs / 2);
  ASSERT_EQ(results.size(), 2u);
  expect_failed_promptly(results, kTimeoutMs / 4, kSpreadMs);
  for (const auto& res : results) {
    EXPECT_NE(res.output.find("world of"), std::string::npos) << res.describe();
    EXPECT_NE(res.output.find(" 2"), std::string::npos) << res.describe();
    EXPECT_NE(res.output.find(" 3"), std::string::npos) << res.describe();
  }
}

// Rank 0 from GW_* variables, rank 1 from torchrun's: they meet (same store) but were not started
// the same way, which every rank says at once.
TEST(SetupFailureTest, MismatchedLaunchersFailEveryRankAtOnce) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  ProcGroup g;
  g.start({GW_RANK_MAIN_PATH, "identity"}, tcp_rank_env(0, 2, port, kTimeoutMs));
  Env torchrun = clean_env();
  torchrun["RANK"] = "1";
  torchrun["WORLD_SIZE"] = "2";
  torchrun["MASTER_ADDR"] = "127.0.0.1";
  torchrun["MASTER_PORT"] = std::to_string(port);
  torchrun["GW_TIMEOUT_MS"] = std::to_string(kTimeoutMs);
  g.start({GW_RANK_MAIN_PATH, "identity"}, torchrun);
  auto results = g.wait_all(kTimeoutMs / 2);
  ASSERT_EQ(results.size(), 2u);
  expect_failed_promptly(results, kTimeoutMs / 4, kSpreadMs);
  for (const auto& res : results) {
    EXPECT_NE(res.output.find("torchrun"), std::string::npos) << res.describe();
    EXPECT_NE(res.output.find("GW_*"), std::string::npos) << res.describe();
  }
}

// Something other than a gradwire store on the store's port (torchrun's own TCPStore on
// MASTER_PORT, a web server): rank 0 cannot bind it and fails at once; the others reach the
// stranger and say so at once instead of retrying until the deadline.
class ForeignListener {
 public:
  // reply: what it writes to each connection before closing it ("" closes at once).
  explicit ForeignListener(std::string reply) : reply_(std::move(reply)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof(a);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        listen(fd_, 16) != 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return;
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      while (!stop_) {
        const int c = accept(fd_, nullptr, nullptr);
        if (c < 0) continue;
        char buf[256];
        (void)recv(c, buf, sizeof(buf), MSG_DONTWAIT);
        if (!reply_.empty()) (void)send(c, reply_.data(), reply_.size(), MSG_NOSIGNAL);
        close(c);
      }
    });
  }
  ~ForeignListener() {
    stop_ = true;
    if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) close(fd_);
  }
  int port() const { return port_; }

 private:
  std::string reply_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class ForeignStorePort : public ::testing::TestWithParam<std::string> {};

TEST_P(ForeignStorePort, EveryRankFailsAtOnceSayingSo) {
  ForeignListener stranger(GetParam());
  ASSERT_GT(stranger.port(), 0);
  ProcGroup g;
  for (int r = 0; r < 2; ++r) {
    g.start({GW_RANK_MAIN_PATH, "identity"}, tcp_rank_env(r, 2, stranger.port(), kTimeoutMs));
  }
  auto results = g.wait_all(kTimeoutMs / 2);
  ASSERT_EQ(results.size(), 2u);
  expect_failed_promptly(results, kTimeoutMs / 4, kSpreadMs);
  EXPECT_NE(results[0].output.find("in use"), std::string::npos) << results[0].describe();
  EXPECT_NE(results[0].output.find("another process holds the store's port"), std::string::npos)
      << results[0].describe();
  EXPECT_NE(results[1].output.find("something other than a gradwire store"), std::string::npos)
      << results[1].describe();
}

INSTANTIATE_TEST_SUITE_P(Replies, ForeignStorePort,
                         ::testing::Values("HTTP/1.0 400 Bad Request\r\n\r\n", ""),
                         [](const auto& info) {
                           return info.param.empty() ? std::string("ClosesAtOnce")
                                                     : std::string("AnswersHttp");
                         });

}  // namespace
}  // namespace gw::test
