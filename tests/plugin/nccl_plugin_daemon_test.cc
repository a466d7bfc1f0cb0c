// Daemon mode of the plugin (GW_DAEMON; plugin/daemon_transport.h) across processes, with a
// gradwired this test starts (plugin_harness: GW_PLUGIN_TEST_GRADWIRED): a process of another job
// cannot connect to this job's endpoint, a rank killed mid-transfer fails its peer's request and
// not the other connections, a killed daemon fails every call promptly; and the figures, daemon
// mode against direct mode (tcp over lo), printed with the machine's ceilings (memcpy, loopback
// TCP) measured in the same run. The whole conformance suite runs in daemon mode as the ctest
// variants nccl_plugin_test.daemon and nccl_plugin_twoproc_test.daemon.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "daemon/client.h"
#include "tests/plugin/plugin_harness.h"
#include "tests/support/free_port.h"

namespace gw::plugin_test {
namespace {

using Clock = std::chrono::steady_clock;

// What `gradwirectl ARGS` printed for the daemon at `daemon` (unix:PATH; GW_DAEMON when null),
// "" when it cannot be run.
std::string gradwirectl(const std::string& args, const char* daemon = nullptr) {
  const char* d = daemon != nullptr ? daemon : getenv("GW_DAEMON");
  if (d == nullptr || std::strncmp(d, "unix:", 5) != 0) return "";
  const std::string cmd =
      std::string(GW_GRADWIRECTL_PATH) + " --socket " + (d + 5) + " " + args + " 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return "";
  std::string out;
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof(buf), f)) out.append(buf, n);
  pclose(f);
  return out;
}

// A count of `gradwirectl status --json` of the daemon at GW_DAEMON ("clients", "jobs",
// "arenas"); -1 when it cannot be read.
int daemon_count(const std::string& key) {
  const std::string out = gradwirectl("--json status");
  const size_t at = out.find("\"" + key + "\": ");
  return at == std::string::npos ? -1 : std::atoi(out.c_str() + at + key.size() + 4);
}

