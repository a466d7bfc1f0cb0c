// Two gradwired daemons on this machine (two sockets in a temporary directory, two fake hosts by
// GW_HOSTID / --host-id), two trainer processes each, the C ABI in daemon mode (GW_DAEMON):
// allreduce / broadcast / allgather / barrier across every dtype with results checked, a trainer
// SIGKILLed mid-collective (the others fail with GW_ERR_PEER within the deadline and the daemons
// reclaim its arena), and a daemon SIGKILLed under its trainers (they fail, never hang); and
// gradwirectl asking a daemon about its trainers (tables and JSON), or finding none; and
// sd_notify readiness, watchdog and stopping on a NOTIFY_SOCKET the test owns.
// Every process is killed and the directory removed even when a check fails.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "tests/integration/proc_harness.h"

namespace gw::test {
namespace {

constexpr int kTimeoutMs = 6000;
constexpr int kSlackMs = 4000;  // process start-up on a loaded 2-core machine, ASan included
constexpr int kGwErrPeer = 3;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/gwd-it-XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The daemons and trainers of one test; the ProcGroups kill whatever still runs on destruction.
class DaemonPair {
 public:
  explicit DaemonPair(const TempDir& dir) : dir_(dir) {}

  // Starts daemons A and B and waits for both to listen; false (with output) if one did not.
  // metrics_port > 0: daemon A serves Prometheus metrics there.
  bool start(int metrics_port = 0) {
    for (int h = 0; h < 2; ++h) {
      Env env = clean_env();
      env["GW_LOG_LEVEL"] = "info";
      for (const auto& [k, v] : extra_env_[h]) env[k] = v;
      std::vector<std::string> argv = {GRADWIRED_PATH, "--foreground", "--socket",
                                       socket(h),      "--host-id",    host(h)};
      if (h == 0 && metrics_port > 0) {
        argv.push_back("--metrics");
        argv.push_back("127.0.0.1:" + std::to_string(metrics_port));
      }
      daemons_.start(argv, env);
    }
    for (size_t h = 0; h < 2; ++h) {
      if (!daemons_.wait_for_output(h, "listening", 20000)) {
        ADD_FAILURE() << "daemon " << h << " did not start:\n" << daemons_.output(h);
        return false;
      }
      std::smatch m;
      std::string out = daemons_.output(h);
      if (std::regex_search(out, m, std::regex("pid ([0-9]+)"))) pid_[h] = std::stoi(m[1]);
    }
    return pid_[0] > 0 && pid_[1] > 0;
  }

  // More environment for daemon h (before start()).
  void set_env(int h, const std::string& key, const std::string& value) {
    extra_env_[h][key] = value;
  }

  std::string socket(int h) const { return dir_.path() + (h == 0 ? "/a.sock" : "/b.sock"); }
  static std::string host(int h) { return h == 0 ? "fake-host-a" : "fake-host-b"; }
  // Ranks 0 and 2 on host A, 1 and 3 on host B: the host layout is not by blocks of ranks.
  static int host_of(int rank) { return rank % 2; }
  pid_t pid(int h) const { return pid_[h]; }
  std::string daemon_output(int h) const { return daemons_.output(h); }
  // Whether daemon h has written `text` (waiting up to ms for its output).
  bool daemon_said(int h, const std::string& text, int ms) {
    return daemons_.wait_for_output(static_cast<size_t>(h), text, ms);
  }

  // port 0: no store (a world of one). hostid: another host identity than the daemon's.
  size_t start_trainer(ProcGroup& g, int rank, int world, int port, std::vector<std::string> args,
                       const std::string& hostid = "") {
    return start_trainer_on(g, host_of(rank), rank, world, port, std::move(args), hostid);
  }
  // The same on host h (0: A, 1: B) whatever the rank.
  size_t start_trainer_on(ProcGroup& g, int h, int rank, int world, int port,
                          std::vector<std::string> args, const std::string& hostid = "",
                          const std::string& arena = "16M", const Env& extra = {}) {
    Env env = clean_env();
    for (const auto& [k, v] : extra) env[k] = v;
    env["GW_DAEMON"] = "unix:" + socket(h);
    env["GW_HOSTID"] = hostid.empty() ? host(h) : hostid;
    env["GW_DAEMON_ARENA"] = arena;
    return g.start(trainer_argv(rank, world, port, args), env);
  }

  // A trainer in direct mode (no GW_DAEMON), posing as host h.
  size_t start_direct_trainer(ProcGroup& g, int h, int rank, int world, int port,
                              std::vector<std::string> args) {
    Env env = clean_env();
    env["GW_HOSTID"] = host(h);
    return g.start(trainer_argv(rank, world, port, args), env);
  }

  // daemon_trainer's command line (port 0: no store).
  static std::vector<std::string> trainer_argv(int rank, int world, int port,
                                               const std::vector<std::string>& args) {
    std::vector<std::string> argv = {
        DAEMON_TRAINER_PATH,   "--rank",       std::to_string(rank),      "--world",
        std::to_string(world), "--timeout-ms", std::to_string(kTimeoutMs)};
    if (port != 0) {
      argv.push_back("--store");
      argv.push_back("127.0.0.1:" + std::to_string(port));
    }
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  // Memfd arenas still mapped in daemon h (its /proc maps).
  int arenas(int h) const {
    std::ifstream f("/proc/" + std::to_string(pid_[h]) + "/maps");
    int n = 0;
    for (std::string line; std::getline(f, line);) {
      if (line.find("gwd-arena") != std::string::npos) ++n;
    }
    return n;
  }

 private:
  const TempDir& dir_;
  ProcGroup daemons_;
  pid_t pid_[2] = {0, 0};
  Env extra_env_[2];
};

// GET /metrics from 127.0.0.1:port ("" when nothing answers).
std::string scrape(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const char req[] = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if (::send(fd, req, sizeof(req) - 1, 0) > 0) {
      char buf[4096];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, n);
    }
  }
  ::close(fd);
  return out;
}

// The value of the first sample line starting with `metric` (-1 when absent).
double sample(const std::string& text, const std::string& metric) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(metric + " ", 0) == 0) return std::stod(line.substr(metric.size() + 1));
  }
  return -1;
}

