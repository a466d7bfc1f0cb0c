// The plugin between two processes, as between two NCCL ranks: this process is rank 0, a forked
// and exec'd nccl_plugin_peer is rank 1; the 128-byte handles travel through pipes, the data
// through the plugin over loopback. PluginChunkEdges runs both ends in this process: across two
// daemons (GW_PLUGIN_TEST_XHOST=1) with a second instance of the plugin on the other "host".
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tests/plugin/plugin_harness.h"

namespace gw::plugin_test {
namespace {

// Kills and reaps the child if the test ends early.
class Child {
 public:
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid_ = -1;
  // Exit status, or -1 when it crashed or did not finish in time (then it is killed).
  int wait(int deadline_s) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(deadline_s);
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) return -1;  // destructor kills it
      usleep(10000);
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
};

TEST(PluginTwoProcesses, ExchangeSizesAndBurstsBothWays) {
  plugin();  // load (and set the loopback environment) before forking
  int to_child[2], from_child[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(from_child), 0);
  std::string path = GW_PLUGIN_PEER_PATH;
  std::vector<char*> argv = {path.data(), const_cast<char*>("exchange"), const_cast<char*>("1"),
                             nullptr};
  Child child;
  child.pid_ = fork();
  ASSERT_GE(child.pid_, 0);
  if (child.pid_ == 0) {
    dup2(to_child[0], STDIN_FILENO);
    dup2(from_child[1], STDOUT_FILENO);
    close(to_child[1]);
    close(from_child[0]);
    execv(path.c_str(), argv.data());
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  signal(SIGPIPE, SIG_IGN);
  auto api = make_api("v11");
  Error e = exchange_with_peer(*api, from_child[0], to_child[1], 0);
  close(to_child[1]);
  close(from_child[0]);
  const int child_rc = child.wait(60);
  // Two hosts over dpdk (GW_PLUGIN_TEST_XHOST_TRANSPORT=dpdk): EAL refused here, or the daemons
  // really ran their DPDK engines.
  if (e != "" && !dpdk_cannot_start().empty()) {
    GTEST_SKIP() << "DPDK cannot start here: " << dpdk_cannot_start();
  }
  EXPECT_EQ(e, "");
  EXPECT_EQ(child_rc, 0) << "the peer process failed (its reason is on stderr)";
  EXPECT_EQ(xhost_went_over_dpdk(), "");
}

// Daemon mode carries a message of at least this many bytes as several daemon messages
// (plugin/daemon_transport.h, "Pipelining": kChunkBytes); the sizes around it are its edges. In
// direct mode they are ordinary sizes: the same expectations hold.
constexpr size_t kChunk = size_t{4} << 20;

// The first index in [from, to) whose byte is not v, or `to`.
size_t first_not(const uint8_t* p, size_t from, size_t to, uint8_t v) {
  for (size_t k = from; k < to; ++k) {
    if (p[k] != v) return k;
  }
  return to;
}

// One end of a pair: the plugin instance it belongs to and its comm.
struct End {
  NetApi* api = nullptr;
  void* comm = nullptr;
};

// A request and the instance that tests it.
struct Pending {
  NetApi* api = nullptr;
  void* req = nullptr;
};

// Polls every request in turn, each through its own instance (as two proxy threads would), until
// all are done; sizes gets what each reported.
Error wait_each(const std::vector<Pending>& reqs, std::vector<int>* sizes) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::vector<bool> done(reqs.size(), false);
  sizes->assign(reqs.size(), -1);
  for (size_t left = reqs.size(); left > 0;) {
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (done[i]) continue;
      int d = 0, n = -1;
      if (ncclResult_t r = reqs[i].api->test(reqs[i].req, &d, &n); r != ncclSuccess) {
        return "test of request " + std::to_string(i) + " returned " +
               std::to_string(static_cast<int>(r));
      }
      if (d) {
        done[i] = true;
        (*sizes)[i] = n;
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) return "requests not done in 30 s";
  }
  return "";
}

// Both ends in this process: in one instance of the plugin, or, with two daemons
// (GW_PLUGIN_TEST_XHOST=1), the second end in a copy of the plugin on host b. pairs_[0] sends from
// the second instance to the first, pairs_[1] the other way.
class PluginChunkEdges : public ::testing::Test {
 protected:
  void SetUp() override {
    plugin();
    a_ = make_api("v11");
    ASSERT_EQ(a_->init(&actx_), ncclSuccess);
    b_ = a_.get();
    bctx_ = actx_;
    if (const char* peer = getenv("GW_PLUGIN_TEST_PEER_DAEMON"); peer != nullptr) {
      // Each instance opens its transport at its first listen, with the environment of then.
      open_transport(*a_, actx_);
      const char* d = getenv("GW_DAEMON");
      const char* h = getenv("GW_HOSTID");
      ASSERT_TRUE(d != nullptr && h != nullptr) << "two hosts without GW_DAEMON / GW_HOSTID";
      const std::string daemon = d, host = h;
      setenv("GW_DAEMON", peer, 1);
      setenv("GW_HOSTID", kXhostB, 1);
      copy_ = make_api_of_copy();
      const ncclResult_t r = copy_->init(&bctx_);
      if (r == ncclSuccess) open_transport(*copy_, bctx_);
      setenv("GW_DAEMON", daemon.c_str(), 1);
      setenv("GW_HOSTID", host.c_str(), 1);
      ASSERT_EQ(r, ncclSuccess);
      b_ = copy_.get();
    }
    for (int i = 0; i < 2; ++i) {
      NetApi& l = i == 0 ? *a_ : *b_;
      NetApi& c = i == 0 ? *b_ : *a_;
      void* sc = nullptr;
      void* rc = nullptr;
      const Error e = connect_pair(l, i == 0 ? actx_ : bctx_, c, i == 0 ? bctx_ : actx_, &sc, &rc);
      // Two hosts over dpdk: EAL refused here (the daemons start it at the first connection).
      if (e != "" && !dpdk_cannot_start().empty()) {
        GTEST_SKIP() << "DPDK cannot start here: " << dpdk_cannot_start();
      }
      ASSERT_EQ(e, "");
      pairs_[i] = {End{&c, sc}, End{&l, rc}};
    }
  }
  void TearDown() override {
    for (auto& [s, r] : pairs_) {
      if (s.comm != nullptr) {
        EXPECT_EQ(s.api->close_send(s.comm), ncclSuccess);
      }
      if (r.comm != nullptr) {
        EXPECT_EQ(r.api->close_recv(r.comm), ncclSuccess);
      }
    }
    if (copy_) {
      EXPECT_EQ(copy_->finalize(bctx_), ncclSuccess);
    }
    EXPECT_EQ(a_->finalize(actx_), ncclSuccess);
  }
  static void open_transport(NetApi& api, void* ctx) {
    uint8_t h[NCCL_NET_HANDLE_MAXSIZE] = {};
    void* lc = nullptr;
    ASSERT_EQ(api.listen(ctx, 0, h, &lc), ncclSuccess);
    EXPECT_EQ(api.close_listen(lc), ncclSuccess);
  }

