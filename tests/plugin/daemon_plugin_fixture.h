// The DaemonPlugin fixture of nccl_plugin_daemon_test (its .cc files share one test binary and so
// one fixture type): a gradwired of the test's own (plugin_harness: GW_PLUGIN_TEST_GRADWIRED),
// the plugin's v11 API initialised, the DPDK variant skipped where EAL cannot start; and the
// gradwirectl helpers the cases read the daemon with.
#pragma once

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
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "daemon/client.h"
#include "tests/plugin/plugin_harness.h"
#include "tests/support/free_port.h"

namespace gw::plugin_test {

// What `gradwirectl ARGS` printed for the daemon at `daemon` (unix:PATH; GW_DAEMON when null),
// "" when it cannot be run.
inline std::string gradwirectl(const std::string& args, const char* daemon = nullptr) {
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
inline int daemon_count(const std::string& key) {
  const std::string out = gradwirectl("--json status");
  const size_t at = out.find("\"" + key + "\": ");
  return at == std::string::npos ? -1 : std::atoi(out.c_str() + at + key.size() + 4);
}

// Whether a WARN the plugin logged since clear_log() contains `text` (printing them all if not).
inline bool warned(const std::string& text) {
  for (const std::string& line : log_lines()) {
    if (line.rfind("WARN", 0) == 0 && line.find(text) != std::string::npos) return true;
  }
  for (const std::string& line : log_lines()) std::printf("log: %s\n", line.c_str());
  return false;
}

// Calls accept on `lc` from a thread until a comm, an error or `stop`.
struct Acceptor {
  std::atomic<bool> stop{false};
  std::atomic<void*> comm{nullptr};
  std::atomic<int> result{ncclSuccess};
  std::thread thread;
  void start(NetApi* api, void* lc) {
    thread = std::thread([this, api, lc] {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(40);
      while (!stop.load() && std::chrono::steady_clock::now() < deadline) {
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
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (comm.load() == nullptr && result.load() == ncclSuccess &&
           std::chrono::steady_clock::now() < until) {
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

// The opening of a case whose peer process (nccl_plugin_peer) connects here: listen on `api`,
// accept in the background, run the peer with `env` and {"connect", HANDLE, then...}, and hand
// back the accepted comm. The peer runs to its end (run) or on a thread (start, then wait_peer).
// The destructor waits for the peer, stops accepting and closes the listener (unless
// close_listen did): an ASSERT that returns early leaves nothing running.
class ConnectingPeer {
 public:
  ConnectingPeer(NetApi& api, void* ctx) : api_(api) {
    listened_ = api_.listen(ctx, 0, handle_, &lc_);
    if (listened_ == ncclSuccess) acc_.start(&api_, lc_);
  }
  ConnectingPeer(const ConnectingPeer&) = delete;
  ConnectingPeer& operator=(const ConnectingPeer&) = delete;
  ~ConnectingPeer() {
    (void)wait_peer();
    acc_.join();
    (void)close_listen();
  }
  bool listening() const { return listened_ == ncclSuccess; }
  // The peer's run to its end: its exit status (run_peer's), its stdout in out().
  int run(const std::vector<std::string>& env, const std::vector<std::string>& then) {
    return rc_ = run_peer(env, args(then), &out_);
  }
  // The peer's run on a thread, meanwhile.
  void start(const std::vector<std::string>& env, const std::vector<std::string>& then) {
    peer_ = std::thread([this, env, a = args(then)] { rc_ = run_peer(env, a, &out_); });
  }
  // The peer's exit status, once it ended (the thread's, if start ran it).
  int wait_peer() {
    if (peer_.joinable()) peer_.join();
    return rc_;
  }
  // The accepted comm, waited for up to 20 s (nullptr: none, or accept failed).
  void* comm() { return acc_.wait_comm(); }
  // The comm accepted so far, without waiting (nullptr: none yet).
  void* accepted() const { return acc_.comm.load(); }
  // Stops accepting: what was accepted by then (nullptr: nothing).
  void* stop_accepting() {
    acc_.join();
    return acc_.comm.load();
  }
  // The accept's result so far (ncclSuccess while it goes on or once it gave a comm).
  int accept_result() const { return acc_.result.load(); }
  ncclResult_t close_listen() {
    if (lc_ == nullptr) return ncclSuccess;
    acc_.join();
    const ncclResult_t r = api_.close_listen(lc_);
    lc_ = nullptr;
    return r;
  }
  const std::string& out() const { return out_; }

 private:
  std::vector<std::string> args(const std::vector<std::string>& then) const {
    std::vector<std::string> a{"connect", handle_hex(handle_)};
    a.insert(a.end(), then.begin(), then.end());
    return a;
  }
  NetApi& api_;
  uint8_t handle_[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc_ = nullptr;
  ncclResult_t listened_ = ncclInternalError;
  Acceptor acc_;
  std::thread peer_;
  int rc_ = -1;
  std::string out_;
};

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
  // Two hosts over dpdk (GW_PLUGIN_TEST_XHOST_TRANSPORT=dpdk), found out once per process: one
  // connection across the hosts, after which the daemons have started their ports (each at its
  // first job); their rte_eal_init failure when EAL cannot start here, else "".
  std::string dpdk_unavailable() {
    static const std::string why = [this]() -> std::string {
      if (xhost_transport() != "dpdk") return "";
      ConnectingPeer peer(*api_, ctx_);
      if (!peer.listening()) return "";
      const int rc = peer.run({}, {"send"});
      bool received = false;
      if (void* comm = rc == 0 ? peer.comm() : peer.stop_accepting(); comm != nullptr) {
        Buffer in(8192);
        void* req = nullptr;
        std::vector<int> sizes;
        received = post_recv(*api_, comm, in.data, in.size, 3, nullptr, &req).empty() &&
                   wait_all(*api_, {req}, &sizes).empty() && sizes[0] == 4096 &&
                   check_pattern(in.data, 4096, 77) == -1;
        api_->close_recv(comm);
      }
      peer.close_listen();
      std::printf("over dpdk: a first connection across the hosts %s\n",
                  received ? "carried its 4096 bytes" : "failed");
      return dpdk_cannot_start();
    }();
    return why;
  }
  std::unique_ptr<NetApi> api_;
  void* ctx_ = nullptr;
};

}  // namespace gw::plugin_test