// The sum of every sample of `metric` whose labels contain each of `labels` (-1 when none).
double sum_samples(const std::string& text, const std::string& metric,
                   const std::vector<std::string>& labels = {}) {
  std::istringstream in(text);
  double sum = -1;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(metric + "{", 0) != 0 && line.rfind(metric + " ", 0) != 0) continue;
    const size_t space = line.rfind(' ');
    const std::string head = line.substr(0, space);
    bool all = true;
    for (const auto& l : labels) all = all && head.find(l) != std::string::npos;
    if (!all) continue;
    sum = (sum < 0 ? 0 : sum) + std::stod(line.substr(space + 1));
  }
  return sum;
}

bool eventually(const std::function<bool()>& pred, int ms) {
  for (int i = 0; i < ms / 20; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

TEST(DaemonIntegration, TwoHostsTwoTrainersEveryCollectiveAndDtype) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);
#if defined(GW_HAVE_PROMETHEUS)
  const int metrics_port = free_port();
#else
  const int metrics_port = 0;
#endif
  ASSERT_TRUE(d.start(metrics_port));
  for (const char* count : {"1", "1000", "70001"}) {
    ProcGroup g;
    const int port = free_port();
    for (int r = 0; r < 4; ++r) d.start_trainer(g, r, 4, port, {"suite", count});
    auto results = g.wait_all(240000, true);
    ASSERT_EQ(results.size(), 4u);
    for (size_t r = 0; r < results.size(); ++r) {
      EXPECT_NE(results[r].output.find("RESULT rank=" + std::to_string(r) + " status=0"),
                std::string::npos)
          << results[r].describe();
      EXPECT_TRUE(results[r].exited && results[r].exit_code == 0)
          << "count " << count << " rank " << r << ": " << results[r].describe() << "\ndaemon A:\n"
          << d.daemon_output(0) << "\ndaemon B:\n"
          << d.daemon_output(1);
    }
    if (::testing::Test::HasFailure()) return;
  }
  // Every trainer has gone: so have their arenas.
  EXPECT_TRUE(eventually([&] { return d.arenas(0) == 0 && d.arenas(1) == 0; }, 5000))
      << d.arenas(0) << " " << d.arenas(1);
  if (metrics_port == 0) GTEST_SKIP() << "built without prometheus-cpp: no metrics to check";
  // Daemon A ran the inter-host leg of every collective over tcp.
  const std::string text = scrape(metrics_port);
  const double inter = sample(text, "gradwired_phase_seconds_count{phase=\"inter_host\"}");
  EXPECT_GE(inter, 10) << text;
  EXPECT_EQ(sample(text, "gradwired_phase_seconds_bucket{phase=\"inter_host\",le=\"+Inf\"}"), inter)
      << text;
  EXPECT_GT(sample(text, "gradwired_phase_seconds_sum{phase=\"inter_host\"}"), 0) << text;
  EXPECT_GT(sample(text, "gradwired_bytes_total{transport=\"tcp\",direction=\"out\"}"), 0) << text;
  EXPECT_GT(sample(text, "gradwired_bytes_total{transport=\"tcp\",direction=\"in\"}"), 0) << text;
  EXPECT_GE(sample(text, "gradwired_collectives_total{kind=\"reduce_scatter\",result=\"ok\"}"), 1)
      << text;
}

#if defined(GW_TEST_DPDK)
// The daemons own a DPDK port each (the two ends of a net_memif pair: no privileges, no NIC) and
// run the inter-host leg over it: every collective and dtype of the suite, 2 hosts x 2 trainers,
// twice on the same daemons (the second job reuses the ports: EAL is once per process). The
// daemons' GW_DAEMON_TRANSPORT is left at auto: given a port, each offers dpdk first. Each
// daemon starts its port when its first job needs it, so which end of the pair comes up first
// varies: before the client port learned to connect again (check_link), this failed in about
// a third of the runs with "connecting with rank 1: not established within N ms".
TEST(DaemonIntegration, DaemonsOverDpdkRunEveryCollective) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);
  const std::string eal =
      "-l 0 --no-huge -m 512 --no-pci --no-shconf --no-telemetry --log-level=*:error --vdev "
      "net_memif0,id=0,socket=/gw-daemon-it-" +
      std::to_string(getpid()) + ".sock";
  for (int h = 0; h < 2; ++h) {
    d.set_env(h, "GW_DPDK_IP", h == 0 ? "10.70.0.1" : "10.70.0.2");
    d.set_env(h, "GW_DPDK_EAL_ARGS",
              eal + (h == 0 ? ",role=server,mac=02:70:00:00:00:01"
                            : ",role=client,mac=02:70:00:00:00:02"));
  }
#if defined(GW_HAVE_PROMETHEUS)
  const int metrics_port = free_port();
#else
  const int metrics_port = 0;
#endif
  ASSERT_TRUE(d.start(metrics_port));
  EXPECT_TRUE(d.daemon_said(0, "between daemons: auto offers dpdk,tcp", 1000))
      << d.daemon_output(0);
  for (const char* count : {"1000", "70001"}) {
    ProcGroup g;
    const int port = free_port();
    for (int r = 0; r < 4; ++r) d.start_trainer(g, r, 4, port, {"suite", count});
    auto results = g.wait_all(240000, true);
    ASSERT_EQ(results.size(), 4u);
    if (results[0].output.find("rte_eal_init") != std::string::npos) {
      GTEST_SKIP() << "DPDK cannot start here: " << results[0].output;
    }
    for (size_t r = 0; r < results.size(); ++r) {
      EXPECT_TRUE(results[r].exited && results[r].exit_code == 0)
          << "count " << count << " rank " << r << ": " << results[r].describe() << "\ndaemon A:\n"
          << d.daemon_output(0) << "\ndaemon B:\n"
          << d.daemon_output(1);
    }
    if (::testing::Test::HasFailure()) return;
  }
  // The daemons really went over DPDK: each opened its end of the pair.
  for (int h = 0; h < 2; ++h) {
    EXPECT_TRUE(d.daemon_said(h, "dpdk: engine on net_memif0", 5000)) << d.daemon_output(h);
  }
  if (metrics_port == 0) return;
  const std::string text = scrape(metrics_port);
  EXPECT_GT(sample(text, "gradwired_bytes_total{transport=\"dpdk\",direction=\"out\"}"), 0) << text;
  EXPECT_EQ(sample(text, "gradwired_bytes_total{transport=\"tcp\",direction=\"out\"}"), 0) << text;
}