  // One message per entry {size, receive buffer, tag}, all receives posted, then all sends, then
  // every request polled: each arrives whole (pattern checked), reports its size, in order per tag.
  struct Msg {
    size_t size = 0, cap = 0;
    int tag = 0;
  };
  void exchange(int dir, const std::vector<Msg>& msgs, uint32_t seed) {
    auto& [s, r] = pairs_[dir];
    std::vector<std::unique_ptr<Buffer>> out, in;
    std::vector<Pending> reqs;
    for (size_t i = 0; i < msgs.size(); ++i) {
      out.push_back(std::make_unique<Buffer>(msgs[i].size));
      in.push_back(std::make_unique<Buffer>(msgs[i].cap));
      fill_pattern(out[i]->data, msgs[i].size, seed + static_cast<uint32_t>(i));
      std::memset(in[i]->data, 0xEE, msgs[i].cap);
      void* req = nullptr;
      ASSERT_EQ(post_recv(*r.api, r.comm, in[i]->data, msgs[i].cap, msgs[i].tag, nullptr, &req),
                "");
      reqs.push_back({r.api, req});
    }
    for (size_t i = 0; i < msgs.size(); ++i) {
      void* req = nullptr;
      ASSERT_EQ(post_send(*s.api, s.comm, out[i]->data, msgs[i].size, msgs[i].tag, nullptr, &req),
                "");
      reqs.push_back({s.api, req});
    }
    std::vector<int> sizes;
    ASSERT_EQ(wait_each(reqs, &sizes), "");
    for (size_t i = 0; i < msgs.size(); ++i) {
      const size_t n = msgs[i].size;
      EXPECT_EQ(sizes[i], static_cast<int>(n)) << "receive " << i;
      EXPECT_EQ(sizes[msgs.size() + i], static_cast<int>(n)) << "send " << i;
      EXPECT_EQ(check_pattern(in[i]->data, n, seed + static_cast<uint32_t>(i)), -1)
          << "message " << i << " of " << n << " bytes";
      EXPECT_EQ(first_not(in[i]->data, n, msgs[i].cap, 0xEE), msgs[i].cap)
          << "message " << i << " wrote past its end";
    }
  }

  void truncate(size_t size, size_t cap);

