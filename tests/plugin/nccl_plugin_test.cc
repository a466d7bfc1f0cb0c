// The built libnccl-net-gradwire.so driven in one process the way NCCL's proxy drives it
// (no NCCL, no GPU, loopback only). Scenarios that need a fresh process (bad configuration,
// pinning) run the nccl_plugin_peer helper.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/plugin/plugin_harness.h"

namespace gw::plugin_test {
namespace {

constexpr size_t kTiB = size_t{1} << 40;

bool any_line(const std::string& needle, const char* level = nullptr) {
  for (const std::string& l : log_lines()) {
    if (l.find(needle) != std::string::npos && (level == nullptr || l.rfind(level, 0) == 0)) {
      return true;
    }
  }
  return false;
}

std::string all_lines() {
  std::string s;
  for (const std::string& l : log_lines()) s += l + "\n";
  return s;
}

class PluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    api_ = make_api("v11");
    ASSERT_EQ(api_->init(&ctx_), ncclSuccess) << all_lines();
    ASSERT_NE(ctx_, nullptr);
  }
  void TearDown() override {
    if (send_ != nullptr) {
      EXPECT_EQ(api_->close_send(send_), ncclSuccess);
    }
    if (recv_ != nullptr) {
      EXPECT_EQ(api_->close_recv(recv_), ncclSuccess);
    }
    EXPECT_EQ(api_->finalize(ctx_), ncclSuccess);
  }
  void connect() { ASSERT_EQ(connect_pair(*api_, ctx_, &send_, &recv_), ""); }

  // One message through the pair, content checked; returns the size test() reported.
  void transfer(size_t send_size, size_t recv_size, uint32_t seed, int* reported) {
    Buffer out(send_size), in(recv_size);
    fill_pattern(out.data, send_size, seed);
    std::memset(in.data, 0, recv_size);
    void *smh = nullptr, *rmh = nullptr;
    ASSERT_EQ(api_->reg_mr(send_, out.data, out.size, NCCL_PTR_HOST, &smh), ncclSuccess);
    ASSERT_EQ(api_->reg_mr(recv_, in.data, in.size, NCCL_PTR_HOST, &rmh), ncclSuccess);
    void *rreq = nullptr, *sreq = nullptr;
    ASSERT_EQ(post_recv(*api_, recv_, in.data, recv_size, 7, rmh, &rreq), "");
    ASSERT_EQ(post_send(*api_, send_, out.data, send_size, 7, smh, &sreq), "");
    std::vector<int> sizes;
    ASSERT_EQ(wait_all(*api_, {sreq, rreq}, &sizes), "");
    EXPECT_EQ(sizes[0], static_cast<int>(send_size));
    *reported = sizes[1];
    EXPECT_EQ(check_pattern(in.data, send_size, seed), -1) << "size " << send_size;
    EXPECT_EQ(api_->dereg_mr(send_, smh), ncclSuccess);
    EXPECT_EQ(api_->dereg_mr(recv_, rmh), ncclSuccess);
  }

  std::unique_ptr<NetApi> api_;
  void* ctx_ = nullptr;
  void* send_ = nullptr;
  void* recv_ = nullptr;
};

TEST(PluginLibrary, ExportsOnlyTheNetAndTunerTables) {
  std::string cmd = std::string("nm -D --defined-only ") + GW_PLUGIN_PATH + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::set<std::string> symbols;
  char line[512];
  while (fgets(line, sizeof(line), p) != nullptr) {
    std::string l(line);
    while (!l.empty() && (l.back() == '\n' || l.back() == ' ')) l.pop_back();
    symbols.insert(l.substr(l.rfind(' ') + 1));
  }
  int rc = pclose(p);
  if (rc != 0 && symbols.empty()) GTEST_SKIP() << "nm is not available";
  std::set<std::string> want = {"ncclNetPlugin_v12", "ncclNetPlugin_v11", "ncclNetPlugin_v10",
                                "ncclNetPlugin_v9",  "ncclNetPlugin_v8",  "ncclTunerPlugin_v5"};
  EXPECT_EQ(symbols, want);
}