// Daemons that offer different transports meet over the best they share: A has a DPDK port
// (offers dpdk,tcp), B has none (tcp): their job runs over tcp, A says why, and gradwirectl shows
// the job's transport. A daemon told to use a transport it cannot use here refuses to start.
TEST(DaemonIntegration, DaemonsWithDifferentOffersMeetOverWhatTheyShare) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);
  d.set_env(0, "GW_DPDK_IP", "10.71.0.1");
  d.set_env(0, "GW_DPDK_EAL_ARGS",
            "-l 0 --no-huge -m 512 --no-pci --no-shconf --no-telemetry --log-level=*:error "
            "--vdev net_memif0,id=0,socket=/gw-daemon-mixed-" +
                std::to_string(getpid()) + ".sock,role=server");
  ASSERT_TRUE(d.start());
  EXPECT_TRUE(d.daemon_said(0, "auto offers dpdk,tcp", 1000)) << d.daemon_output(0);
  EXPECT_TRUE(d.daemon_said(1, "auto offers tcp (", 1000)) << d.daemon_output(1);
  ProcGroup g;
  const int port = free_port();
  for (int r = 0; r < 4; ++r) d.start_trainer(g, r, 4, port, {"suite", "1000"});
  auto results = g.wait_all(120000, true);
  ASSERT_EQ(results.size(), 4u);
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].exited && results[r].exit_code == 0)
        << "rank " << r << ": " << results[r].describe() << "\ndaemon A:\n"
        << d.daemon_output(0) << "\ndaemon B:\n"
        << d.daemon_output(1);
  }
  EXPECT_TRUE(
      d.daemon_said(0, "runs over tcp, not dpdk: host 0 offers dpdk,tcp; host 1 offers tcp", 5000))
      << d.daemon_output(0);
  // No port was started for a job that did not need it.
  EXPECT_EQ(d.daemon_output(0).find("EAL up"), std::string::npos) << d.daemon_output(0);

  // Named transports this host cannot use: refused at start, saying why.
  for (const std::string& bad : {std::string("verbs"), std::string("shm"), std::string("nosuch")}) {
    ProcGroup p;
    Env env = clean_env();
    p.start(
        {GRADWIRED_PATH, "--foreground", "--socket", dir.path() + "/bad.sock", "--transport", bad},
        env);
    auto res = p.wait_all(20000, true);
    ASSERT_EQ(res.size(), 1u);
    EXPECT_TRUE(res[0].exited && res[0].exit_code != 0) << bad << ": " << res[0].describe();
    EXPECT_NE(res[0].output.find("GW_DAEMON_TRANSPORT"), std::string::npos)
        << bad << ": " << res[0].output;
  }
}
#endif

// Uneven hosts (ranks 0, 2, 3 on A; 1 on B), then one host (all four on A): alltoall, the
// compressed allreduce, split and chunked allreduce/broadcast beyond the arena (the trainer's
// "extra" scenario checks every result); then 3+1 again with a 128 MiB arena and 72 MiB buffers,
// so the chunks (8 MiB) are cut in pieces the daemons pipeline; last, every collective and dtype
// of the suite on 3+1 (allgather and reduce_scatter cross hosts in slots padded to 3 blocks).
TEST(DaemonIntegration, AlltoallCompressedSplitAndChunksOnUnevenAndSingleHosts) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);
  ASSERT_TRUE(d.start());
  for (int run = 0; run < 4; ++run) {
    const bool one_host = run == 1;
    const bool pipelined = run == 2;
    const bool suite = run == 3;
    ProcGroup g;
    const int port = free_port();
    for (int r = 0; r < 4; ++r) {
      std::vector<std::string> args = {suite ? "suite" : "extra", "1001"};
      if (pipelined) args.push_back("72");
      d.start_trainer_on(g, one_host || r != 1 ? 0 : 1, r, 4, port, args, "",
                         pipelined ? "128M" : "16M");
    }
    auto results = g.wait_all(240000, true);
    ASSERT_EQ(results.size(), 4u);
    for (size_t r = 0; r < results.size(); ++r) {
      EXPECT_TRUE(results[r].exited && results[r].exit_code == 0)
          << (one_host    ? "one host"
              : pipelined ? "3+1 hosts, pipelined"
              : suite     ? "3+1 hosts, suite"
                          : "3+1 hosts")
          << " rank " << r << ": " << results[r].describe() << "\ndaemon A:\n"
          << d.daemon_output(0) << "\ndaemon B:\n"
          << d.daemon_output(1);
      if (suite) continue;
      EXPECT_NE(
          results[r].output.find("DESCRIBE rank=" + std::to_string(r) + " daemon_transport=tcp"),
          std::string::npos)
          << results[r].output;
      EXPECT_NE(results[r].output.find("transport=daemon"), std::string::npos) << results[r].output;
      // Across hosts, every trainer's share of the compressed bytes is counted.
      if (!one_host) {
        EXPECT_EQ(results[r].output.find(" sent=0 "), std::string::npos) << results[r].output;
      }
    }
    if (::testing::Test::HasFailure()) return;
  }
}

// Every rank must cut chunks and slices alike, and each rank's chunk comes from its own
// GW_DAEMON_CHUNK and arena: ranks whose chunks differ (rank 1's 512 KiB, the others' 1 MiB of a
// 16 MiB arena) agree on the least (a split child too), and the trainer's "extra" scenario (chunked
// allreduce and broadcast, sliced allgather, reduce_scatter and alltoall, each result checked)
// passes on 3+1.
TEST(DaemonIntegration, RanksWithDifferentChunksCutAlikeAtTheLeast) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);
  ASSERT_TRUE(d.start());
  ProcGroup g;
  const int port = free_port();
  for (int r = 0; r < 4; ++r) {
    Env extra = {{"GW_LOG_LEVEL", "info"}};
    if (r == 1) extra["GW_DAEMON_CHUNK"] = "512K";
    d.start_trainer_on(g, r == 1 ? 1 : 0, r, 4, port, {"extra", "1001"}, "", "16M", extra);
  }
  auto results = g.wait_all(240000, true);
  ASSERT_EQ(results.size(), 4u);
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].exited && results[r].exit_code == 0)
        << "rank " << r << ": " << results[r].describe() << "\ndaemon A:\n"
        << d.daemon_output(0) << "\ndaemon B:\n"
        << d.daemon_output(1);
    if (r != 1) {
      EXPECT_NE(results[r].output.find("daemon mode: chunks of 512 KiB (rank 1's)"),
                std::string::npos)
          << results[r].output;
    }
  }
}

