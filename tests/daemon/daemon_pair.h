// What the daemon_integration_test binary's files share: two gradwired daemons on this machine
// (two sockets in a temporary directory, two fake hosts) that a test starts trainers under, and
// the Prometheus scrape helpers. Defined inline, one copy for every file.
#pragma once

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
#include <cstdlib>
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

namespace gw::test::daemon_it {

// ms times GW_TEST_TIMEOUT_SCALE (default 1, clamped to 1..10), which scripts/test.sh sets for
// its runs of two tests at once beside a nice-19 sanitizer build: there a 16 MiB collective has
// missed a 6 s deadline at load 9. Every bound these tests assert is stated in kTimeoutMs and
// kSlackMs, so a test keeps checking the same thing at any scale (a fault is reported within the
// trainers' deadline, a refusal well before it), and a hang still reports within the scaled
// deadline, not minutes later.
inline int scaled_ms(int ms) {
  const char* s = std::getenv("GW_TEST_TIMEOUT_SCALE");
  const double f = s != nullptr ? std::strtod(s, nullptr) : 1.0;
  return static_cast<int>(ms * (f >= 1.0 ? (f <= 10.0 ? f : 10.0) : 1.0));
}
inline const int kTimeoutMs = scaled_ms(6000);  // the trainers' --timeout-ms
inline const int kSlackMs = scaled_ms(4000);    // process start-up on a loaded 2-core machine, ASan
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
inline std::string scrape(int port) {
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
inline double sample(const std::string& text, const std::string& metric) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(metric + " ", 0) == 0) return std::stod(line.substr(metric.size() + 1));
  }
  return -1;
}

// The sum of every sample of `metric` whose labels contain each of `labels` (-1 when none).
inline double sum_samples(const std::string& text, const std::string& metric,
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

inline bool eventually(const std::function<bool()>& pred, int ms) {
  for (int i = 0; i < ms / 20; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

}  // namespace gw::test::daemon_it
