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
#include <thread>

#include "tests/plugin/plugin_harness.h"
#include "tests/support/free_port.h"

namespace gw::plugin_test {
namespace {

using Clock = std::chrono::steady_clock;

// What `gradwirectl ARGS` printed for the daemon at GW_DAEMON ("" when it cannot be run).
std::string gradwirectl(const std::string& args) {
  const char* d = getenv("GW_DAEMON");
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
    // or the one GW_PLUGIN_TEST_XHOST_TRANSPORT names: verbs under the emulator).
    const char* t = getenv("GW_PLUGIN_TEST_XHOST_TRANSPORT");
    const std::string want = t != nullptr ? t : "tcp";
    const std::string json = gradwirectl("--json jobs");
    EXPECT_NE(json.find("\"hosts\": 2"), std::string::npos) << json;
    EXPECT_NE(json.find("\"transport\": \"" + want + "\""), std::string::npos) << json;
  }
  EXPECT_EQ(api_->close_recv(rc), ncclSuccess);
  EXPECT_EQ(api_->close_listen(lc), ncclSuccess);
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

TEST_F(DaemonPlugin, FiguresAgainstDirectModeWithTheCeilings) {
  std::printf("ceiling: memcpy 64MiB %.2f GB/s, loopback TCP 64MiB %.2f GB/s\n", memcpy_gbps(),
              loopback_tcp_gbps());
  std::fflush(stdout);
  EXPECT_EQ(run_peer({"-GW_DAEMON", "-GW_PLUGIN_TEST_GRADWIRED"}, {"bench"}), 0);
  EXPECT_EQ(run_peer({}, {"bench"}), 0);
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
  EXPECT_EQ(run_peer(direct, {"bench"}), 0);
  std::vector<std::string> one_daemon = not_peer;
  one_daemon.push_back(std::string("GW_DAEMON=") + a);
  EXPECT_EQ(run_peer(one_daemon, {"bench"}), 0);
  EXPECT_EQ(run_peer({}, {"bench-xhost"}), 0);
}

// Two hosts only (the ctest variant nccl_plugin_daemon_test.xhost, GW_PLUGIN_TEST_XHOST=1): the
// daemon of the connector's host killed while this host's receive from it is pending fails the
// receive promptly (the daemons' connection closes), never a hang. Last: it kills daemon b.
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

namespace gw::plugin_test {
namespace {

// The state `gradwirectl --json jobs` gives the daemon's one job (the connection's), once it is
// not `running` any more or 10 s have passed; "" when the daemon lists no job or several.
std::string connection_job_state() {
  std::string json;
  for (const auto t0 = Clock::now(); Clock::now() - t0 < std::chrono::seconds(10);) {
    json = gradwirectl("--json jobs");
    const size_t first = json.find("\"job\":");
    if (first == std::string::npos || json.find("\"job\":", first + 1) != std::string::npos) {
      return "";
    }
    const size_t at = json.find("\"state\": \"");
    if (at == std::string::npos) return "";
    const std::string state = json.substr(at + 10, json.find('"', at + 10) - at - 10);
    if (state != "running") return state;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return "running";
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