// A job of ranks in daemon mode and ranks in direct mode (a GW_DAEMON set on some nodes only)
// fails at once on every rank, naming who runs how, instead of each waiting out its deadline
// for keys the others never write. Rank 0 hosts the store in either mode.
TEST(DaemonIntegration, AJobOfDaemonAndDirectRanksFailsAtOnceOnEveryRank) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);
  ASSERT_TRUE(d.start());
  for (int direct_rank = 0; direct_rank < 2; ++direct_rank) {
    ProcGroup g;
    const int port = free_port();
    for (int r = 0; r < 3; ++r) {
      if (r == direct_rank) {
        d.start_direct_trainer(g, r % 2, r, 3, port, {"suite", "100"});
      } else {
        d.start_trainer_on(g, r % 2, r, 3, port, {"suite", "100"});
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto results = g.wait_all(60000);
    const auto took = std::chrono::steady_clock::now() - t0;
    ASSERT_EQ(results.size(), 3u);
    for (size_t r = 0; r < results.size(); ++r) {
      EXPECT_EQ(results[r].exit_code, 10 + 1) << results[r].describe();  // GW_ERR_INVALID_ARG
      const std::string want = "rank " + std::to_string(direct_rank) + " in direct mode";
      EXPECT_NE(results[r].output.find(want), std::string::npos) << results[r].describe();
      EXPECT_NE(results[r].output.find("in daemon mode"), std::string::npos)
          << results[r].describe();
    }
    EXPECT_LT(took, std::chrono::milliseconds(kTimeoutMs)) << "waited out the deadline";
  }
}

// A rank that cannot join its daemon (here: one refused for a host identity that is not its
// daemon's) fails at once, and says so in the store: the others fail at creation naming it,
// without waiting out their deadline for its part of the set-up.
TEST(DaemonIntegration, ARankThatCannotJoinItsDaemonFailsTheOthersAtOnce) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);
  ASSERT_TRUE(d.start());
  for (int lost : {2, 0}) {
    ProcGroup g;
    const int port = free_port();
    for (int r = 0; r < 3; ++r) {
      d.start_trainer(g, r, 3, port, {"suite", "10"}, r == lost ? "not-this-host" : "");
    }
    auto results = g.wait_all(60000);
    ASSERT_EQ(results.size(), 3u);
    for (size_t r = 0; r < results.size(); ++r) {
      EXPECT_TRUE(results[r].exited && results[r].exit_code != 0) << results[r].describe();
      if (static_cast<int>(r) == lost) {
        EXPECT_NE(results[r].output.find("host identity"), std::string::npos)
            << results[r].describe();
      } else {
        // Rank 0 too: it keeps the store it hosts until the others have read why.
        const std::string want = "rank " + std::to_string(lost) + " could not join its daemon";
        EXPECT_NE(results[r].output.find(want), std::string::npos) << results[r].describe();
      }
      // Within the deadline by far, from each process's own start of gw_comm_init.
      auto fields = parse_tagged_line(results[r].output, "RESULT");
      ASSERT_TRUE(fields.has_value()) << results[r].describe();
      EXPECT_LT(std::stod((*fields)["elapsed_ms"]), kTimeoutMs / 2) << results[r].describe();
    }
  }
}

// Rank 0 hosts the store: its gw_comm_init returns only once every rank is done with it, so a
// rank 0 that leaves at once (a check script, a torch group created and destroyed) cannot take the
// store from another rank's set-up.
TEST(DaemonIntegration, RankZeroMayLeaveRightAfterInit) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);
  ASSERT_TRUE(d.start());
  for (int round = 0; round < 10; ++round) {
    ProcGroup g;
    const int port = free_port();
    for (int r = 0; r < 4; ++r) d.start_trainer(g, r, 4, port, {"init"});
    auto results = g.wait_all(60000);
    ASSERT_EQ(results.size(), 4u);
    for (const auto& res : results) {
      ASSERT_TRUE(res.exited && res.exit_code == 0) << "round " << round << ": " << res.describe();
    }
  }
}

TEST(DaemonIntegration, ASingleTrainerJobAndARefusedTrainerOfAnotherHost) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);
#if defined(GW_HAVE_PROMETHEUS)
  const int metrics_port = free_port();
#else
  const int metrics_port = 0;