TEST(PluginLibrary, TablesNameGradwireAndFillRequiredEntries) {
  const Loaded& l = plugin();
  ASSERT_NE(l.v11, nullptr);
  ASSERT_NE(l.v10, nullptr);
  ASSERT_NE(l.v9, nullptr);
  ASSERT_NE(l.v8, nullptr);
  for (const char* name : {l.v11->name, l.v10->name, l.v9->name, l.v8->name}) {
    EXPECT_STREQ(name, "gradwire");
  }
  EXPECT_NE(l.v11->finalize, nullptr);  // NCCL 2.28.9 calls it without a NULL check
  EXPECT_NE(l.v11->init, nullptr);
  EXPECT_NE(l.v11->iflush, nullptr);
  EXPECT_EQ(l.v11->getDeviceMr, nullptr);
  EXPECT_EQ(l.v11->irecvConsumed, nullptr);
  EXPECT_EQ(l.v11->makeVDevice, nullptr);
}

TEST(PluginLibrary, FinalizeAcceptsNullAndRejectsForeignContext) {
  const Loaded& l = plugin();
  EXPECT_EQ(l.v11->finalize(nullptr), ncclSuccess);
  std::array<uint64_t, 16> junk{};
  EXPECT_EQ(l.v11->finalize(junk.data()), ncclInternalError);
}

TEST(PluginLibrary, FirstInitLogsOneInfoLineWithTheChoice) {
  const Loaded& l = plugin();
  ASSERT_EQ(l.first_init, ncclSuccess);
  int count = 0;
  std::string all;
  for (const std::string& line : l.first_init_log) {
    all += line + "\n";
    if (line.rfind("INFO NET/gradwire: backend ", 0) == 0) {
      ++count;
      EXPECT_NE(line.find("backend tcp"), std::string::npos) << line;
      EXPECT_NE(line.find("device gw-tcp-lo"), std::string::npos) << line;
      EXPECT_NE(line.find("socket(s) per connection"), std::string::npos) << line;
      EXPECT_NE(line.find("I/O thread(s) per comm"), std::string::npos) << line;
      if (const char* t = getenv("GW_SOCKET_NTHREADS")) {  // the threaded ctest run
        EXPECT_NE(line.find(fmt::format("{} I/O thread(s) per comm (GW_SOCKET_NTHREADS={})", t, t)),
                  std::string::npos)
            << line;
      }
      EXPECT_NE(line.find("pointer support HOST"), std::string::npos) << line;
      EXPECT_NE(line.find("library pinned"), std::string::npos) << line;
    }
  }
  EXPECT_EQ(count, 1) << all;
  // Later inits (one per communicator in NCCL 2.28) do not repeat it.
  clear_log();
  void* ctx = nullptr;
  ncclNetCommConfig_v11_t cfg{NCCL_NET_TRAFFIC_CLASS_UNDEF};
  ASSERT_EQ(l.v11->init(&ctx, 2, &cfg, record_log, nullptr), ncclSuccess);
  EXPECT_FALSE(any_line("NET/gradwire: backend")) << all_lines();
  EXPECT_EQ(l.v11->finalize(ctx), ncclSuccess);
}

TEST_F(PluginTest, PropertiesReportRealValues) {
  int n = 0;
  ASSERT_EQ(api_->devices(&n), ncclSuccess);
  ASSERT_GE(n, 1);
  std::set<std::string> names;
  for (int d = 0; d < n; ++d) {
    ncclNetProperties_v11_t p{};
    ASSERT_EQ(api_->properties(d, &p), ncclSuccess);
    ASSERT_NE(p.name, nullptr);
    names.insert(p.name);
    EXPECT_EQ(std::string(p.name), "gw-tcp-lo");  // GW_SOCKET_IFNAME=lo in the test env
    EXPECT_EQ(p.pciPath, nullptr);                // lo has no PCI device
    EXPECT_EQ(p.speed, 10000);                    // lo has no speed: NCCL's 10 Gbps default
    EXPECT_NE(p.guid, 0u);
    EXPECT_EQ(p.ptrSupport, NCCL_PTR_HOST);
    EXPECT_GT(p.maxComms, 0);
    EXPECT_EQ(p.maxRecvs, 1);
    EXPECT_EQ(p.netDeviceType, NCCL_NET_DEVICE_HOST);
    EXPECT_EQ(p.netDeviceVersion, 0);
    EXPECT_EQ(p.vProps.ndevs, 1);
    EXPECT_EQ(p.vProps.devs[0], d);
    EXPECT_GT(p.maxP2pBytes, 0u);
    EXPECT_LE(p.maxP2pBytes, kTiB);
    EXPECT_GT(p.maxCollBytes, 0u);
    EXPECT_LE(p.maxCollBytes, kTiB);
    EXPECT_EQ(p.maxMultiRequestSize, 1);
    EXPECT_GE(p.latency, 0.0f);
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(n)) << "device names must be unique";
}

