// Two "hosts" on one machine for the daemon-mode tests: two gradwired of the test's own, each
// with a host identity of its own (GW_HOSTID), and trainers started as children of this test
// binary (exec'd afresh, as ExecChild does: the environment is built before fork, so nothing
// allocates between fork and exec), rank r on host r % 2 through that host's daemon. A trainer
// finds its place (rank, world, the job's store) with trainer_place(). Header only; the test
// passes the daemon's path (GW_GRADWIRED_PATH).
#pragma once

#include <sys/prctl.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/exec_child.h"
#include "tests/support/free_port.h"
#include "tests/support/local_daemon.h"
#include "tests/support/test_env.h"

namespace gw::testing {

// What a trainer started by TwoHosts::start reads: its rank, the world and the store's address.
inline constexpr const char* kTrainerRankEnv = "GW_TT_RANK";
inline constexpr const char* kTrainerWorldEnv = "GW_TT_WORLD";
inline constexpr const char* kTrainerStoreEnv = "GW_TT_STORE";

struct TrainerPlace {
  int rank = 0;
  int world = 0;
  std::string store;
};

// In a trainer started by TwoHosts::start: its place; elsewhere nothing (the case then skips).
inline std::optional<TrainerPlace> trainer_place() {
  const char* rank = std::getenv(kTrainerRankEnv);
  const char* world = std::getenv(kTrainerWorldEnv);
  const char* store = std::getenv(kTrainerStoreEnv);
  if (rank == nullptr || world == nullptr || store == nullptr) return std::nullopt;
  return TrainerPlace{std::atoi(rank), std::atoi(world), store};
}

class TwoHosts;
inline std::vector<pid_t> start_trainers(const std::string& gtest_filter, int world,
                                         const std::array<std::string, 2>& hosts,
                                         const std::vector<std::string>& env,
                                         const TwoHosts* daemons);

class TwoHosts {
 public:
  // hosts: the two identities; tmp_prefix: the daemons' directories /tmp/<tmp_prefix>-a-XXXXXX
  // and -b-. env ("NAME=value"): daemon b's environment, and daemon a's too when env_both.
  TwoHosts(const char* gradwired, const std::string& tmp_prefix, std::array<std::string, 2> hosts,
           const std::vector<std::string>& env = {}, bool env_both = false)
      : hosts_(std::move(hosts)) {
    std::vector<std::pair<std::string, std::string>> vars;  // (name, value): ScopedEnv keeps
    for (const std::string& e : env) {                      // pointers to the names
      const size_t eq = e.find('=');
      vars.emplace_back(e.substr(0, eq), eq == std::string::npos ? "" : e.substr(eq + 1));
    }
    for (int h = 0; h < 2; ++h) {
      std::vector<std::unique_ptr<ScopedEnv>> set;
      set.push_back(std::make_unique<ScopedEnv>("GW_HOSTID", hosts_[h].c_str()));
      if (h == 1 || env_both) {
        for (const auto& [name, value] : vars) {
          set.push_back(std::make_unique<ScopedEnv>(name.c_str(), value.c_str()));
        }
      }
      daemons_[h] = std::make_unique<LocalDaemon>(gradwired, tmp_prefix + (h == 0 ? "-a" : "-b"));
    }
  }

  bool ready() const { return daemons_[0]->ready() && daemons_[1]->ready(); }
  const LocalDaemon& daemon(int host) const { return *daemons_[host]; }
  const std::string& host(int h) const { return hosts_[h]; }

  // Starts `world` trainers on the two hosts through their daemons (start_trainers).
  std::vector<pid_t> start(const std::string& gtest_filter, int world,
                           const std::vector<std::string>& env = {}) const {
    return start_trainers(gtest_filter, world, hosts_, env, this);
  }
  // Stops host h's daemon (SIGTERM) and waits for it to exit.
  void stop(int host) { daemons_[host].reset(); }

 private:
  std::array<std::string, 2> hosts_;
  std::array<std::unique_ptr<LocalDaemon>, 2> daemons_;
};

// Starts `world` trainers: this binary running `gtest_filter`, rank r with GW_HOSTID hosts[r % 2],
// the trainer place (a store on a free port of 127.0.0.1) and `env` ("NAME=value", replacing a
// variable of this process's environment); GW_DAEMON host r % 2's daemon of `daemons`, or unset
// (direct mode) when `daemons` is null. Reap them with reap_within or waitpid.
inline std::vector<pid_t> start_trainers(const std::string& gtest_filter, int world,
                                         const std::array<std::string, 2>& hosts,
                                         const std::vector<std::string>& env,
                                         const TwoHosts* daemons) {
  const std::string store = "127.0.0.1:" + std::to_string(free_port());
  std::string exe = "/proc/self/exe", filter = "--gtest_filter=" + gtest_filter;
  std::vector<pid_t> kids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> all = env;
    all.push_back("GW_HOSTID=" + hosts[r % 2]);
    all.push_back(std::string(kTrainerRankEnv) + "=" + std::to_string(r));
    all.push_back(std::string(kTrainerWorldEnv) + "=" + std::to_string(world));
    all.push_back(std::string(kTrainerStoreEnv) + "=" + store);
    if (daemons != nullptr) all.push_back("GW_DAEMON=unix:" + daemons->daemon(r % 2).socket());
    all =
        environment_with(std::move(all), daemons == nullptr ? std::vector<std::string>{"GW_DAEMON"}
                                                            : std::vector<std::string>{});
    std::vector<char*> envp;
    for (std::string& e : all) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<char*> argv = {exe.data(), filter.data(), nullptr};
    const pid_t parent = ::getpid();
    // Only a child of the main thread: the signal comes when the forking thread ends.
    const bool main_thread = ::gettid() == parent;
    const pid_t pid = ::fork();  // everything is built first: nothing allocates until exec
    if (pid == 0) {
      if (main_thread && (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent)) {
        ::_exit(126);
      }
      ::execve(exe.c_str(), argv.data(), envp.data());
      ::_exit(127);
    }
    kids.push_back(pid);
  }
  return kids;
}

}  // namespace gw::testing