#endif
  ASSERT_TRUE(d.start(metrics_port));
  ProcGroup g;
  d.start_trainer(g, 0, 1, 0, {"suite", "100"});
  d.start_trainer(g, 0, 1, 0, {"suite", "100"}, "not-this-host");
  auto results = g.wait_all(60000);
  EXPECT_TRUE(results[0].exited && results[0].exit_code == 0) << results[0].describe();
  EXPECT_EQ(results[1].exit_code, 10 + 1) << results[1].describe();  // GW_ERR_INVALID_ARG
  EXPECT_NE(results[1].output.find("host identity"), std::string::npos) << results[1].describe();
  if (metrics_port == 0) GTEST_SKIP() << "built without prometheus-cpp: no metrics to check";
  // The daemon's Prometheus endpoint counts what happened.
  const std::string text = scrape(metrics_port);
  EXPECT_GE(sample(text, "gradwired_clients_refused_total"), 1) << text;
  EXPECT_GE(sample(text, "gradwired_clients_accepted_total"), 1) << text;
  EXPECT_GE(sum_samples(text, "gradwired_collectives_total", {"result=\"ok\""}), 100) << text;
  // By kind, errors by kind, bytes, phases (docs/daemon.md).
  EXPECT_GE(sample(text, "gradwired_collectives_total{kind=\"allreduce\",result=\"ok\"}"), 1)
      << text;
  EXPECT_GE(sample(text, "gradwired_collectives_total{kind=\"broadcast\",result=\"ok\"}"), 1)
      << text;
  EXPECT_GE(sample(text, "gradwired_collectives_total{kind=\"allgather\",result=\"ok\"}"), 1)
      << text;
  EXPECT_EQ(sum_samples(text, "gradwired_collectives_total", {"result=\"error\""}), 0) << text;
  EXPECT_EQ(sample(text, "gradwired_errors_total{kind=\"hello\"}"), 1) << text;  // the foreign host
  EXPECT_EQ(sample(text, "gradwired_errors_total{kind=\"collective\"}"), 0) << text;
  EXPECT_GT(sample(text, "gradwired_bytes_total{transport=\"arena\",direction=\"in\"}"), 0) << text;
  EXPECT_GT(sample(text, "gradwired_bytes_total{transport=\"arena\",direction=\"out\"}"), 0)
      << text;
  EXPECT_EQ(sample(text, "gradwired_bytes_total{transport=\"tcp\",direction=\"out\"}"), 0)
      << text;  // a world of one crosses no host
  const double reduces = sample(text, "gradwired_phase_seconds_count{phase=\"local_reduce\"}");
  EXPECT_GE(reduces, 100) << text;
  EXPECT_EQ(sample(text, "gradwired_phase_seconds_bucket{phase=\"local_reduce\",le=\"+Inf\"}"),
            reduces)
      << text;
  EXPECT_EQ(sample(text, "gradwired_phase_seconds_count{phase=\"inter_host\"}"), 0) << text;
  EXPECT_TRUE(
      eventually([&] { return sample(scrape(metrics_port), "gradwired_arenas") == 0; }, 5000));
}

TEST(DaemonIntegration, KilledTrainerFailsTheOthersWithPeerWithinTheDeadline) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);
  ASSERT_TRUE(d.start());
  // 1 MiB allreduces; then 24 MiB ones through 128 MiB arenas, which the daemons pipeline in
  // pieces (the death lands in the middle of a pipelined collective).
  for (bool pipelined : {false, true}) {
    SCOPED_TRACE(pipelined ? "pipelined" : "1 MiB");
    ProcGroup g;
    const int port = free_port();
    const int killer = 3;  // on host B
    for (int r = 0; r < 4; ++r) {
      std::vector<std::string> args = {"die", std::to_string(killer)};
      if (pipelined) args.push_back(std::to_string(6 << 20));
      d.start_trainer_on(g, DaemonPair::host_of(r), r, 4, port, args, "",
                         pipelined ? "128M" : "16M");
    }
    auto results = g.wait_all(kTimeoutMs * 4 + kSlackMs * 4);
    ASSERT_EQ(results[killer].signal, SIGKILL) << results[killer].describe();
    for (int r = 0; r < 4; ++r) {
      if (r == killer) continue;
      const auto& res = results[r];
      ASSERT_FALSE(res.timed_out) << "rank " << r << " hung: " << res.describe();
      EXPECT_TRUE(res.exited) << res.describe();
      EXPECT_EQ(res.exit_code, 10 + kGwErrPeer) << "rank " << r << ": " << res.describe();
      auto fields = parse_tagged_line(res.output, "RESULT");
      ASSERT_TRUE(fields.has_value()) << res.describe();
      EXPECT_LE(std::stod((*fields)["elapsed_ms"]), kTimeoutMs + kSlackMs) << res.describe();
    }
    EXPECT_TRUE(eventually([&] { return d.arenas(0) == 0 && d.arenas(1) == 0; }, 5000))
        << d.arenas(0) << " " << d.arenas(1);
  }
  // Both daemons let go of every arena of the job, the dead trainer's included; and they still
  // serve a new job afterwards.
  EXPECT_TRUE(eventually([&] { return d.arenas(0) == 0 && d.arenas(1) == 0; }, 5000))
      << d.arenas(0) << " " << d.arenas(1);
  ProcGroup again;
  const int port2 = free_port();
  for (int r = 0; r < 4; ++r) d.start_trainer(again, r, 4, port2, {"suite", "33"});
  for (const auto& res : again.wait_all(120000, true)) {
    EXPECT_TRUE(res.exited && res.exit_code == 0) << res.describe();
  }
}

TEST(DaemonIntegration, KilledDaemonFailsItsTrainersInsteadOfHanging) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);
  ASSERT_TRUE(d.start());
  ProcGroup g;
  const int port = free_port();
  for (int r = 0; r < 4; ++r) d.start_trainer(g, r, 4, port, {"loop"});
  for (size_t r = 0; r < 4; ++r) {
    ASSERT_TRUE(g.wait_for_output(r, "LOOPING", 30000)) << g.output(r);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(::kill(d.pid(1), SIGKILL), 0);
  auto results = g.wait_all(kTimeoutMs * 2 + kSlackMs * 2);
  for (size_t r = 0; r < results.size(); ++r) {
    const auto& res = results[r];
    ASSERT_FALSE(res.timed_out) << "rank " << r << " hung: " << res.describe();
    EXPECT_TRUE(res.exited) << res.describe();
    EXPECT_GT(res.exit_code, 10) << res.describe();
    auto fields = parse_tagged_line(res.output, "RESULT");
    ASSERT_TRUE(fields.has_value()) << res.describe();
    EXPECT_LE(std::stod((*fields)["elapsed_ms"]), kTimeoutMs + kSlackMs) << res.describe();
    if (DaemonPair::host_of(static_cast<int>(r)) == 1) {
      EXPECT_EQ(res.exit_code, 10 + kGwErrPeer) << res.describe();  // their daemon is gone
    }
  }
}

