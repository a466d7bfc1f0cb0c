// Two gradwired daemons on this machine (daemon_pair.h) asked and driven from outside: gradwirectl
// describing a daemon, its job and its trainers (tables and JSON) or finding none; sd_notify
// readiness, watchdog and stopping on a NOTIFY_SOCKET the test owns; GW_DAEMON=auto; a trainer of
// another uid. Part of the daemon_integration_test binary.
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

#include "tests/daemon/daemon_pair.h"
#include "tests/integration/proc_harness.h"

namespace gw::test {
namespace {

using namespace ::gw::test::daemon_it;

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

// A daemon given a DPDK port brings it up at its start and gradwirectl status says how that went
// ("starting", then "open: <port> in N ms"; its link is logged apart); one without a port says it
// offers no dpdk. A port that fails (EAL refuses its arguments) is "failed: <reason>": under auto
// the daemon then offers its jobs tcp alone (the status's transport), while one told dpdk by name
// keeps offering it (its jobs fail with the reason).
TEST(DaemonIntegration, GradwirectlStatusShowsTheDaemonsDpdkPort) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string eal =
      "-l 0 --no-huge -m 512 --no-pci --no-shconf --no-telemetry --log-level=*:error";
  const std::vector<std::string> sock = {dir.path() + "/p.sock", dir.path() + "/n.sock",
                                         dir.path() + "/f.sock", dir.path() + "/d.sock"};
  ProcGroup daemons;
  for (int i = 0; i < 4; ++i) {
    Env env = clean_env();
    env["GW_DPDK_IP"] = "10.74.0.1";
    if (i == 0) {
      env["GW_DPDK_EAL_ARGS"] = eal + " --vdev net_memif0,id=0,socket=/gw-daemon-status-" +
                                std::to_string(getpid()) + ".sock,role=server";
    } else if (i >= 2) {
      env["GW_DPDK_EAL_ARGS"] = eal + " --no-such-eal-flag";
    }
    std::vector<std::string> argv = {GRADWIRED_PATH, "--foreground", "--socket", sock[i]};
    if (i == 3) argv.insert(argv.end(), {"--transport", "dpdk"});
    daemons.start(argv, env);
  }
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(daemons.wait_for_output(i, "listening", 20000)) << daemons.output(i);
  }
  // The status of daemon i once its port is no longer starting.
  auto settled = [&](int i) {
    nlohmann::json st;
    const bool done = eventually(
        [&] {
          st = json_of(gradwirectl({"status", "--json", "--socket", sock[i]}));
          return st.is_object() && st["dpdk_port"].is_string() && st["dpdk_port"] != "starting";
        },
        30000);
    EXPECT_TRUE(done) << i << ": " << st;
    return st;
  };
  const nlohmann::json up = settled(0);
  const std::string port = up.value("dpdk_port", "");
  if (port.find("rte_eal_init") != std::string::npos) GTEST_SKIP() << "no DPDK here: " << port;
  EXPECT_TRUE(std::regex_search(port, std::regex("^open: net_memif0 .* in [0-9]+ ms$"))) << port;
  EXPECT_EQ(up["transport"], "dpdk,tcp") << up;
  ProcResult table = gradwirectl({"status", "--socket", sock[0]});
  EXPECT_TRUE(std::regex_search(table.output, std::regex("\\ndpdk port +open: net_memif0 ")))
      << table.output;
  const nlohmann::json none = settled(1);
  EXPECT_EQ(none["dpdk_port"], "none: this daemon offers no dpdk") << none;
  EXPECT_EQ(none["transport"], "tcp") << none;
  for (int i : {2, 3}) {
    const nlohmann::json failed = settled(i);
    EXPECT_EQ(failed.value("dpdk_port", "").rfind("failed: dpdk: rte_eal_init(", 0), 0u) << failed;
    EXPECT_EQ(failed["transport"], i == 2 ? "tcp" : "dpdk") << failed;
  }
  EXPECT_TRUE(daemons.wait_for_output(2, "jobs starting from now are offered the rest", 5000))
      << daemons.output(2);
  EXPECT_TRUE(daemons.wait_for_output(3, "a job whose daemons agree on dpdk fails with this", 5000))
      << daemons.output(3);
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

// gradwired says once that it listens (stdout and its INFO log together, as a terminal or the
// journal shows them), with its host, pid and the transports it offers other daemons.
TEST(DaemonIntegration, SaysOnceThatItListens) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);  // GW_LOG_LEVEL=info
  ASSERT_TRUE(d.start());
  for (int h = 0; h < 2; ++h) {
    // Once the control socket answers, the serve loop runs: whatever it logs first is out.
    ASSERT_EQ(gradwirectl({"status", "--socket", d.socket(h)}).exit_code, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // its output read here too
    const std::string out = d.daemon_output(h);
    int lines = 0;
    for (size_t at = out.find("listening on"); at != std::string::npos;
         at = out.find("listening on", at + 1)) {
      ++lines;
    }
    EXPECT_EQ(lines, 1) << out;
    EXPECT_TRUE(std::regex_search(
        out,
        std::regex("gradwired: listening on " + d.socket(h) + " \\(host " + DaemonPair::host(h) +
                   ", pid [0-9]+\\); between daemons: auto offers [a-z,]+")))
        << out;
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