TEST_F(PluginTest, BadDeviceIsAnInternalErrorWithAWarning) {
  clear_log();
  ncclNetProperties_v11_t p{};
  EXPECT_EQ(api_->properties(99, &p), ncclInternalError);
  EXPECT_TRUE(any_line("getProperties failed", "WARN")) << all_lines();
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc = reinterpret_cast<void*>(0x5);
  EXPECT_EQ(api_->listen(ctx_, -1, handle, &lc), ncclInternalError);
  EXPECT_EQ(lc, nullptr);
}

TEST_F(PluginTest, ConnectAndAcceptAlternatelyFromOneThread) {
  connect();
  int reported = -1;
  transfer(4096, 4096, 1, &reported);
  EXPECT_EQ(reported, 4096);
}

TEST_F(PluginTest, SizesFromZeroTo64MiBArriveIntact) {
  connect();
  const size_t sizes[] = {0, 1, 7, 4096, 65539, 1 << 20, (4 << 20) + 1, 64 << 20};
  uint32_t seed = 10;
  for (size_t s : sizes) {
    int reported = -1;
    transfer(s, s, seed++, &reported);
    EXPECT_EQ(reported, static_cast<int>(s));
  }
}

TEST_F(PluginTest, ReceiveLargerThanSendReportsSentSize) {
  connect();
  int reported = -1;
  transfer(1000, 1 << 20, 3, &reported);
  EXPECT_EQ(reported, 1000);
  transfer(0, 4096, 4, &reported);
  EXPECT_EQ(reported, 0);
}

TEST_F(PluginTest, SendLargerThanReceiveFailsClearly) {
  connect();
  Buffer out(8192), in(100);
  fill_pattern(out.data, out.size, 5);
  void *rreq = nullptr, *sreq = nullptr;
  ASSERT_EQ(post_recv(*api_, recv_, in.data, 100, 1, nullptr, &rreq), "");
  ASSERT_EQ(post_send(*api_, send_, out.data, 8192, 1, nullptr, &sreq), "");
  clear_log();
  // Poll both sides as NCCL's progress thread would; the receive must fail, never complete.
  int rdone = 0, sdone = 0, size = 0;
  ncclResult_t r = ncclSuccess, s = ncclSuccess;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (r == ncclSuccess && !rdone && std::chrono::steady_clock::now() < deadline) {
    if (s == ncclSuccess && !sdone) s = api_->test(sreq, &sdone, &size);
    r = api_->test(rreq, &rdone, &size);
  }
  EXPECT_EQ(r, ncclInvalidUsage) << "a truncated receive must fail, not complete";
  EXPECT_EQ(rdone, 0);
  EXPECT_TRUE(any_line("truncated", "WARN")) << all_lines();
  // The send may still be in flight (an I/O thread writing from `out`): the comms close before
  // the buffers go (ASan saw a worker's sendmsg read `out` after it was freed, in TearDown's time).
  EXPECT_EQ(api_->close_send(send_), ncclSuccess);
  EXPECT_EQ(api_->close_recv(recv_), ncclSuccess);
  send_ = recv_ = nullptr;
}

TEST_F(PluginTest, ThirtyTwoRegisteredBuffersInFlight) {
  connect();
  constexpr int kN = NCCL_NET_MAX_REQUESTS;
  constexpr size_t kSize = 256 * 1024;
  std::vector<std::unique_ptr<Buffer>> out, in;
  std::vector<void*> smh(kN), rmh(kN), sreq(kN), rreq(kN);
  for (int i = 0; i < kN; ++i) {
    out.push_back(std::make_unique<Buffer>(kSize));
    in.push_back(std::make_unique<Buffer>(kSize));
    fill_pattern(out[i]->data, kSize, 100 + i);
    ASSERT_EQ(api_->reg_mr(send_, out[i]->data, kSize, NCCL_PTR_HOST, &smh[i]), ncclSuccess);
    ASSERT_EQ(api_->reg_mr(recv_, in[i]->data, kSize, NCCL_PTR_HOST, &rmh[i]), ncclSuccess);
  }
  // All 32 receives and all 32 sends are posted before anything is tested.
  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ(post_recv(*api_, recv_, in[i]->data, kSize, 2, rmh[i], &rreq[i]), "") << i;
  }
  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ(post_send(*api_, send_, out[i]->data, kSize, 2, smh[i], &sreq[i]), "") << i;
  }
  // A 33rd request on either comm has no slot: NULL, not an error.
  void* extra = reinterpret_cast<void*>(0x5);
  EXPECT_EQ(api_->isend(send_, out[0]->data, kSize, 2, smh[0], &extra), ncclSuccess);
  EXPECT_EQ(extra, nullptr);
  std::vector<void*> all = sreq;
  all.insert(all.end(), rreq.begin(), rreq.end());
  std::vector<int> sizes;
  ASSERT_EQ(wait_all(*api_, all, &sizes), "");
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(sizes[kN + i], static_cast<int>(kSize));
    EXPECT_EQ(check_pattern(in[i]->data, kSize, 100 + i), -1) << "buffer " << i;  // FIFO order
  }
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(api_->dereg_mr(send_, smh[i]), ncclSuccess);
    EXPECT_EQ(api_->dereg_mr(recv_, rmh[i]), ncclSuccess);
  }
}