// Runs gradwirectl with `args`; its result (output and exit code).
ProcResult gradwirectl(const std::vector<std::string>& args) {
  ProcGroup g;
  std::vector<std::string> argv = {GRADWIRECTL_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  g.start(argv, clean_env());
  auto r = g.wait_all(30000);
  return r.empty() ? ProcResult{} : r[0];
}

// The JSON document in a gradwirectl --json output (discarded when there is none).
nlohmann::json json_of(const ProcResult& r) {
  return nlohmann::json::parse(r.output, nullptr, /*allow_exceptions=*/false);
}

TEST(DaemonIntegration, GradwirectlDescribesTheDaemonItsJobAndItsTrainers) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);
  ASSERT_TRUE(d.start());
  ProcGroup g;
  const int port = free_port();
  for (int r = 0; r < 4; ++r) d.start_trainer(g, r, 4, port, {"loop"});
  for (size_t r = 0; r < 4; ++r) {
    ASSERT_TRUE(g.wait_for_output(r, "LOOPING", 30000)) << g.output(r);
  }
  const std::string sock = d.socket(0);  // host A: ranks 0 and 2

  ProcResult status = gradwirectl({"status", "--socket", sock});
  ASSERT_EQ(status.exit_code, 0) << status.describe();
  EXPECT_NE(status.output.find("pid                 " + std::to_string(d.pid(0))),
            std::string::npos)
      << status.output;
  EXPECT_NE(status.output.find("host id             fake-host-a"), std::string::npos)
      << status.output;
  EXPECT_NE(status.output.find("clients             2\n"), std::string::npos) << status.output;
  auto st = json_of(gradwirectl({"status", "--json", "--socket", sock}));
  ASSERT_TRUE(st.is_object()) << st;
  EXPECT_EQ(st["pid"], d.pid(0));
  EXPECT_EQ(st["clients"], 2);
  EXPECT_EQ(st["jobs"], 1);
  EXPECT_EQ(st["control_socket"], sock + ".ctl");

  // The job: 4 ranks over 2 hosts, both local trainers in, collectives counted as they run.
  ProcResult jobs = gradwirectl({"jobs", "--socket", sock});
  ASSERT_EQ(jobs.exit_code, 0) << jobs.describe();
  EXPECT_TRUE(std::regex_search(jobs.output, std::regex("\\n[0-9a-f]{16} +4 +2 +0 +2/2 +running ")))
      << jobs.output;
  EXPECT_TRUE(eventually(
      [&] {
        auto j = json_of(gradwirectl({"jobs", "--json", "--socket", sock}));
        return j.is_array() && j.size() == 1 && j[0]["collectives"].get<int>() > 0;
      },
      20000));

  // The trainers: ranks 0 and 2, each a daemon_trainer process of this uid.
  auto clients = json_of(gradwirectl({"clients", "--json", "--socket", sock}));
  ASSERT_TRUE(clients.is_array()) << clients;
  ASSERT_EQ(clients.size(), 2u) << clients;
  std::set<int> ranks;
  for (const auto& c : clients) {
    ranks.insert(c["rank"].get<int>());
    EXPECT_EQ(c["uid"].get<int64_t>(), ::geteuid());
    EXPECT_EQ(c["arena_bytes"], 16 << 20);
    std::ifstream comm("/proc/" + std::to_string(c["pid"].get<int64_t>()) + "/comm");
    std::string name;
    std::getline(comm, name);
    EXPECT_EQ(name, "daemon_trainer") << c;
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 2}));
  ProcResult table = gradwirectl({"clients", "--socket", sock});
  ASSERT_EQ(table.exit_code, 0) << table.describe();
  EXPECT_NE(table.output.find("RANK"), std::string::npos) << table.output;
  for (const auto& c : clients) {
    EXPECT_NE(table.output.find(std::to_string(c["pid"].get<int64_t>())), std::string::npos)
        << table.output;
  }

  // Its settings, with where each came from.
  ProcResult config = gradwirectl({"config", "--socket", sock});
  ASSERT_EQ(config.exit_code, 0) << config.describe();
  EXPECT_TRUE(
      std::regex_search(config.output, std::regex("GW_DAEMON_SOCKET +" + sock + " +command line")))
      << config.output;
  auto cfg = json_of(gradwirectl({"config", "--json", "--socket", sock}));
  ASSERT_TRUE(cfg.is_array()) << cfg;
  bool host_row = false;
  for (const auto& r : cfg) {
    if (r["name"] == "GW_HOSTID") host_row = r["value"] == "fake-host-a";
  }
  EXPECT_TRUE(host_row) << cfg;
}

// A secret is shown as set or unset, never by value (issue 33, item 7): the daemon's job token
// from its environment stays out of `gradwirectl config`, table and JSON.
TEST(DaemonIntegration, GradwirectlConfigShowsTheJobTokenOnlyAsSet) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string sock = dir.path() + "/d.sock";
  ProcGroup daemons;
  Env env = clean_env();
  env["GW_JOB_TOKEN"] = "s3cret-daemon-token";
  daemons.start({GRADWIRED_PATH, "--foreground", "--socket", sock}, env);
  ASSERT_TRUE(daemons.wait_for_output(0, "listening", 20000)) << daemons.output(0);
  ProcResult table = gradwirectl({"config", "--socket", sock});
  ASSERT_EQ(table.exit_code, 0) << table.describe();
  EXPECT_EQ(table.output.find("s3cret"), std::string::npos) << table.output;
  EXPECT_TRUE(std::regex_search(table.output, std::regex("GW_JOB_TOKEN +\\(set\\)")))
      << table.output;
  ProcResult raw = gradwirectl({"config", "--json", "--socket", sock});
  EXPECT_EQ(raw.output.find("s3cret"), std::string::npos) << raw.output;
  bool shown = false;
  for (const auto& r : json_of(raw)) {
    if (r["name"] == "GW_JOB_TOKEN") shown = r["value"] == "(set)";
  }
  EXPECT_TRUE(shown) << raw.output;
}

// --group numbers that are no gid are refused with a message (issue 33, item 4): 2^32 would
// wrap to gid 0 (root's group), 2^32-1 is chown's "no change", and a number past 2^64 used to
// end in an uncaught exception.
TEST(DaemonIntegration, GroupNumbersOutOfRangeAreRefused) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  for (const std::string bad : {"4294967296", "4294967295", "99999999999999999999"}) {
    const std::string sock = dir.path() + "/g.sock";
    ProcGroup g;
    g.start({GRADWIRED_PATH, "--foreground", "--socket", sock, "--group", bad}, clean_env());
    ProcResult r = g.wait_all(10000)[0];
    EXPECT_TRUE(r.exited) << bad << ": " << r.describe();
    EXPECT_EQ(r.exit_code, 1) << bad << ": " << r.describe();
    EXPECT_NE(r.output.find("a group number must be 0..4294967294"), std::string::npos)
        << bad << ": " << r.output;
    EXPECT_NE(::access(sock.c_str(), F_OK), 0) << bad << ": the daemon made its socket";
  }
}

