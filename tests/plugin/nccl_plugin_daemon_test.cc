// Daemon mode of the plugin (GW_DAEMON; plugin/daemon_transport.h) across processes, with a
// gradwired this test starts (plugin_harness: GW_PLUGIN_TEST_GRADWIRED): a process of another job
// cannot connect to this job's endpoint, a rank killed mid-transfer fails its peer's request and
// not the other connections, a killed daemon fails every call promptly; and the figures, daemon
// mode against direct mode (tcp over lo), printed with the machine's ceilings (memcpy, loopback
// TCP) measured in the same run. The whole conformance suite runs in daemon mode as the ctest
// variants nccl_plugin_test.daemon and nccl_plugin_twoproc_test.daemon. The fixture:
// daemon_plugin_fixture.h; the dma-buf cases: nccl_plugin_daemon_dmabuf_test.cc (same binary).
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
#include "tests/plugin/daemon_plugin_fixture.h"
#include "tests/plugin/plugin_harness.h"
#include "tests/support/free_port.h"

namespace gw::plugin_test {
namespace {

using Clock = std::chrono::steady_clock;

TEST_F(DaemonPlugin, AProcessOfAnotherJobCannotConnect) {
  ConnectingPeer peer(*api_, ctx_);
  ASSERT_TRUE(peer.listening());
  // Another job's token: its connect fails (no hang) and the listener accepts nothing.
  EXPECT_EQ(peer.run({"GW_JOB_TOKEN=another-job", "GW_TIMEOUT_MS=2000"}, {"fail"}), 0);
  EXPECT_EQ(peer.accepted(), nullptr) << "a process of another job reached the listener";
  // The same job's process connects to the same endpoint and its message arrives.
  ASSERT_EQ(peer.run({}, {"send"}), 0);
  void* rc = peer.comm();
  ASSERT_NE(rc, nullptr) << "accept returned " << peer.accept_result();
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
  EXPECT_EQ(peer.close_listen(), ncclSuccess);
}

TEST_F(DaemonPlugin, RankKilledMidTransferFailsItsPeerAndNotOthers) {
  // A connection that lives through the death of the other process's.
  void *sc2 = nullptr, *rc2 = nullptr;
  ASSERT_EQ(connect_pair(*api_, ctx_, &sc2, &rc2), "");
  ConnectingPeer peer(*api_, ctx_);
  ASSERT_TRUE(peer.listening());
  peer.start({}, {"die"});
  void* rc = peer.comm();
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
  peer.wait_peer();
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
  EXPECT_EQ(peer.close_listen(), ncclSuccess);
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
    ConnectingPeer peer(*api_, ctx_);
    ASSERT_TRUE(peer.listening());
    const int rc = peer.run({}, {then});
    if (then == "send") {
      EXPECT_EQ(rc, 0);
    }
    void* comm = peer.comm();
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
    EXPECT_EQ(peer.close_listen(), ncclSuccess);
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
    ConnectingPeer peer(*api_, ctx_);
    ASSERT_TRUE(peer.listening());
    const int rc = peer.run({}, {then});
    void* comm = peer.comm();
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
    EXPECT_EQ(peer.close_listen(), ncclSuccess);
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
  ConnectingPeer peer(*api_, ctx_);
  ASSERT_TRUE(peer.listening());
  // The peer connects, sends its 4096 bytes (tag 3) and closes; its daemon stays until killed.
  peer.start({}, {"die"});
  void* rc = peer.comm();
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
  peer.wait_peer();
  EXPECT_EQ(r, ncclSystemError) << "the receive through a killed remote daemon must fail";
  EXPECT_EQ(done, 0);
  EXPECT_LT(s, 15.0) << "bounded by GW_TIMEOUT_MS, not a hang";
  std::printf("receive across hosts failed %.3f s after the remote daemon was killed\n", s);
  EXPECT_EQ(api_->close_recv(rc), ncclSuccess);
  EXPECT_EQ(peer.close_listen(), ncclSuccess);
}

}  // namespace
}  // namespace gw::plugin_test