  std::unique_ptr<NetApi> a_, copy_;
  NetApi* b_ = nullptr;
  void* actx_ = nullptr;
  void* bctx_ = nullptr;
  std::pair<End, End> pairs_[2];
};

TEST_F(PluginChunkEdges, SizesAroundTheChunkArriveWholeBothWays) {
  uint32_t seed = 1000;
  for (int dir = 0; dir < 2; ++dir) {
    // Also the edges of the first chunk's payload (kChunk less the 8 bytes of the size).
    for (size_t n : {kChunk - 1, kChunk, kChunk + 1, kChunk + 7, kChunk + 8, 2 * kChunk - 8,
                     2 * kChunk - 7, 2 * kChunk, 3 * kChunk + 17}) {
      SCOPED_TRACE(testing::Message() << "direction " << dir << ", " << n << " bytes");
      exchange(dir, {{n, n, 5}}, seed++);
    }
  }
}

TEST_F(PluginChunkEdges, SmallerMessagesIntoBiggerBuffersReportTheirSize) {
  uint32_t seed = 2000;
  for (int dir = 0; dir < 2; ++dir) {
    SCOPED_TRACE(testing::Message() << "direction " << dir);
    exchange(dir, {{2 * kChunk, 3 * kChunk + 5, 1}}, seed++);  // a multiple of the chunk
    exchange(dir, {{kChunk, 2 * kChunk, 1}}, seed++);
    exchange(dir, {{kChunk + 1, 4 * kChunk, 1}}, seed++);
    exchange(dir, {{0, 2 * kChunk, 1}}, seed++);  // 0 bytes into a chunked-size buffer
    exchange(dir, {{0, 0, 1}}, seed++);
    exchange(dir, {{kChunk - 1, kChunk, 1}}, seed++);
  }
}

TEST_F(PluginChunkEdges, SeveralMessagesInFlightKeepTheirOrderPerTag) {
  // Big and small, on one tag and on two, every receive and send posted before any is tested:
  // the receives of one tag take its messages in the order sent, whole.
  const std::vector<Msg> msgs = {
      {2 * kChunk + 3, 2 * kChunk + 3, 1}, {5, 64, 1},     {kChunk, 3 * kChunk, 2},
      {kChunk - 1, kChunk - 1, 1},         {0, kChunk, 2}, {3 * kChunk, 3 * kChunk, 2},
      {kChunk + 1, kChunk + 1, 1},         {4096, 4096, 3}};
  uint32_t seed = 3000;
  for (int round = 0; round < 2; ++round) {
    for (int dir = 0; dir < 2; ++dir) {
      SCOPED_TRACE(testing::Message() << "round " << round << ", direction " << dir);
      exchange(dir, msgs, seed);
      seed += 100;
    }
  }
}

// Posts a message of `size` bytes into a receive of `cap` (< size) on each pair: the receive must
// fail with direct mode's class (ncclInvalidUsage), never complete nor write past its buffer; the
// sender completes or fails, never hangs. The pairs are done after it.
void PluginChunkEdges::truncate(size_t size, size_t cap) {
  for (int dir = 0; dir < 2; ++dir) {
    SCOPED_TRACE(testing::Message() << "direction " << dir);
    auto& [s, r] = pairs_[dir];
    Buffer out(size), in(cap + 4096);
    fill_pattern(out.data, out.size, 77);
    std::memset(in.data, 0xEE, in.size);
    void *rreq = nullptr, *sreq = nullptr;
    ASSERT_EQ(post_recv(*r.api, r.comm, in.data, cap, 9, nullptr, &rreq), "");
    ASSERT_EQ(post_send(*s.api, s.comm, out.data, size, 9, nullptr, &sreq), "");
    // Polled as NCCL's progress thread would.
    int rdone = 0, sdone = 0, n = 0;
    ncclResult_t rr = ncclSuccess, sr = ncclSuccess;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (rr == ncclSuccess && !rdone && std::chrono::steady_clock::now() < until) {
      if (sr == ncclSuccess && !sdone) sr = s.api->test(sreq, &sdone, &n);
      rr = r.api->test(rreq, &rdone, &n);
    }
    EXPECT_EQ(rr, ncclInvalidUsage) << "a truncated receive must fail, not complete";
    EXPECT_EQ(rdone, 0);
    EXPECT_EQ(first_not(in.data, cap, in.size, 0xEE), in.size)
        << "the receive wrote past its buffer";
    while (sr == ncclSuccess && !sdone && std::chrono::steady_clock::now() < until) {
      sr = s.api->test(sreq, &sdone, &n);
    }
    EXPECT_TRUE(sdone || sr != ncclSuccess) << "the sender must end, completed or failed";
  }
}

TEST_F(PluginChunkEdges, OneByteOverTheChunkIntoAChunkFailsTheReceive) {
  truncate(kChunk + 1, kChunk);
}

TEST_F(PluginChunkEdges, ALongerMessageIntoSeveralChunksFailsTheReceive) {
  truncate(3 * kChunk + 1, 2 * kChunk);
}

}  // namespace
}  // namespace gw::plugin_test