TEST(DaemonIntegration, GradwirectlSaysSoWhenNoDaemonListens) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  ProcResult r = gradwirectl({"status", "--socket", dir.path() + "/none.sock"});
  EXPECT_TRUE(r.exited) << r.describe();
  EXPECT_EQ(r.exit_code, 1) << r.describe();
  EXPECT_NE(r.output.find("no gradwired listens on " + dir.path() + "/none.sock.ctl"),
            std::string::npos)
      << r.output;
  ProcResult usage = gradwirectl({"reboot"});
  EXPECT_EQ(usage.exit_code, 2) << usage.describe();
}

// The service manager's side of sd_notify: a unix datagram socket in `dir`.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& dir) : path_(dir + "/notify.sock") {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path_.c_str());
    if (fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~NotifySocket() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  // Reads datagrams until one contains `needle` (true) or ms pass; every one read is kept.
  bool wait_for(const std::string& needle, int ms) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    for (const auto& m : got_) {
      if (m.find(needle) != std::string::npos) return true;
    }
    while (std::chrono::steady_clock::now() < until) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) continue;
      got_.emplace_back(buf, static_cast<size_t>(n));
      if (got_.back().find(needle) != std::string::npos) return true;
    }
    return false;
  }
  int count(const std::string& needle) const {
    int n = 0;
    for (const auto& m : got_) n += m.find(needle) != std::string::npos;
    return n;
  }
  std::string all() const {
    std::string out;
    for (const auto& m : got_) out += "[" + m + "] ";
    return out;
  }

 private:
  std::string path_;
  int fd_ = -1;
  std::vector<std::string> got_;
};

TEST(DaemonIntegration, SdNotifyReadinessWatchdogAndStopping) {
#if !defined(GW_HAVE_SYSTEMD)
  GTEST_SKIP() << "built without libsystemd (libsystemd-dev): gradwired does not notify";
#endif
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  for (bool watchdog : {false, true}) {
    NotifySocket notify(dir.path());
    ASSERT_TRUE(notify.ok()) << std::strerror(errno);
    Env env = clean_env();
    env["NOTIFY_SOCKET"] = notify.path();
    if (watchdog) env["WATCHDOG_USEC"] = "400000";  // pings every 0.2 s
    const std::string sock = dir.path() + "/n.sock";
    ProcGroup g;
    g.start({GRADWIRED_PATH, "--foreground", "--socket", sock}, env);
    ASSERT_TRUE(notify.wait_for("READY=1", 20000)) << notify.all() << g.output(0);
    // Ready means listening: a trainer's socket and the control socket answer now.
    EXPECT_EQ(gradwirectl({"status", "--socket", sock}).exit_code, 0);
    EXPECT_NE(notify.all().find("STATUS=listening on " + sock), std::string::npos) << notify.all();
    if (watchdog) {
      // Several pings, at about half the period, for as long as it runs: counted over a window
      // timed here, apart from the status call above (whose start-up a loaded machine may slow).
      notify.wait_for("__drain__", 100);
      const int pings0 = notify.count("WATCHDOG=1");
      const auto t0 = std::chrono::steady_clock::now();
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      notify.wait_for("__drain__", 100);
      const auto window = std::chrono::steady_clock::now() - t0;
      const int pings = notify.count("WATCHDOG=1") - pings0;
      EXPECT_GE(pings, 3) << notify.all();
      EXPECT_LE(pings, static_cast<int>(window / std::chrono::milliseconds(200)) + 2)
          << notify.all();
    } else {
      EXPECT_FALSE(notify.wait_for("WATCHDOG=1", 1000)) << notify.all();
    }
    // SIGTERM: STOPPING=1, then it exits 0.
    ASSERT_TRUE(g.wait_for_output(0, "listening", 5000)) << g.output(0);
    std::smatch m;
    const std::string out = g.output(0);
    ASSERT_TRUE(std::regex_search(out, m, std::regex("pid ([0-9]+)")));
    ASSERT_EQ(::kill(std::stoi(m[1]), SIGTERM), 0);
    EXPECT_TRUE(notify.wait_for("STOPPING=1", 10000)) << notify.all();
    auto r = g.wait_all(10000);
    EXPECT_TRUE(r[0].exited && r[0].exit_code == 0) << r[0].describe();
    ::unlink(notify.path().c_str());
  }
}

// GW_DAEMON=auto: the daemon at GW_DAEMON_SOCKET when one answers there (the trainers join it),
// otherwise direct mode with one INFO line saying so.
TEST(DaemonIntegration, AutoUsesTheDaemonWhenOneAnswersElseDirectMode) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);
  ASSERT_TRUE(d.start());
  auto run = [&](const std::string& socket) {
    ProcGroup g;
    const int port = free_port();
    for (int r = 0; r < 2; ++r) {
      Env env = clean_env();
      env["GW_DAEMON"] = "auto";
      env["GW_DAEMON_SOCKET"] = socket;
      env["GW_HOSTID"] = DaemonPair::host(0);
      env["GW_DAEMON_ARENA"] = "16M";
      env["GW_LOG_LEVEL"] = "info";
      g.start({DAEMON_TRAINER_PATH, "--rank", std::to_string(r), "--world", "2", "--timeout-ms",
               std::to_string(kTimeoutMs), "--store", "127.0.0.1:" + std::to_string(port), "suite",
               "100"},
              env);
    }
    return g.wait_all(120000, true);
  };
  auto status = [&] { return json_of(gradwirectl({"status", "--json", "--socket", d.socket(0)})); };
  const int before = status()["accepted"].get<int>();

  // A daemon answers: both trainers are its clients.
  for (const auto& res : run(d.socket(0))) {
    EXPECT_TRUE(res.exited && res.exit_code == 0) << res.describe();
    EXPECT_NE(res.output.find("daemon mode (unix:" + d.socket(0) + ";"), std::string::npos)
        << res.output;
    EXPECT_EQ(res.output.find("GW_DAEMON=auto"), std::string::npos) << res.output;
  }
  EXPECT_EQ(status()["accepted"].get<int>(), before + 2);

  // None answers: direct mode, said once per trainer, and the daemon saw nobody.
  const std::string none = dir.path() + "/none.sock";
  for (const auto& res : run(none)) {
    EXPECT_TRUE(res.exited && res.exit_code == 0) << res.describe();
    const std::string line = "GW_DAEMON=auto: no gradwired answers at " + none;
    const size_t at = res.output.find(line);
    EXPECT_NE(at, std::string::npos) << res.output;
    EXPECT_EQ(res.output.find(line, at + 1), std::string::npos) << "said twice:\n" << res.output;
    EXPECT_NE(res.output.find("direct mode"), std::string::npos) << res.output;
    EXPECT_EQ(res.output.find("daemon mode ("), std::string::npos) << res.output;
  }
  EXPECT_EQ(status()["accepted"].get<int>(), before + 2);
}