class DaemonPlugin : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("GW_PLUGIN_TEST_GRADWIRED", GW_GRADWIRED_PATH, 0);
    ASSERT_EQ(plugin().first_init, ncclSuccess);
    ASSERT_NE(getenv("GW_DAEMON"), nullptr);
    api_ = make_api("v11");
    ASSERT_EQ(api_->init(&ctx_), ncclSuccess);
    if (const std::string why = dpdk_unavailable(); !why.empty()) {
      GTEST_SKIP() << "DPDK cannot start here: " << why;
    }
  }
  void TearDown() override {
    if (api_) api_->finalize(ctx_);
  }
  // Calls accept on `lc` from a thread until a comm, an error or `stop`.
  struct Acceptor {
    std::atomic<bool> stop{false};
    std::atomic<void*> comm{nullptr};
    std::atomic<int> result{ncclSuccess};
    std::thread thread;
    void start(NetApi* api, void* lc) {
      thread = std::thread([this, api, lc] {
        const auto deadline = Clock::now() + std::chrono::seconds(40);
        while (!stop.load() && Clock::now() < deadline) {
          void* rc = nullptr;
          ncclResult_t r = api->accept(lc, &rc);
          if (r != ncclSuccess) {
            result = r;
            return;
          }
          if (rc != nullptr) {
            comm = rc;
            return;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      });
    }
    // The accepted comm, waited for up to 20 s (nullptr: none, or accept failed).
    void* wait_comm() {
      const auto until = Clock::now() + std::chrono::seconds(20);
      while (comm.load() == nullptr && result.load() == ncclSuccess && Clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      return comm.load();
    }
    void join() {
      stop = true;
      if (thread.joinable()) thread.join();
    }
    ~Acceptor() { join(); }
  };
  // Two hosts over dpdk (GW_PLUGIN_TEST_XHOST_TRANSPORT=dpdk), found out once per process: one
  // connection across the hosts, after which the daemons have started their ports (each at its
  // first job); their rte_eal_init failure when EAL cannot start here, else "".
  std::string dpdk_unavailable() {
    static const std::string why = [this]() -> std::string {
      if (xhost_transport() != "dpdk") return "";
      uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
      void* lc = nullptr;
      if (api_->listen(ctx_, 0, handle, &lc) != ncclSuccess) return "";
      Acceptor acc;
      acc.start(api_.get(), lc);
      const int rc = run_peer({}, {"connect", handle_hex(handle), "send"});
      if (rc == 0) {
        acc.thread.join();  // until its comm (up to 40 s)
      } else {
        acc.join();
      }
      bool received = false;
      if (void* comm = acc.comm.load(); comm != nullptr) {
        Buffer in(8192);
        void* req = nullptr;
        std::vector<int> sizes;
        received = post_recv(*api_, comm, in.data, in.size, 3, nullptr, &req).empty() &&
                   wait_all(*api_, {req}, &sizes).empty() && sizes[0] == 4096 &&
                   check_pattern(in.data, 4096, 77) == -1;
        api_->close_recv(comm);
      }
      api_->close_listen(lc);
      std::printf("over dpdk: a first connection across the hosts %s\n",
                  received ? "carried its 4096 bytes" : "failed");
      return dpdk_cannot_start();
    }();
    return why;
  }
  std::unique_ptr<NetApi> api_;
  void* ctx_ = nullptr;
};

TEST_F(DaemonPlugin, AProcessOfAnotherJobCannotConnect) {
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc = nullptr;
  ASSERT_EQ(api_->listen(ctx_, 0, handle, &lc), ncclSuccess);
  Acceptor acc;
  acc.start(api_.get(), lc);
  // Another job's token: its connect fails (no hang) and the listener accepts nothing.
  EXPECT_EQ(run_peer({"GW_JOB_TOKEN=another-job", "GW_TIMEOUT_MS=2000"},
                     {"connect", handle_hex(handle), "fail"}),
            0);
  EXPECT_EQ(acc.comm.load(), nullptr) << "a process of another job reached the listener";
  // The same job's process connects to the same endpoint and its message arrives.
  ASSERT_EQ(run_peer({}, {"connect", handle_hex(handle), "send"}), 0);
  acc.thread.join();
  void* rc = acc.comm.load();
  ASSERT_NE(rc, nullptr) << "accept returned " << acc.result.load();
  Buffer in(8192);
  void* req = nullptr;
  ASSERT_EQ(post_recv(*api_, rc, in.data, in.size, 3, nullptr, &req), "");
  std::vector<int> sizes;
  ASSERT_EQ(wait_all(*api_, {req}, &sizes), "");
  EXPECT_EQ(sizes[0], 4096);
  EXPECT_EQ(check_pattern(in.data, 4096, 77), -1);
  // gradwirectl jobs: the connection under its NCCL job, with the bytes it carried.
  const std::string jobs = gradwirectl("jobs");
  EXPECT_NE(jobs.find("NCCL JOB"), std::string::npos) << jobs;
  EXPECT_NE(gradwirectl("--json jobs").find("\"nccl_bytes\": 4096"), std::string::npos) << jobs;
  std::printf("%s", jobs.c_str());
  if (getenv("GW_PLUGIN_TEST_PEER_DAEMON") != nullptr) {
    // Two hosts: the connection is a job of both daemons, over the transport they agreed (tcp,
    // or the one GW_PLUGIN_TEST_XHOST_TRANSPORT names: verbs under the emulator, dpdk over the
    // daemons' memif pair).
    const std::string want = xhost_transport();
    const std::string json = gradwirectl("--json jobs");
    EXPECT_NE(json.find("\"hosts\": 2"), std::string::npos) << json;
    EXPECT_NE(json.find("\"transport\": \"" + want + "\""), std::string::npos) << json;
    EXPECT_EQ(xhost_went_over_dpdk(), "");
  }
  EXPECT_EQ(api_->close_recv(rc), ncclSuccess);
  EXPECT_EQ(api_->close_listen(lc), ncclSuccess);
}

// Whether a WARN the plugin logged since clear_log() contains `text` (printing them all if not).
bool warned(const std::string& text) {
  for (const std::string& line : log_lines()) {
    if (line.rfind("WARN", 0) == 0 && line.find(text) != std::string::npos) return true;
  }
  for (const std::string& line : log_lines()) std::printf("log: %s\n", line.c_str());
  return false;
}

// Device buffers handed to regMrDmaBuf go to the daemon as dma-bufs (docs/nccl-plugin.md, "Daemon
// mode"): across two daemons whose job agreed verbs (the emulator, which maps the descriptor the
// daemon received: the registration proves it arrived whole), both ends register, bad input is
// refused without harming the connection, and another job's client cannot name a registration.
// Over tcp, and between two processes of one host, the refusal says why. Over verbs the registered
// buffers move (issue 28, stage C): one daemon message per isend / irecv naming the region, the
// daemons' NICs move the bytes (the emulator reads and writes the memfd through its descriptor):
// sizes across the inline, eager and chunk edges, every byte checked, order on one tag with the
// sends posted before their receives (held by the receiving daemon, not staged), truncation of
// both ends, a host receive of a device message, and a device receive of a host message refused.
TEST_F(DaemonPlugin, DmabufIsRegisteredByTheDaemonOnItsVerbsLink) {
  const char* peer_daemon = getenv("GW_PLUGIN_TEST_PEER_DAEMON");
  const char* peer_host = getenv("GW_PLUGIN_TEST_PEER_HOSTID");
  const bool xhost = peer_daemon != nullptr && peer_host != nullptr;
  const bool verbs = xhost && xhost_transport() == "verbs";
  // The connecting end: on host b (a second instance of the plugin) when there are two hosts.
  std::unique_ptr<NetApi> capi;
  void* cctx = ctx_;
  if (xhost) {
    const std::string daemon_was = getenv("GW_DAEMON");
    const std::string host_was = getenv("GW_HOSTID") != nullptr ? getenv("GW_HOSTID") : "";
    setenv("GW_DAEMON", peer_daemon, 1);
    setenv("GW_HOSTID", peer_host, 1);
    capi = make_api_of_copy();
    ASSERT_EQ(capi->init(&cctx), ncclSuccess);
    setenv("GW_DAEMON", daemon_was.c_str(), 1);
    setenv("GW_HOSTID", host_was.c_str(), 1);
  }
  NetApi& sapi = capi ? *capi : *api_;
  void *sc = nullptr, *rc = nullptr;
  ASSERT_EQ(connect_pair(*api_, ctx_, sapi, cctx, &sc, &rc), "");
  constexpr size_t kMiB = 1 << 20;
  // The sender's region [4 KiB, + 7 MiB), the receiver's [8 MiB, + 7 MiB).
  MemfdBuffer dev(16 * kMiB, "gw-daemon-dmabuf");
  ASSERT_NE(dev.data, nullptr);
  constexpr size_t kRegion = 7 * kMiB;
  void *ms = nullptr, *md = nullptr;
  clear_log();
  const ncclResult_t rs =
      sapi.reg_mr_dmabuf(sc, dev.data + 4096, kRegion, NCCL_PTR_CUDA, 4096, dev.fd, &ms);
  const ncclResult_t rr =
      api_->reg_mr_dmabuf(rc, dev.data + 8 * kMiB, kRegion, NCCL_PTR_CUDA, 8 * kMiB, dev.fd, &md);
  if (!verbs) {
    EXPECT_NE(rs, ncclSuccess);
    EXPECT_NE(rr, ncclSuccess);
    EXPECT_TRUE(warned(xhost ? "dma-bufs need verbs across hosts" : "is on this host"));
  } else {
    ASSERT_EQ(rs, ncclSuccess) << "the sender's daemon registers the dma-buf on its verbs PD";
    ASSERT_EQ(rr, ncclSuccess) << "the receiver's daemon too";
    uint8_t* const src = dev.data + 4096;
    uint8_t* const dst = dev.data + 8 * kMiB;
    // Waits for both requests (nullptr: none); their results and received sizes.
    struct Ends {
      ncclResult_t send = ncclSuccess, recv = ncclSuccess;
      int got = -1;
    };
    auto finish = [&](void* sreq, void* rreq) {
      Ends e;
      for (const auto until = Clock::now() + std::chrono::seconds(30); sreq || rreq;) {
        int d = 0, n = 0;
        if (sreq != nullptr) {
          e.send = sapi.test(sreq, &d, &n);
          if (d || e.send != ncclSuccess) sreq = nullptr;
        }
        d = 0;
        if (rreq != nullptr) {
          e.recv = api_->test(rreq, &d, &n);
          if (d || e.recv != ncclSuccess) {
            rreq = nullptr;
            if (d) e.got = n;
          }
        }
        if (Clock::now() > until) {
          ADD_FAILURE() << "device transfer did not end within 30 s";
          break;
        }
      }
      return e;
    };
    // Every size across the edges: inline (4 KiB), eager (16 KiB), the plugin's chunk (4 MiB).
    for (const size_t n : {size_t{0}, size_t{1}, size_t{4096}, size_t{4097}, size_t{16385},
                           kMiB + 7, size_t{4 * kMiB}, size_t{5 * kMiB}}) {
      SCOPED_TRACE(n);
      fill_pattern(src, n, static_cast<uint32_t>(n) + 3);
      std::memset(dst, 0, n + 64);
      void *sreq = nullptr, *rreq = nullptr;
      ASSERT_EQ(post_recv(*api_, rc, dst, n + 64, 7, md, &rreq), "");
      ASSERT_EQ(post_send(sapi, sc, src, n, 7, ms, &sreq), "");
      const Ends e = finish(sreq, rreq);
      ASSERT_EQ(e.send, ncclSuccess);
      ASSERT_EQ(e.recv, ncclSuccess);
      EXPECT_EQ(e.got, static_cast<int>(n));
      EXPECT_EQ(check_pattern(dst, n, static_cast<uint32_t>(n) + 3), -1);
      for (size_t i = n; i < n + 64; ++i) ASSERT_EQ(dst[i], 0) << "written past the message";
    }
    // iflush of a device receive runs in the receiving daemon (its NIC's flush on the data
    // connection the bytes came on): done at once (no request left to test); a range outside the
    // region is refused; a host buffer needs none.
    {
      void* freq = reinterpret_cast<void*>(1);
      ASSERT_EQ(api_->iflush(rc, dst, 5 * kMiB, md, &freq), ncclSuccess);
      EXPECT_EQ(freq, nullptr);
      EXPECT_NE(api_->iflush(rc, dst + kRegion - 10, 4096, md, &freq), ncclSuccess);
    }
    // Order on one tag: three sends before any receive (the receiving daemon holds the device
    // messages until their receives come), then the receives, each with its own message.
    {
      const size_t sizes[3] = {3 * kMiB + 1, 5, 70001};
      const size_t at[3] = {0, 4 * kMiB, 5 * kMiB};
      void* sreq[3] = {};
      void* rreq[3] = {};
      for (int i = 0; i < 3; ++i) {
        fill_pattern(src + at[i], sizes[i], 100 + i);
        ASSERT_EQ(post_send(sapi, sc, src + at[i], sizes[i], 9, ms, &sreq[i]), "");
      }
      std::memset(dst, 0, kRegion);
      for (int i = 0; i < 3; ++i) {
        ASSERT_EQ(post_recv(*api_, rc, dst + at[i], sizes[i], 9, md, &rreq[i]), "");
      }
      for (int i = 0; i < 3; ++i) {
        const Ends e = finish(sreq[i], rreq[i]);
        EXPECT_EQ(e.send, ncclSuccess) << i;
        EXPECT_EQ(e.recv, ncclSuccess) << i;
        EXPECT_EQ(e.got, static_cast<int>(sizes[i])) << i;
        EXPECT_EQ(check_pattern(dst + at[i], sizes[i], 100 + i), -1) << i;
      }
    }
    // A device message into a host buffer arrives (the NIC writes host memory as well).
    {
      Buffer host(20000);
      fill_pattern(src, 20000, 55);
      void *sreq = nullptr, *rreq = nullptr;
      ASSERT_EQ(post_recv(*api_, rc, host.data, host.size, 11, nullptr, &rreq), "");
      ASSERT_EQ(post_send(sapi, sc, src, 20000, 11, ms, &sreq), "");
      const Ends e = finish(sreq, rreq);
      EXPECT_EQ(e.send, ncclSuccess);
      EXPECT_EQ(e.recv, ncclSuccess);
      EXPECT_EQ(check_pattern(host.data, 20000, 55), -1);
    }
    // A buffer outside its region is refused at once.
    void* req = nullptr;
    EXPECT_NE(sapi.isend(sc, src + kRegion - 100, 4096, 1, ms, &req), ncclSuccess);
    // Truncation: a device receive smaller than its message fails,
    // and so does the send.
    {
      fill_pattern(src, 8192, 9);
      void *sreq = nullptr, *rreq = nullptr;
      ASSERT_EQ(post_recv(*api_, rc, dst, 4096, 12, md, &rreq), "");
      ASSERT_EQ(post_send(sapi, sc, src, 8192, 12, ms, &sreq), "");
      const Ends e = finish(sreq, rreq);
      EXPECT_NE(e.recv, ncclSuccess) << "a receive smaller than its message";
      EXPECT_NE(e.send, ncclSuccess) << "the truncated message's send";
    }
    // Bad input: no descriptor, a descriptor that is no buffer (a pipe), a range past the
    // buffer's end. Each is refused, and the connection still moves host buffers after them.
    void* bad = nullptr;
    EXPECT_NE(sapi.reg_mr_dmabuf(sc, dev.data, 4096, NCCL_PTR_CUDA, 0, -1, &bad), ncclSuccess);
    int pipe_fds[2];
    ASSERT_EQ(::pipe(pipe_fds), 0);
    EXPECT_NE(sapi.reg_mr_dmabuf(sc, dev.data, 4096, NCCL_PTR_CUDA, 0, pipe_fds[0], &bad),
              ncclSuccess);
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    EXPECT_NE(sapi.reg_mr_dmabuf(sc, dev.data, kMiB, NCCL_PTR_CUDA, 16 * kMiB - 4096, dev.fd, &bad),
              ncclSuccess);
    Buffer out(70000), in(70000);
    fill_pattern(out.data, out.size, 31);
    void *sreq = nullptr, *rreq = nullptr;
    ASSERT_EQ(post_recv(*api_, rc, in.data, in.size, 2, nullptr, &rreq), "");
    ASSERT_EQ(post_send(sapi, sc, out.data, out.size, 2, nullptr, &sreq), "");
    for (const auto until = Clock::now() + std::chrono::seconds(20); sreq || rreq;) {
      int d = 0, n = 0;
      if (sreq != nullptr) {
        ASSERT_EQ(sapi.test(sreq, &d, &n), ncclSuccess);
        if (d) sreq = nullptr;
      }
      if (rreq != nullptr) {
        ASSERT_EQ(api_->test(rreq, &d, &n), ncclSuccess);
        if (d) rreq = nullptr;
      }
      ASSERT_LT(Clock::now(), until) << "host transfer after the refusals";
    }
    EXPECT_EQ(check_pattern(in.data, in.size, 31), -1);
    // Isolation: a client of another job on host b's daemon names the sender's registration
    // (id 1: its trainer's first): refused, and the sender's stays (its deregMr succeeds).
    daemon::Hello h;
    h.job_token = "gw-dmabuf-isolation-other-job";
    h.host_id = peer_host;
    h.arena_bytes = daemon::kMinArenaBytes;
    h.timeout_ms = 4000;
    auto other = daemon::Client::connect(std::string(peer_daemon).substr(5), h, 0);
    ASSERT_TRUE(other.ok()) << other.status().to_string();
    auto ask = [&](daemon::SqEntry e) {
      auto seq = (*other)->post(e, "test");
      if (!seq.ok()) return seq.status();
      bool done = false;
      Status st = (*other)->wait_for(*seq, sys::deadline_after_ms(8000), &done, "test");
      return done ? st : timeout_error("no answer");
    };
    daemon::SqEntry dereg{};
    dereg.opcode = static_cast<uint16_t>(daemon::Opcode::kDeregisterDmabuf);
    dereg.spec_len = 1;
    Status st = ask(dereg);
    EXPECT_EQ(st.code(), Code::kInvalidArg) << st.to_string();
    EXPECT_NE(st.message().find("is not a dma-buf registration of this client"), std::string::npos)
        << st.to_string();
    // Its own descriptor for a peer of its own host (its job has one): refused saying why.
    auto ticket = (*other)->pass_fd(dev.fd, "test");
    ASSERT_TRUE(ticket.ok()) << ticket.status().to_string();
    daemon::SqEntry reg{};
    reg.opcode = static_cast<uint16_t>(daemon::Opcode::kRegisterDmabuf);
    reg.spec_len = *ticket;
    reg.count = 4096;
    reg.key_len = daemon::kDmabufSends;
    st = ask(reg);
    EXPECT_EQ(st.code(), Code::kUnsupported) << st.to_string();
    EXPECT_NE(st.message().find("is on this host"), std::string::npos) << st.to_string();
    // A ticket no descriptor came with.
    reg.spec_len = *ticket + 7;
    st = ask(reg);
    EXPECT_EQ(st.code(), Code::kInvalidArg) << st.to_string();
    EXPECT_NE(st.message().find("no descriptor came"), std::string::npos) << st.to_string();
    // A non-descriptor is refused before anything is sent.
    EXPECT_EQ((*other)->pass_fd(-1, "test").status().code(), Code::kInvalidArg);
    other->reset();
    EXPECT_EQ(sapi.dereg_mr(sc, ms), ncclSuccess);
    EXPECT_EQ(api_->dereg_mr(rc, md), ncclSuccess);
  }
  EXPECT_EQ(sapi.close_send(sc), ncclSuccess);
  EXPECT_EQ(api_->close_recv(rc), ncclSuccess);
  if (capi) capi->finalize(cctx);
}

// Every registration of a client goes when the client goes, a killed process's included: the
// peer process on host b registers a dma-buf through daemon b and is killed; daemon b says it
// released it.
TEST_F(DaemonPlugin, DmabufRegistrationsGoWithAKilledProcess) {
  if (getenv("GW_PLUGIN_TEST_PEER_DAEMON") == nullptr || xhost_transport() != "verbs") {
    GTEST_SKIP() << "two hosts over verbs only (GW_PLUGIN_TEST_XHOST_TRANSPORT=verbs)";
  }
  auto released = [] {
    const std::string out = xhost_daemon_output(1);
    size_t n = 0;
    for (size_t at = 0; (at = out.find("dma-buf registrations released", at)) != std::string::npos;
         ++at) {
      ++n;
    }
    return n;
  };
  const size_t before = released();
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc = nullptr;
  ASSERT_EQ(api_->listen(ctx_, 0, handle, &lc), ncclSuccess);
  Acceptor acc;
  acc.start(api_.get(), lc);
  std::string out;
  const int rc = run_peer({}, {"connect", handle_hex(handle), "dmabuf-die"}, &out);
  EXPECT_EQ(rc, -1) << "the peer kills itself";
  EXPECT_NE(out.find("registered"), std::string::npos) << out;
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (released() == before && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GT(released(), before) << "daemon b's output:\n" << xhost_daemon_output(1);
  acc.join();
  if (void* comm = acc.comm.load()) api_->close_recv(comm);
  api_->close_listen(lc);
}

// A device message whose sender is killed before the receiver takes it (its bytes wait at the
// sender's daemon, the receiving daemon holds only its header): the receiver's pending device
// receive fails (no hang), and so does a later one that would have taken the held message.
TEST_F(DaemonPlugin, DmabufSenderKilledFailsTheDeviceReceive) {
  if (getenv("GW_PLUGIN_TEST_PEER_DAEMON") == nullptr || xhost_transport() != "verbs") {
    GTEST_SKIP() << "two hosts over verbs only (GW_PLUGIN_TEST_XHOST_TRANSPORT=verbs)";
  }
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc = nullptr;
  ASSERT_EQ(api_->listen(ctx_, 0, handle, &lc), ncclSuccess);
  Acceptor acc;
  acc.start(api_.get(), lc);
  std::string out;
  std::thread peer([&] { run_peer({}, {"connect", handle_hex(handle), "dmabuf-send-die"}, &out); });
  void* rc = acc.wait_comm();
  ASSERT_NE(rc, nullptr);
  MemfdBuffer dev(2 << 20, "gw-dmabuf-recv-of-killed");
  ASSERT_NE(dev.data, nullptr);
  void* md = nullptr;
  ASSERT_EQ(api_->reg_mr_dmabuf(rc, dev.data, dev.size, NCCL_PTR_CUDA, 0, dev.fd, &md),
            ncclSuccess);
  // Tag 2: nothing comes on it; the sender dies meanwhile.
  void* req = nullptr;
  ASSERT_EQ(post_recv(*api_, rc, dev.data, 1 << 20, 2, md, &req), "");
  int done = 0, size = 0;
  ncclResult_t r = ncclSuccess;
  const auto t0 = Clock::now();
  while (r == ncclSuccess && !done && Clock::now() - t0 < std::chrono::seconds(20)) {
    r = api_->test(req, &done, &size);
  }
  peer.join();
  EXPECT_NE(out.find("sent"), std::string::npos) << out;
  EXPECT_NE(r, ncclSuccess) << "the device receive from a killed rank must fail, not hang";
  EXPECT_EQ(done, 0);
  // Tag 1: the held device message, whose bytes went with the sender: refused or failed.
  req = nullptr;
  r = api_->irecv(rc, dev.data, 1 << 20, 1, md, &req);
  done = 0;
  const auto t1 = Clock::now();
  while (r == ncclSuccess && req != nullptr && !done &&
         Clock::now() - t1 < std::chrono::seconds(20)) {
    r = api_->test(req, &done, &size);
  }
  EXPECT_TRUE(r != ncclSuccess || req == nullptr) << "a held device message of a killed sender";
  EXPECT_EQ(done, 0);
  (void)api_->dereg_mr(rc, md);
  api_->close_recv(rc);
  api_->close_listen(lc);
}

TEST_F(DaemonPlugin, RankKilledMidTransferFailsItsPeerAndNotOthers) {
  // A connection that lives through the death of the other process's.
  void *sc2 = nullptr, *rc2 = nullptr;
  ASSERT_EQ(connect_pair(*api_, ctx_, &sc2, &rc2), "");
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc = nullptr;
  ASSERT_EQ(api_->listen(ctx_, 0, handle, &lc), ncclSuccess);
  Acceptor acc;
  acc.start(api_.get(), lc);
  std::thread peer([&] { run_peer({}, {"connect", handle_hex(handle), "die"}); });
  void* rc = acc.wait_comm();
  ASSERT_NE(rc, nullptr);
  Buffer in(1 << 20);
  void* req = nullptr;
  ASSERT_EQ(post_recv(*api_, rc, in.data, in.size, 0, nullptr, &req), "");
  clear_log();
  int done = 0, size = 0;
  ncclResult_t r = ncclSuccess;
  const auto t0 = Clock::now();
  while (r == ncclSuccess && !done && Clock::now() - t0 < std::chrono::seconds(20)) {
    r = api_->test(req, &done, &size);
  }
  peer.join();
  EXPECT_EQ(r, ncclSystemError) << "the receive from a killed rank must fail, not hang";
  EXPECT_EQ(done, 0);
  bool named = false;
  // Across hosts (GW_PLUGIN_TEST_XHOST) the connector's daemon ends the job when its rank
  // leaves, and this host's daemon reports the end of point-to-point with that host.
  const bool xhost = getenv("GW_PLUGIN_TEST_PEER_DAEMON") != nullptr;
  for (const std::string& line : log_lines()) {
    named |= line.find("left the job") != std::string::npos;
    named |= xhost && line.find("point-to-point with host 0's daemon ended") != std::string::npos;
  }
  if (!named) {
    for (const std::string& line : log_lines()) std::printf("log: %s\n", line.c_str());
  }
  EXPECT_TRUE(named) << "the failure names the rank that left";
  std::printf("receive from the killed rank failed %.3f s after it was posted\n",
              std::chrono::duration<double>(Clock::now() - t0).count());
  EXPECT_EQ(api_->close_recv(rc), ncclSuccess);
  EXPECT_EQ(api_->close_listen(lc), ncclSuccess);
  // The daemon let go of the dead rank's connection and arena (and this side's, closed): only
  // the other connection's two clients and its job remain.
  int clients = -1, arenas = -1, jobs = -1;
  for (const auto t1 = Clock::now(); Clock::now() - t1 < std::chrono::seconds(10);) {
    clients = daemon_count("clients");
    arenas = daemon_count("arenas");
    jobs = daemon_count("jobs");
    if (clients == 2 && arenas == 2 && jobs == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(clients, 2);
  EXPECT_EQ(arenas, 2);
  EXPECT_EQ(jobs, 1);
  // The other connection goes on.
  Buffer out(1 << 20), in2(1 << 20);
  fill_pattern(out.data, out.size, 12);
  void *sreq = nullptr, *rreq = nullptr;
  ASSERT_EQ(post_recv(*api_, rc2, in2.data, in2.size, 5, nullptr, &rreq), "");
  ASSERT_EQ(post_send(*api_, sc2, out.data, out.size, 5, nullptr, &sreq), "");
  ASSERT_EQ(wait_all(*api_, {sreq, rreq}), "");
  EXPECT_EQ(check_pattern(in2.data, in2.size, 12), -1);
  EXPECT_EQ(api_->close_send(sc2), ncclSuccess);
  EXPECT_EQ(api_->close_recv(rc2), ncclSuccess);
}

TEST_F(DaemonPlugin, DaemonKilledFailsEveryCallPromptly) {
  EXPECT_EQ(run_peer({}, {"daemon-dies", GW_GRADWIRED_PATH}), 0);
}

// GET /metrics of 127.0.0.1:port ("" when it cannot be read).
std::string get_metrics(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;)
        out.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return out;
}

// The value of the sample `name` (with its labels) in a metrics page, or -1.
double sample(const std::string& page, const std::string& name) {
  const size_t at = page.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::atof(page.c_str() + at + name.size() + 2);
}

// /metrics counts an NCCL job's connections and the bytes they carried: a gradwired of this test's
// own with --metrics, and one bench run through it by a peer process.
TEST(DaemonPluginMetrics, NcclConnectionsAndBytesByJob) {
  char dir[] = "/tmp/gw-plugin-metrics-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string sock = std::string(dir) + "/s.sock";
  const int port = gw::testing::free_port();
  const std::string listen = "127.0.0.1:" + std::to_string(port);
  pid_t pid = fork();
  if (pid == 0) {
    execl(GW_GRADWIRED_PATH, GW_GRADWIRED_PATH, "--foreground", "--socket", sock.c_str(),
          "--metrics", listen.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_GT(pid, 0);
  for (int i = 0; i < 200 && access((sock + ".ctl").c_str(), F_OK) != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const int rc = run_peer({"GW_DAEMON=unix:" + sock, "-GW_PLUGIN_TEST_GRADWIRED"}, {"bench"});
  std::string page;
  const std::string conns = "gradwired_nccl_connections{nccl_job=\"";
  for (int i = 0; i < 100; ++i) {  // the connection's job ends just after the peer does
    page = get_metrics(port);
    const size_t at = page.find("\n" + conns);
    if (at != std::string::npos && page.compare(page.find('}', at) + 1, 3, " 0\n") == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
  unlink(sock.c_str());
  unlink((sock + ".ctl").c_str());
  rmdir(dir);
  ASSERT_EQ(rc, 0);
  const size_t at = page.find("\n" + conns);
  ASSERT_NE(at, std::string::npos) << page;
  const std::string job = page.substr(at + 1 + conns.size(), 16);
  EXPECT_EQ(sample(page, conns + job + "\"}"), 0) << page;
  // The bench moves at least two 64 MiB messages (a checked warm-up and one timed).
  EXPECT_GE(sample(page, "gradwired_nccl_bytes_total{nccl_job=\"" + job + "\"}"), 2.0 * (64 << 20))
      << page;
}

// The machine's ceilings: one memcpy of 64 MiB, and 64 MiB through one loopback TCP connection.
double memcpy_gbps() {
  constexpr size_t kN = size_t{64} << 20;
  std::vector<uint8_t> a(kN, 1), b(kN, 0);
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), kN);
    best = std::max(best, kN / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9);
  }
  return best;
}

double loopback_tcp_gbps() {
  constexpr size_t kN = size_t{64} << 20;
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(ls, 1) != 0 ||
      getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(ls);
    return 0;
  }
  int c = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return 0;
  int s = accept(ls, nullptr, nullptr);
  close(ls);
  std::vector<uint8_t> out(kN, 3), in(kN);
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = Clock::now();
    std::thread w([&] {
      for (size_t off = 0; off < kN;) {
        ssize_t n = write(c, out.data() + off, kN - off);
        if (n <= 0) return;
        off += static_cast<size_t>(n);
      }
    });
    for (size_t off = 0; off < kN;) {
      ssize_t n = read(s, in.data() + off, kN - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    w.join();
    best = std::max(best, kN / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9);
  }
  close(c);
  close(s);
  return best;
}

// The bench's row of a peer's output ("bench MODE ..."), or "" when it printed none.
std::string bench_row(const std::string& out) {
  const size_t at = out.find("bench ");
  return at == std::string::npos ? "" : out.substr(at, out.find('\n', at) - at);
}

// Each row measures what it names, in every variant: the direct-mode row has no daemon (under
// GW_PLUGIN_TEST_XHOST too, where peers otherwise move to host b's daemon), the other goes
// through one.
TEST_F(DaemonPlugin, FiguresAgainstDirectModeWithTheCeilings) {
  std::printf("ceiling: memcpy 64MiB %.2f GB/s, loopback TCP 64MiB %.2f GB/s\n", memcpy_gbps(),
              loopback_tcp_gbps());
  std::fflush(stdout);
  std::string direct, daemon;
  EXPECT_EQ(run_peer({"-GW_DAEMON", "-GW_PLUGIN_TEST_GRADWIRED"}, {"bench"}, &direct), 0);
  EXPECT_EQ(run_peer({}, {"bench"}, &daemon), 0);
  EXPECT_EQ(bench_row(direct).rfind("bench direct ", 0), 0u) << direct;
  EXPECT_EQ(bench_row(daemon).rfind("bench daemon ", 0), 0u) << daemon;
}

// Two hosts only (GW_PLUGIN_TEST_XHOST=1): the figures of one connection whose ends are on two
// daemons ("two hosts", their messages over the daemons' tcp point-to-point), against direct mode
// (tcp over lo) and one daemon, with the machine's ceilings, all in the same run.
TEST_F(DaemonPlugin, FiguresAcrossTwoDaemons) {
  const char* a = getenv("GW_PLUGIN_TEST_HOST_A_DAEMON");
  if (a == nullptr) GTEST_SKIP() << "two hosts only (GW_PLUGIN_TEST_XHOST=1)";
  std::printf("ceiling: memcpy 64MiB %.2f GB/s, loopback TCP 64MiB %.2f GB/s\n", memcpy_gbps(),
              loopback_tcp_gbps());
  std::fflush(stdout);
  const std::vector<std::string> not_peer = {"-GW_PLUGIN_TEST_PEER_DAEMON",
                                             "-GW_PLUGIN_TEST_PEER_HOSTID"};
  std::vector<std::string> direct = not_peer;
  direct.push_back("-GW_DAEMON");
  direct.push_back("-GW_PLUGIN_TEST_GRADWIRED");
  std::string out[3];
  EXPECT_EQ(run_peer(direct, {"bench"}, &out[0]), 0);
  std::vector<std::string> one_daemon = not_peer;
  one_daemon.push_back(std::string("GW_DAEMON=") + a);
  EXPECT_EQ(run_peer(one_daemon, {"bench"}, &out[1]), 0);
  EXPECT_EQ(run_peer({}, {"bench-xhost"}, &out[2]), 0);
  EXPECT_EQ(bench_row(out[0]).rfind("bench direct ", 0), 0u) << out[0];
  EXPECT_EQ(bench_row(out[1]).rfind("bench daemon ", 0), 0u) << out[1];
  EXPECT_EQ(bench_row(out[2]).rfind("bench daemon-xhost ", 0), 0u) << out[2];
}

// The environment changes of a peer process on host a (run_peer's "-NAME": it stays on this
// process's host and daemon instead of moving to host b).
const std::vector<std::string> kOnHostA = {"-GW_PLUGIN_TEST_PEER_DAEMON",
                                           "-GW_PLUGIN_TEST_PEER_HOSTID"};

// How many times `needle` occurs in `text`.
int occurrences(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// Runs nccl_plugin_peer once per entry of `runs` (environment changes, arguments), all at once;
// returns their exit statuses. `while_running` is called once, with the count of those already
// ended, while they run (it may wait).
std::vector<int> run_peers(
    const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>>& runs,
    const std::function<void(const std::atomic<int>& ended)>& while_running = nullptr) {
  std::vector<int> rcs(runs.size(), -1);
  std::atomic<int> ended{0};
  std::vector<std::thread> threads;
  for (size_t i = 0; i < runs.size(); ++i) {
    threads.emplace_back([&, i] {
      rcs[i] = run_peer(runs[i].first, runs[i].second);
      ++ended;
    });
  }
  if (while_running) while_running(ended);
  for (std::thread& t : threads) t.join();
  return rcs;
}

// Two hosts only (the xhost variants: tcp, verbs_emu, dpdk): four plugin processes on host a and
// four on host b, process i of each side connected both ways with process i of the other (eight
// connections, each a job of both daemons), all at once: 0 B to 8 MiB both ways, one at a time
// and then all in flight, every byte checked (nccl_plugin_peer share). While the eight
// connections are up, each daemon lists them as jobs of two hosts over the variant's transport;
// over dpdk, all go through the one port of each daemon (its engine started once, on its end of
// the memif pair).
TEST_F(DaemonPlugin, FourProcessesShareOneDaemonPort) {
  const char* b = getenv("GW_PLUGIN_TEST_PEER_DAEMON");
  if (b == nullptr) GTEST_SKIP() << "two hosts only (GW_PLUGIN_TEST_XHOST=1)";
  char dir[] = "/tmp/gw-plugin-share-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  constexpr int kPerHost = 4;
  std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> runs;
  for (int i = 0; i < kPerHost; ++i) {
    runs.push_back({kOnHostA, {"share", dir, "a", std::to_string(i)}});
    runs.push_back({{}, {"share", dir, "b", std::to_string(i)}});
  }
  const std::string want = "\"transport\": \"" + xhost_transport() + "\"";
  std::string jobs_a, jobs_b;
  int done = 0;
  const auto t0 = Clock::now();
  std::vector<int> rcs = run_peers(runs, [&](const std::atomic<int>& ended) {
    // Until every process has moved its bytes (and so holds its two connections), or one ended.
    for (const auto until = Clock::now() + std::chrono::seconds(40);
         Clock::now() < until && ended.load() == 0;) {
      done = 0;
      for (int i = 0; i < kPerHost; ++i) {
        for (const char* side : {"a", "b"}) {
          const std::string f = std::string(dir) + "/" + side + std::to_string(i) + ".done";
          done += access(f.c_str(), F_OK) == 0 ? 1 : 0;
        }
      }
      if (done == 2 * kPerHost) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    jobs_a = gradwirectl("--json jobs");
    jobs_b = gradwirectl("--json jobs", b);
    // Let them close (each also waits for its peer to be done reading).
    FILE* f = std::fopen((std::string(dir) + "/release").c_str(), "w");
    if (f != nullptr) std::fclose(f);
  });
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  for (size_t i = 0; i < rcs.size(); ++i) {
    EXPECT_EQ(rcs[i], 0) << "share " << runs[i].second[2] << runs[i].second[3]
                         << " failed (its reason is on stderr)";
  }
  EXPECT_EQ(done, 2 * kPerHost);
  // Eight connections, each a job of two hosts in both daemons, over the variant's transport.
  EXPECT_GE(occurrences(jobs_a, want), 2 * kPerHost) << jobs_a;
  EXPECT_GE(occurrences(jobs_b, want), 2 * kPerHost) << jobs_b;
  if (xhost_transport() == "dpdk") {
    EXPECT_EQ(xhost_went_over_dpdk(), "");
    for (int h = 0; h < 2; ++h) {
      EXPECT_EQ(occurrences(xhost_daemon_output(h), "dpdk: engine on "), 1)
          << "one port per daemon, shared by every job:\n"
          << xhost_daemon_output(h);
    }
  }
  std::printf("4+4 processes, 8 connections across two daemons (%s): %.2f s\n",
              xhost_transport().c_str(), s);
}

// Two hosts over dpdk only (nccl_plugin_daemon_test.xhost_dpdk): the figures over dpdk, each end
// in a process of its own (direct mode needs that: EAL is once per process, so each end owns a
// port), both modes measured alike (nccl_plugin_peer bench-pair): daemon mode, the ends on the
// two daemons whose jobs run over their memif pair, against direct mode, the plugin's own dpdk
// backend (GW_PLUGIN_BACKEND=dpdk) with each process on an end of a memif pair of its own; with
// the machine's ceilings, in the same run.
TEST_F(DaemonPlugin, FiguresOverDpdkInTwoProcesses) {
  if (xhost_transport() != "dpdk") {
    GTEST_SKIP() << "two hosts over dpdk only (GW_PLUGIN_TEST_XHOST_TRANSPORT=dpdk)";
  }
  std::printf("ceiling: memcpy 64MiB %.2f GB/s, loopback TCP 64MiB %.2f GB/s\n", memcpy_gbps(),
              loopback_tcp_gbps());
  std::fflush(stdout);
  auto pair = [](const std::vector<std::string>& tx_env, const std::vector<std::string>& rx_env,
                 const std::string& label) {
    char dir[] = "/tmp/gw-plugin-bench-XXXXXX";
    if (mkdtemp(dir) == nullptr) return std::vector<int>{-1, -1};
    std::vector<int> rcs = run_peers(
        {{tx_env, {"bench-pair", dir, "tx", label}}, {rx_env, {"bench-pair", dir, "rx", label}}});
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    return rcs;
  };
  // Daemon mode: tx on host a, rx on host b.
  EXPECT_EQ(pair(kOnHostA, {}, "daemon-xhost-dpdk"), (std::vector<int>{0, 0}));
  // Direct mode: no daemon, each process on its end of a memif pair (named after this process).
  std::vector<std::vector<std::string>> direct(2);
  for (int h = 0; h < 2; ++h) {
    direct[h] = {"-GW_DAEMON",
                 "-GW_PLUGIN_TEST_GRADWIRED",
                 "-GW_PLUGIN_TEST_PEER_DAEMON",
                 "-GW_PLUGIN_TEST_PEER_HOSTID",
                 "GW_PLUGIN_BACKEND=dpdk",
                 std::string("GW_HOSTID=") + (h == 0 ? kXhostA : kXhostB),
                 "GW_DPDK_IP=10.73.0." + std::to_string(h + 1),
                 "GW_DPDK_EAL_ARGS=-l 0 --no-huge -m 512 --no-pci --no-shconf --no-telemetry "
                 "--log-level=*:error --vdev net_memif0,id=0,socket=/gw-plugin-direct-" +
                     std::to_string(getpid()) + ".sock,role=" + (h == 0 ? "server" : "client") +
                     ",mac=02:73:00:00:00:0" + std::to_string(h + 1)};
  }
  EXPECT_EQ(pair(direct[0], direct[1], "direct-dpdk"), (std::vector<int>{0, 0}));
}

}  // namespace
}  // namespace gw::plugin_test

namespace gw::plugin_test {
namespace {

// The state `gradwirectl --json jobs` gives the daemon's one job (the connection's), once it is
// not `running` any more or 10 s have passed (now: at once); "" when the daemon lists no job or
// several.
std::string connection_job_state(bool now = false) {
  for (const auto t0 = Clock::now();;) {
    const std::string json = gradwirectl("--json jobs");
    const size_t first = json.find("\"job\":");
    if (first == std::string::npos || json.find("\"job\":", first + 1) != std::string::npos) {
      return "";
    }
    const size_t at = json.find("\"state\": \"");
    if (at == std::string::npos) return "";
    const std::string state = json.substr(at + 10, json.find('"', at + 10) - at - 10);
    if (state != "running" || now || Clock::now() - t0 > std::chrono::seconds(10)) return state;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// A connection whose peer process closes its comm and finalizes (then exits) has ended, not
// failed: `gradwirectl jobs` says `ended` while this end is still open; a peer killed instead
// leaves it `failed`. One daemon (the connection's two ends on it: the job the daemon can see).
TEST_F(DaemonPlugin, PeerThatClosesEndsTheJobAndAKilledOneFailsIt) {
  if (getenv("GW_PLUGIN_TEST_PEER_DAEMON") != nullptr) GTEST_SKIP() << "one daemon only";
  // The daemon's jobs (-1: unreadable) once it has none, or after 10 s: the earlier tests'
  // connections go with their job threads, just after their ends closed.
  auto jobs_left = [] {
    int jobs = -1;
    for (const auto t0 = Clock::now(); Clock::now() - t0 < std::chrono::seconds(10);) {
      if ((jobs = daemon_count("jobs")) == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return jobs;
  };
  ASSERT_EQ(jobs_left(), 0) << gradwirectl("jobs");
  for (const std::string then : {"send", "die"}) {
    SCOPED_TRACE("peer: connect " + then);
    uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
    void* lc = nullptr;
    ASSERT_EQ(api_->listen(ctx_, 0, handle, &lc), ncclSuccess);
    Acceptor acc;
    acc.start(api_.get(), lc);
    const int rc = run_peer({}, {"connect", handle_hex(handle), then});
    if (then == "send") {
      EXPECT_EQ(rc, 0);
    }
    void* comm = acc.wait_comm();
    ASSERT_NE(comm, nullptr);
    if (then == "send") {
      Buffer in(4096);
      void* req = nullptr;
      ASSERT_EQ(post_recv(*api_, comm, in.data, in.size, 3, nullptr, &req), "");
      ASSERT_EQ(wait_all(*api_, {req}), "");
      EXPECT_EQ(check_pattern(in.data, 4096, 77), -1);
    }
    const std::string state = connection_job_state();
    EXPECT_EQ(state, then == "send" ? "ended" : "failed") << gradwirectl("jobs");
    EXPECT_EQ(api_->close_recv(comm), ncclSuccess);
    EXPECT_EQ(api_->close_listen(lc), ncclSuccess);
    EXPECT_EQ(jobs_left(), 0) << gradwirectl("jobs");  // both ends gone: the job too
  }
}

}  // namespace
}  // namespace gw::plugin_test

namespace gw::plugin_test {
namespace {

// The jobs the daemon at `daemon` (unix:PATH) lists once it has none, or after 10 s (-1:
// unreadable).
int jobs_left_on(const char* daemon) {
  int jobs = -1;
  for (const auto t0 = Clock::now(); Clock::now() - t0 < std::chrono::seconds(10);) {
    const std::string out = gradwirectl("--json status", daemon);
    const size_t at = out.find("\"jobs\": ");
    jobs = at == std::string::npos ? -1 : std::atoi(out.c_str() + at + 8);
    if (jobs == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return jobs;
}

// The lines of `text` logged at WARN or above (spdlog's names: "warning", "error", "critical").
std::string warnings_in(const std::string& text) {
  std::string found;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    for (const char* level : {"] warning ", "] error ", "] critical "}) {
      if (line.find(level) != std::string::npos) found += line + "\n";
    }
  }
  return found;
}

// Two hosts only (the xhost variants): a connection whose connector (on host b) sends, closes and
// finalizes ends its job on the listener's daemon (host a) too, while the listener is still open:
// `gradwirectl jobs` there says `ended`, as one daemon says it (PeerThatCloses... above), and
// neither daemon logs a warning for that usual end. A connector killed instead is no usual end:
// the listener's job is not `ended`, and its daemon warns that the connection broke.
TEST_F(DaemonPlugin, RemotePeerThatClosesEndsTheJobOnBothHostsQuietly) {
  const char* b = getenv("GW_PLUGIN_TEST_PEER_DAEMON");
  if (b == nullptr) GTEST_SKIP() << "two hosts only (GW_PLUGIN_TEST_XHOST=1)";
  const char* a = getenv("GW_DAEMON");
  // The earlier tests' connections go with their job threads, just after their ends closed.
  ASSERT_EQ(jobs_left_on(a), 0) << gradwirectl("jobs", a);
  ASSERT_EQ(jobs_left_on(b), 0) << gradwirectl("jobs", b);
  for (const std::string then : {"send", "die"}) {
    SCOPED_TRACE("peer: connect " + then);
    const size_t said[2] = {xhost_daemon_output(0).size(), xhost_daemon_output(1).size()};
    uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
    void* lc = nullptr;
    ASSERT_EQ(api_->listen(ctx_, 0, handle, &lc), ncclSuccess);
    Acceptor acc;
    acc.start(api_.get(), lc);
    const int rc = run_peer({}, {"connect", handle_hex(handle), then});
    void* comm = acc.wait_comm();
    ASSERT_NE(comm, nullptr);
    if (then == "send") {
      EXPECT_EQ(rc, 0);
      Buffer in(4096);
      void* req = nullptr;
      ASSERT_EQ(post_recv(*api_, comm, in.data, in.size, 3, nullptr, &req), "");
      ASSERT_EQ(wait_all(*api_, {req}), "");
      EXPECT_EQ(check_pattern(in.data, 4096, 77), -1);
      // Daemon a learns that the connector left on purpose: its job ends, this end still open.
      EXPECT_EQ(connection_job_state(), "ended") << gradwirectl("jobs", a);
    } else {
      // Daemon b has seen its trainer die (its job failed and went); daemon a, told nothing, must
      // not take that for a usual end.
      EXPECT_EQ(jobs_left_on(b), 0) << gradwirectl("jobs", b);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      EXPECT_EQ(connection_job_state(true), "running") << gradwirectl("jobs", a);
    }
    EXPECT_EQ(api_->close_recv(comm), ncclSuccess);
    EXPECT_EQ(api_->close_listen(lc), ncclSuccess);
    EXPECT_EQ(jobs_left_on(a), 0) << gradwirectl("jobs", a);
    EXPECT_EQ(jobs_left_on(b), 0) << gradwirectl("jobs", b);
    const std::string out_a = xhost_daemon_output(0).substr(said[0]);
    const std::string out_b = xhost_daemon_output(1).substr(said[1]);
    if (then == "send") {
      EXPECT_EQ(warnings_in(out_a), "") << "daemon a, a usual close:\n" << out_a;
      EXPECT_EQ(warnings_in(out_b), "") << "daemon b, a usual close:\n" << out_b;
    } else {
      // A real failure still warns: daemon b of its trainer's death, daemon a of the connection.
      EXPECT_NE(warnings_in(out_b).find("failed"), std::string::npos) << out_b;
      EXPECT_NE(warnings_in(out_a).find("point-to-point"), std::string::npos) << out_a;
    }
  }
}

}  // namespace
}  // namespace gw::plugin_test

namespace gw::plugin_test {
namespace {

// Two hosts only (the ctest variant nccl_plugin_daemon_test.xhost, GW_PLUGIN_TEST_XHOST=1): the
// daemon of the connector's host killed while this host's receive from it is pending fails the
// receive promptly (the daemons' connection closes), never a hang. Defined last, so run last
// (gtest runs a file's tests in their order): it kills daemon b.
TEST_F(DaemonPlugin, RemoteDaemonKilledFailsThePendingReceive) {
  const char* pid = getenv("GW_PLUGIN_TEST_PEER_DAEMON_PID");
  if (pid == nullptr) GTEST_SKIP() << "two hosts only (GW_PLUGIN_TEST_XHOST=1)";
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc = nullptr;
  ASSERT_EQ(api_->listen(ctx_, 0, handle, &lc), ncclSuccess);
  Acceptor acc;
  acc.start(api_.get(), lc);
  // The peer connects, sends its 4096 bytes (tag 3) and closes; its daemon stays until killed.
  std::thread peer([&] { run_peer({}, {"connect", handle_hex(handle), "die"}); });
  void* rc = acc.wait_comm();
  ASSERT_NE(rc, nullptr);
  Buffer in(1 << 20);
  void* req = nullptr;
  ASSERT_EQ(post_recv(*api_, rc, in.data, in.size, 0, nullptr, &req), "");
  ASSERT_EQ(kill(std::atoi(pid), SIGKILL), 0);  // within the peer's 300 ms of life
  int done = 0, size = 0;
  ncclResult_t r = ncclSuccess;
  const auto t0 = Clock::now();
  while (r == ncclSuccess && !done && Clock::now() - t0 < std::chrono::seconds(20)) {
    r = api_->test(req, &done, &size);
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  peer.join();
  EXPECT_EQ(r, ncclSystemError) << "the receive through a killed remote daemon must fail";
  EXPECT_EQ(done, 0);
  EXPECT_LT(s, 15.0) << "bounded by GW_TIMEOUT_MS, not a hang";
  std::printf("receive across hosts failed %.3f s after the remote daemon was killed\n", s);
  EXPECT_EQ(api_->close_recv(rc), ncclSuccess);
  EXPECT_EQ(api_->close_listen(lc), ncclSuccess);
}

}  // namespace
}  // namespace gw::plugin_test