TEST_F(PluginTest, CloseWithRequestsInFlightReturnsPromptly) {
  connect();
  Buffer in(1 << 20), out(8 << 20);
  fill_pattern(out.data, out.size, 9);
  void* mh = nullptr;
  ASSERT_EQ(api_->reg_mr(recv_, in.data, in.size, NCCL_PTR_HOST, &mh), ncclSuccess);
  void* req = nullptr;
  for (int i = 0; i < 4; ++i) ASSERT_EQ(post_recv(*api_, recv_, in.data, in.size, 0, mh, &req), "");
  ASSERT_EQ(post_send(*api_, send_, out.data, out.size, 0, nullptr, &req), "");
  auto start = std::chrono::steady_clock::now();
  // mh is still registered: closing must release it too.
  EXPECT_EQ(api_->close_send(send_), ncclSuccess);
  EXPECT_EQ(api_->close_recv(recv_), ncclSuccess);
  send_ = recv_ = nullptr;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST_F(PluginTest, MisuseIsAnInternalErrorAndRequestIsAlwaysWritten) {
  connect();
  Buffer buf(4096);
  void* req = reinterpret_cast<void*>(0x5);
  std::array<uint64_t, 32> junk{};
  EXPECT_EQ(api_->isend(nullptr, buf.data, 10, 0, nullptr, &req), ncclInternalError);
  EXPECT_EQ(req, nullptr);
  req = reinterpret_cast<void*>(0x5);
  EXPECT_EQ(api_->isend(junk.data(), buf.data, 10, 0, nullptr, &req), ncclInternalError);
  EXPECT_EQ(req, nullptr);
  req = reinterpret_cast<void*>(0x5);
  EXPECT_EQ(api_->isend(recv_, buf.data, 10, 0, nullptr, &req), ncclInternalError);  // wrong kind
  EXPECT_EQ(req, nullptr);
  req = reinterpret_cast<void*>(0x5);
  EXPECT_EQ(api_->irecv(send_, buf.data, 10, 0, nullptr, &req), ncclInternalError);
  EXPECT_EQ(req, nullptr);
  int done = 0, size = 0;
  EXPECT_EQ(api_->test(nullptr, &done, &size), ncclInternalError);
  EXPECT_EQ(api_->test(reinterpret_cast<void*>(NCCL_NET_OPTIONAL_RECV_COMPLETION), &done, &size),
            ncclInternalError);
  EXPECT_EQ(api_->test(junk.data(), &done, &size), ncclInternalError);
  void* mh = nullptr;
  EXPECT_EQ(api_->reg_mr(send_, buf.data, 4096, NCCL_PTR_CUDA, &mh), ncclInternalError);
  // A buffer outside its registration.
  ASSERT_EQ(api_->reg_mr(send_, buf.data, 1024, NCCL_PTR_HOST, &mh), ncclSuccess);
  req = reinterpret_cast<void*>(0x5);
  EXPECT_EQ(api_->isend(send_, buf.data + 512, 1024, 0, mh, &req), ncclInternalError);
  EXPECT_EQ(req, nullptr);
  EXPECT_EQ(api_->dereg_mr(recv_, mh), ncclInternalError);  // registered on the other comm
  EXPECT_EQ(api_->dereg_mr(send_, mh), ncclSuccess);
  EXPECT_EQ(api_->close_listen(junk.data()), ncclInternalError);
  // Grouped receives are not offered (maxRecvs=1).
  void* data[2] = {buf.data, buf.data};
  size_t sizes[2] = {10, 10};
  int tags[2] = {0, 0};
  void* mhs[2] = {nullptr, nullptr};
  req = reinterpret_cast<void*>(0x5);
  EXPECT_EQ(plugin().v11->irecv(recv_, 2, data, sizes, tags, mhs, mhs, &req), ncclInternalError);
  EXPECT_EQ(req, nullptr);
  // iflush: host memory needs none, the request stays NULL.
  int isizes[1] = {10};
  req = reinterpret_cast<void*>(0x5);
  EXPECT_EQ(plugin().v11->iflush(recv_, 1, data, isizes, mhs, &req), ncclSuccess);
  EXPECT_EQ(req, nullptr);
}

TEST_F(PluginTest, ConnectToAHandleNobodyListensOnFailsWithinTheDeadline) {
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc = nullptr;
  ASSERT_EQ(api_->listen(ctx_, 0, handle, &lc), ncclSuccess);
  ASSERT_EQ(api_->close_listen(lc), ncclSuccess);  // the address is now dead
  clear_log();
  void* sc = nullptr;
  ncclResult_t r = ncclSuccess;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (r == ncclSuccess && sc == nullptr && std::chrono::steady_clock::now() < deadline) {
    r = api_->connect(ctx_, 0, handle, &sc);
  }
  if (sc != nullptr) api_->close_send(sc);
  EXPECT_EQ(r, ncclSystemError);
  EXPECT_TRUE(any_line("connect failed", "WARN")) << all_lines();
}

TEST_F(PluginTest, TwoConnectionsSharingOneContextStayApart) {
  connect();
  void *send2 = nullptr, *recv2 = nullptr;
  ASSERT_EQ(connect_pair(*api_, ctx_, &send2, &recv2), "");
  Buffer a(1000), b(2000), ra(1000), rb(2000);
  fill_pattern(a.data, a.size, 21);
  fill_pattern(b.data, b.size, 22);
  void *r1, *r2, *s1, *s2;
  ASSERT_EQ(post_recv(*api_, recv2, rb.data, rb.size, 0, nullptr, &r2), "");
  ASSERT_EQ(post_recv(*api_, recv_, ra.data, ra.size, 0, nullptr, &r1), "");
  ASSERT_EQ(post_send(*api_, send2, b.data, b.size, 0, nullptr, &s2), "");
  ASSERT_EQ(post_send(*api_, send_, a.data, a.size, 0, nullptr, &s1), "");
  std::vector<int> sizes;
  ASSERT_EQ(wait_all(*api_, {s1, s2, r1, r2}, &sizes), "");
  EXPECT_EQ(sizes[2], 1000);
  EXPECT_EQ(sizes[3], 2000);
  EXPECT_EQ(check_pattern(ra.data, ra.size, 21), -1);
  EXPECT_EQ(check_pattern(rb.data, rb.size, 22), -1);
  EXPECT_EQ(api_->close_send(send2), ncclSuccess);
  EXPECT_EQ(api_->close_recv(recv2), ncclSuccess);
}

// Several communicators' proxy threads call the plugin at once, and a "service thread" registers
// memory on a comm while its "progress thread" sends on it.
TEST_F(PluginTest, ConcurrentCommsAndRegistrationRacingTheDataPath) {
  constexpr int kThreads = 4;
  constexpr int kMessages = 40;
  constexpr size_t kSize = 96 * 1024;
  std::vector<std::string> errors(kThreads);
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  std::vector<void*> sends(kThreads), recvs(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(connect_pair(*api_, ctx_, &sends[t], &recvs[t]), "");
  }
  std::thread registrar([&] {
    Buffer scratch(1 << 16);
    while (!stop.load()) {
      for (int t = 0; t < kThreads; ++t) {
        void* mh = nullptr;
        if (api_->reg_mr(sends[t], scratch.data, scratch.size, NCCL_PTR_HOST, &mh) != ncclSuccess ||
            api_->dereg_mr(sends[t], mh) != ncclSuccess) {
          errors[t] = "regMr/deregMr racing the data path failed";
        }
      }
      std::this_thread::yield();
    }
  });
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Buffer out(kSize), in(kSize);
      for (int m = 0; m < kMessages && errors[t].empty(); ++m) {
        uint32_t seed = 1000 * t + m;
        fill_pattern(out.data, kSize, seed);
        void *sreq = nullptr, *rreq = nullptr;
        Error e = post_recv(*api_, recvs[t], in.data, kSize, t, nullptr, &rreq);
        if (e.empty()) e = post_send(*api_, sends[t], out.data, kSize, t, nullptr, &sreq);
        if (e.empty()) e = wait_all(*api_, {sreq, rreq});
        if (e.empty() && check_pattern(in.data, kSize, seed) >= 0) e = "corrupt message";
        if (!e.empty()) errors[t] = e;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  stop.store(true);
  registrar.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(errors[t], "") << "connection " << t;
    EXPECT_EQ(api_->close_send(sends[t]), ncclSuccess);
    EXPECT_EQ(api_->close_recv(recvs[t]), ncclSuccess);
  }
}

// connect is called again with the same buffer until it yields a comm; a buffer reused for a
// different handle must start a new connection, not finish the old one.
TEST_F(PluginTest, ConnectStateFollowsTheHandleContents) {
  uint8_t h1[NCCL_NET_HANDLE_MAXSIZE] = {}, h2[NCCL_NET_HANDLE_MAXSIZE] = {};
  void *l1 = nullptr, *l2 = nullptr;
  ASSERT_EQ(api_->listen(ctx_, 0, h1, &l1), ncclSuccess);
  ASSERT_EQ(api_->listen(ctx_, 0, h2, &l2), ncclSuccess);
  uint8_t buf[NCCL_NET_HANDLE_MAXSIZE];
  std::memcpy(buf, h1, sizeof(buf));
  void* sc = nullptr;
  ASSERT_EQ(api_->connect(ctx_, 0, buf, &sc), ncclSuccess);  // starts towards l1
  if (sc != nullptr) api_->close_send(sc);
  std::memcpy(buf, h2, sizeof(buf));  // same buffer, now l2's handle
  sc = nullptr;
  void* rc = nullptr;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((sc == nullptr || rc == nullptr) && std::chrono::steady_clock::now() < deadline) {
    if (sc == nullptr) {
      ASSERT_EQ(api_->connect(ctx_, 0, buf, &sc), ncclSuccess);
    }
    if (rc == nullptr) {
      ASSERT_EQ(api_->accept(l2, &rc), ncclSuccess);
    }
  }
  ASSERT_NE(sc, nullptr);
  ASSERT_NE(rc, nullptr) << "the comm from the reused buffer must reach the second listener";
  send_ = sc;
  recv_ = rc;
  int reported = -1;
  transfer(5000, 5000, 31, &reported);
  EXPECT_EQ(reported, 5000);
  EXPECT_EQ(api_->close_listen(l1), ncclSuccess);
  EXPECT_EQ(api_->close_listen(l2), ncclSuccess);
}

// Every exported table, through its own function pointers.
class EveryVersion : public ::testing::TestWithParam<const char*> {};

TEST_P(EveryVersion, FullLifecycle) {
  auto api = make_api(GetParam());
  EXPECT_STREQ(api->name(), "gradwire");
  void* ctx = nullptr;
  ASSERT_EQ(api->init(&ctx), ncclSuccess) << all_lines();
  int n = 0;
  ASSERT_EQ(api->devices(&n), ncclSuccess);
  ASSERT_GE(n, 1);
  ncclNetProperties_v11_t p{};
  ASSERT_EQ(api->properties(0, &p), ncclSuccess);
  EXPECT_STREQ(p.name, "gw-tcp-lo");
  EXPECT_EQ(p.ptrSupport, NCCL_PTR_HOST);
  EXPECT_EQ(p.maxRecvs, 1);
  EXPECT_EQ(p.speed, 10000);
  void *sc = nullptr, *rc = nullptr;
  ASSERT_EQ(connect_pair(*api, ctx, &sc, &rc), "");
  for (size_t size : {size_t{0}, size_t{333}, size_t{3} << 20}) {
    Buffer out(size), in(size + 64);
    fill_pattern(out.data, size, 77);
    void *smh = nullptr, *rmh = nullptr, *sreq = nullptr, *rreq = nullptr;
    ASSERT_EQ(api->reg_mr(sc, out.data, out.size, NCCL_PTR_HOST, &smh), ncclSuccess);
    ASSERT_EQ(api->reg_mr(rc, in.data, in.size, NCCL_PTR_HOST, &rmh), ncclSuccess);
    ASSERT_EQ(post_recv(*api, rc, in.data, in.size, 5, rmh, &rreq), "");
    ASSERT_EQ(post_send(*api, sc, out.data, size, 5, smh, &sreq), "");
    std::vector<int> sizes;
    ASSERT_EQ(wait_all(*api, {sreq, rreq}, &sizes), "");
    EXPECT_EQ(sizes[1], static_cast<int>(size));
    EXPECT_EQ(check_pattern(in.data, size, 77), -1);
    EXPECT_EQ(api->dereg_mr(sc, smh), ncclSuccess);
    EXPECT_EQ(api->dereg_mr(rc, rmh), ncclSuccess);
  }
  EXPECT_EQ(api->close_send(sc), ncclSuccess);
  EXPECT_EQ(api->close_recv(rc), ncclSuccess);
  EXPECT_EQ(api->finalize(ctx), ncclSuccess);
}

INSTANTIATE_TEST_SUITE_P(Tables, EveryVersion, ::testing::Values("v8", "v9", "v10", "v11", "v12"));

// ---- fresh-process scenarios ---------------------------------------------------------------

TEST(PluginFreshProcess, UnknownBackendIsInvalidUsage) {
  EXPECT_EQ(run_peer({"GW_PLUGIN_BACKEND=carrier-pigeon"}, {"init", "5", "GW_PLUGIN_BACKEND"}), 0);
}

#ifdef GW_TEST_VERBS_BUILT
// verbs is registered: auto picks it across hosts when it is usable (here on the emulator), and
// tcp when it is not (no RDMA device here); both can be asked for by name.
TEST(PluginFreshProcess, AutoPicksVerbsWhenUsable) {
  EXPECT_EQ(run_peer({"GW_VERBS_EMULATE=1", "-GW_PLUGIN_BACKEND"},
                     {"info", "backend verbs, device gw-verbs-"}),
            0);
  EXPECT_EQ(run_peer({"GW_VERBS_EMULATE=1", "GW_PLUGIN_BACKEND=verbs"}, {"info", "backend verbs"}),
            0);
  EXPECT_EQ(run_peer({"GW_VERBS_EMULATE=1", "GW_PLUGIN_BACKEND=tcp"}, {"info", "backend tcp"}), 0);
}

// GPUDirect RDMA through the plugin: with a CUDA driver (the stand-in) and a NIC that takes
// dma-bufs (the emulator's), verbs reports NCCL_PTR_CUDA|NCCL_PTR_DMABUF and both registration
// calls work; tcp keeps NCCL_PTR_HOST (NCCL stages GPU memory).
TEST(PluginFreshProcess, VerbsReportsAndRegistersDeviceMemoryWithGpuDirect) {
  EXPECT_EQ(run_peer({"GW_VERBS_EMULATE=1", "GW_PLUGIN_BACKEND=verbs"}, {"gdr", GW_FAKE_CUDA_PATH}),
            0);
  EXPECT_NE(run_peer({"GW_VERBS_EMULATE=1", "GW_PLUGIN_BACKEND=tcp"}, {"gdr", GW_FAKE_CUDA_PATH}),
            0);
}
#endif

TEST(PluginFreshProcess, MalformedKnobIsInvalidUsage) {
  EXPECT_EQ(run_peer({"GW_SOCKET_NSOCKS=lots"}, {"init", "5", "GW_SOCKET_NSOCKS"}), 0);
}

TEST(PluginFreshProcess, MissingInterfaceIsInvalidUsage) {
  EXPECT_EQ(run_peer({"-GW_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME==gwnosuchif0"},
                     {"init", "5", "gwnosuchif0"}),
            0);
}

// The thread policy: without GW_ or NCCL knobs, hosts with 8+ CPUs get one I/O thread per comm
// and smaller ones keep I/O on NCCL's proxy thread.
TEST(PluginFreshProcess, AutoThreadPolicyFollowsTheCpuCount) {
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  const std::string want =
      cpus >= 8 ? fmt::format("1 I/O thread(s) per comm (auto: {} online CPUs)", cpus)
                : fmt::format(
                      "0 I/O thread(s) per comm (progress on NCCL's proxy thread; auto: "
                      "{} online CPUs)",
                      cpus);
  EXPECT_EQ(run_peer({"-GW_SOCKET_NTHREADS", "-NCCL_SOCKET_NTHREADS", "-NCCL_NSOCKS_PERTHREAD"},
                     {"info", want}),
            0);
}

// NCCL's Socket knobs are honoured when the GW_ ones are unset: nsocks = threads x per thread.
TEST(PluginFreshProcess, NcclSocketKnobsApplyWhenGwKnobsAreUnset) {
  EXPECT_EQ(run_peer({"-GW_SOCKET_NSOCKS", "-GW_SOCKET_NTHREADS", "NCCL_SOCKET_NTHREADS=4",
                      "NCCL_NSOCKS_PERTHREAD=2"},
                     {"info",
                      "8 socket(s) per connection, 4 I/O thread(s) per comm "
                      "(NCCL_SOCKET_NTHREADS=4, 8 socket(s) from"}),
            0);
  // The GW_ knobs win over NCCL's.
  EXPECT_EQ(run_peer({"GW_SOCKET_NSOCKS=3", "GW_SOCKET_NTHREADS=1", "NCCL_SOCKET_NTHREADS=4",
                      "NCCL_NSOCKS_PERTHREAD=4"},
                     {"info",
                      "3 socket(s) per connection, 1 I/O thread(s) per comm "
                      "(GW_SOCKET_NTHREADS=1)"}),
            0);
  EXPECT_EQ(run_peer({"NCCL_SOCKET_NTHREADS=lots"}, {"init", "5", "NCCL_SOCKET_NTHREADS"}), 0);
}

// `extra` after unsetting every channel setting a test of the channel request may inherit.
std::vector<std::string> with_channel_env_cleared(std::vector<std::string> extra) {
  const std::vector<std::string> clean = {"-NCCL_MIN_NCHANNELS", "-NCCL_MAX_NCHANNELS",
                                          "-GW_PLUGIN_MIN_CHANNELS"};
  extra.insert(extra.begin(), clean.begin(), clean.end());
  return extra;
}

// The channel settings the plugin and its tuner see, with what the plugin asks NCCL for
// (NCCL_MIN_NCHANNELS; "-": nothing) and what its tuner then asks for (nullptr: not checked).
struct ChannelCase {
  std::vector<std::string> env;
  const char* channels;
  const char* tuner;
};
const ChannelCase kChannelCases[] = {
    {{"GW_SOCKET_NTHREADS=1"}, "4", "4"},
    {{"GW_SOCKET_NTHREADS=-1"}, "-", nullptr},  // no I/O threads
    {{"GW_SOCKET_NTHREADS=1", "GW_PLUGIN_MIN_CHANNELS=-1"}, "-", "0"},
    {{"GW_SOCKET_NTHREADS=-1", "GW_PLUGIN_MIN_CHANNELS=6"}, "6", "6"},
    {{"GW_SOCKET_NTHREADS=1", "NCCL_MIN_NCHANNELS=2"}, "2", "0"},
    {{"GW_SOCKET_NTHREADS=1", "NCCL_MAX_NCHANNELS=2"}, "-", "0"},
};

std::string joined(const std::vector<std::string>& env) {
  std::string out;
  for (const auto& e : env) out += e + " ";
  return out;
}

// The plugin asks NCCL for 4 channels (NCCL_MIN_NCHANNELS) when its tcp comms have I/O threads,
// never overrides the user's NCCL_MIN_NCHANNELS or a lower NCCL_MAX_NCHANNELS, and refuses an
// out-of-range GW_PLUGIN_MIN_CHANNELS.
TEST(PluginFreshProcess, AsksNcclForChannelsOnlyWhenTheUserHasNot) {
  for (const ChannelCase& c : kChannelCases) {
    EXPECT_EQ(run_peer(with_channel_env_cleared(c.env), {"channels", c.channels}), 0)
        << joined(c.env);
  }
  EXPECT_EQ(run_peer(with_channel_env_cleared({"GW_PLUGIN_MIN_CHANNELS=33"}),
                     {"init", "5", "GW_PLUGIN_MIN_CHANNELS"}),
            0);
}

// The tuner asks for the channels the plugin set NCCL_MIN_NCHANNELS to, for network collectives
// of communicators the plugin serves, and for none when the plugin set none (a user's settings).
TEST(PluginFreshProcess, TunerAsksForThePluginsChannelsOnly) {
  for (const ChannelCase& c : kChannelCases) {
    if (c.tuner == nullptr) continue;
    EXPECT_EQ(run_peer(with_channel_env_cleared(c.env), {"tuner", c.tuner}), 0) << joined(c.env);
  }
}

TEST(PluginFreshProcess, LibraryStaysLoadedAfterDlclose) {
  EXPECT_EQ(run_peer({"GW_PLUGIN_PIN=1"}, {"pin", "1"}), 0);
  // Unpinned, the library really unloads (so the check above can fail). The process-wide plugin
  // state is deliberately never freed (NCCL may call in from exit paths), which LeakSanitizer
  // reports once its module is gone: leak checking is off for this one run.
  EXPECT_EQ(run_peer({"GW_PLUGIN_PIN=0", "ASAN_OPTIONS=detect_leaks=0"}, {"pin", "0"}), 0);
}

}  // namespace
}  // namespace gw::plugin_test