// GW_DAEMON_GROUP: the sockets are 0660 and the group's; a peer of another uid gets through when in
// the group (its gid or a supplementary group), and is refused otherwise, by the file's mode and,
// should the mode let it through, by the daemon's own SO_PEERCRED check. Needs root (setpriv).
TEST(DaemonIntegration, AnotherUidIsAcceptedOnlyInTheDaemonsGroup) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run clients as another uid (setpriv)";
  if (::access("/usr/bin/setpriv", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/setpriv";
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);  // nobody may reach the sockets' directory
  // The build tree may sit where only root may enter (a fresh clone under `mktemp -d` is 0700):
  // nobody runs copies of the two programs, with the library beside them.
  namespace fs = std::filesystem;
  const std::string trainer = dir.path() + "/daemon_trainer";
  const std::string gradwirectl = dir.path() + "/gradwirectl";
  for (auto [from, to] : {std::pair<std::string, std::string>{DAEMON_TRAINER_PATH, trainer},
                          {GRADWIRECTL_PATH, gradwirectl},
                          {LIBGRADWIRE_PATH, dir.path() + "/" + LIBGRADWIRE_SONAME}}) {
    std::error_code ec;
    fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
    ASSERT_FALSE(ec) << from << ": " << ec.message();
    fs::permissions(to, fs::perms(0755), ec);
    ASSERT_FALSE(ec) << to << ": " << ec.message();
  }
  // As nobody: gradwirectl, or a trainer (a world of one), with the given groups.
  auto as_nobody = [&](const std::string& gid, const std::string& groups,
                       std::vector<std::string> args, Env env = clean_env()) {
    ProcGroup g;
    std::vector<std::string> argv = {"/usr/bin/setpriv", "--reuid=nobody", "--regid=" + gid};
    if (groups.empty()) {
      argv.push_back("--clear-groups");
    } else {
      argv.push_back("--groups=" + groups);
    }
    argv.insert(argv.end(), args.begin(), args.end());
    g.start(argv, env);
    auto r = g.wait_all(60000);
    return r[0];
  };
  const std::string grouped = dir.path() + "/grouped.sock";
  const std::string plain = dir.path() + "/plain.sock";
  ProcGroup daemons;
  Env denv = clean_env();
  daemons.start({GRADWIRED_PATH, "--foreground", "--socket", grouped, "--group", "nogroup"}, denv);
  daemons.start({GRADWIRED_PATH, "--foreground", "--socket", plain}, denv);
  ASSERT_TRUE(daemons.wait_for_output(0, "listening", 20000)) << daemons.output(0);
  ASSERT_TRUE(daemons.wait_for_output(1, "listening", 20000)) << daemons.output(1);
  for (const std::string& path : {grouped, grouped + ".ctl"}) {
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0660u) << path;
    EXPECT_EQ(st.st_gid, 65534u) << path;  // nogroup
  }
  const std::vector<std::string> ctl = {gradwirectl, "status", "--socket"};
  auto with = [](std::vector<std::string> v, const std::string& s) {
    v.push_back(s);
    return v;
  };
  // In the group by its gid, and by a supplementary group.
  auto r = as_nobody("nogroup", "", with(ctl, grouped));
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  r = as_nobody("daemon", "nogroup", with(ctl, grouped));
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  // A trainer of the group runs its collectives through the daemon.
  Env tenv = clean_env();
  tenv["GW_DAEMON"] = "unix:" + grouped;
  tenv["GW_DAEMON_ARENA"] = "16M";
  tenv["LD_LIBRARY_PATH"] = dir.path();
  r = as_nobody("daemon", "nogroup", {trainer, "--rank", "0", "--world", "1", "suite", "10"}, tenv);
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.describe();
  // Not in the group: the file's mode refuses it.
  r = as_nobody("daemon", "", with(ctl, grouped));
  EXPECT_EQ(r.exit_code, 1) << r.describe();
  EXPECT_NE(r.output.find("ermission denied"), std::string::npos) << r.output;
  // Past the mode (opened to all), the daemon's own check refuses it, and says why.
  ASSERT_EQ(::chmod((grouped + ".ctl").c_str(), 0666), 0);
  r = as_nobody("daemon", "", with(ctl, grouped));
  EXPECT_EQ(r.exit_code, 1) << r.describe();
  EXPECT_NE(r.output.find("not in group nogroup"), std::string::npos) << r.output;
  ASSERT_EQ(::chmod(grouped.c_str(), 0666), 0);
  r = as_nobody("daemon", "", {trainer, "--rank", "0", "--world", "1", "suite", "10"}, tenv);
  EXPECT_NE(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.output.find("not in group nogroup"), std::string::npos) << r.output;
  // Without a group, another uid is refused even in nogroup.
  ASSERT_EQ(::chmod((plain + ".ctl").c_str(), 0666), 0);
  r = as_nobody("nogroup", "", with(ctl, plain));
  EXPECT_EQ(r.exit_code, 1) << r.describe();
  EXPECT_NE(r.output.find("neither the daemon's"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace gw::test
