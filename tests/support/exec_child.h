// Helper processes for tests that need a peer in another process: this test binary started
// afresh (fork, then exec at once) running one case that exists only in such a process.
//
// Why not fork and go on running: the child of a threaded process inherits every lock some other
// thread held at fork time. Under AddressSanitizer (GCC 12's runtime does not lock its allocator
// around fork) a thread of the parent inside malloc at that moment - the emulated NIC's, the verbs
// event thread, a thread just starting - left the allocator's lock held for good in the child,
// whose own threads then hung at start. After exec the child has a fresh runtime.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/test_env.h"

namespace gw::testing {

// The environment variable that names the case a helper process runs.
inline constexpr const char* kChildCaseEnv = "GW_TEST_CHILD_CASE";

// Registers `suite`.`name` with `body` (its exit code is the process's) only in a helper process
// started to run it; elsewhere the case does not exist. Call at namespace scope:
//   const bool kRegistered = register_child_case("PeerChild", "Listen", [] { ...; return 0; });
inline bool register_child_case(const char* suite, const char* name, std::function<int()> body) {
  const char* want = std::getenv(kChildCaseEnv);
  if (want == nullptr || std::string(suite) + "." + name != want) return false;
  class Case : public ::testing::Test {
   public:
    explicit Case(std::function<int()> b) : body_(std::move(b)) {}
    void TestBody() override { _exit(body_()); }

   private:
    std::function<int()> body_;
  };
  ::testing::RegisterTest(suite, name, nullptr, nullptr, __FILE__, __LINE__,
                          [body]() -> ::testing::Test* { return new Case(body); });
  return true;
}

// This process's environment with `env` ("NAME=value") in it, each replacing the variable of
// its name, less the variables named in `drop`: the environment of a child to exec.
inline std::vector<std::string> environment_with(std::vector<std::string> env,
                                                 const std::vector<std::string>& drop = {}) {
  auto named = [](const std::vector<std::string>& list, const char* e, bool with_value) {
    for (const std::string& a : list) {
      const size_t n = with_value ? a.find('=') : a.size();
      if (n != std::string::npos && std::strncmp(e, a.c_str(), n) == 0 && e[n] == '=') return true;
    }
    return false;
  };
  std::vector<std::string> own;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!named(env, *e, true) && !named(drop, *e, false)) own.emplace_back(*e);
  }
  env.insert(env.end(), own.begin(), own.end());
  return env;
}

// A helper process running case `suite_dot_name` (registered with register_child_case) with
// `env` ("NAME=value") added to this process's environment, replacing a variable of the same
// name; descriptors without close-on-exec stay open in it. With `netns` (a path such as
// /run/netns/<name>) it runs in that network namespace, entered between fork and exec (exit
// code 126 when it cannot be). Killed and reaped on destruction, so a failing test leaves
// nothing behind.
class ExecChild {
 public:
  ExecChild(const std::string& suite_dot_name, const std::vector<std::string>& env = {},
            const std::string& netns = "") {
    std::vector<std::string> all = env;
    all.push_back(std::string(kChildCaseEnv) + "=" + suite_dot_name);
    all = environment_with(std::move(all));
    std::vector<char*> envp;
    for (std::string& e : all) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe", filter = "--gtest_filter=" + suite_dot_name;
    std::vector<char*> argv = {exe.data(), filter.data(), nullptr};
    int ns_fd = netns.empty() ? -1 : open(netns.c_str(), O_RDONLY | O_CLOEXEC);
    const pid_t parent = getpid();
    // Only a child of the main thread: the signal comes when the forking thread ends.
    const bool main_thread = gettid() == parent;
    pid_ = fork();  // everything above is built first: between fork and exec nothing allocates
    if (pid_ == 0) {
      // The child dies with the test (a test killed by ctest's timeout leaves no child behind).
      if (main_thread && (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)) {
        _exit(126);
      }
      if (!netns.empty() && (ns_fd < 0 || setns(ns_fd, CLONE_NEWNET) != 0)) _exit(126);
      execve(exe.c_str(), argv.data(), envp.data());
      _exit(127);
    }
    if (ns_fd >= 0) close(ns_fd);
  }
  ExecChild(const ExecChild&) = delete;
  ExecChild& operator=(const ExecChild&) = delete;
  ~ExecChild() { kill_now(); }

  pid_t pid() const { return pid_; }
  bool started() const { return pid_ > 0; }

  void kill_now() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // The exit code, or -1 when it did not exit normally within `ms` (it is killed then).
  int wait(int64_t ms) {
    int64_t deadline = now_ms() + ms;
    while (pid_ > 0 && now_ms() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      usleep(1000);
    }
    kill_now();
    return -1;
  }

 private:
  pid_t pid_ = -1;
};

// Reaps `pids` (children of this process, started by the test itself) in order, all within
// `seconds` together; each must exit 0. Past the deadline every one is killed and the one waited
// for fails the test as "<what> <index> still running after <seconds> s".
inline void reap_within(const std::vector<pid_t>& pids, int seconds, const char* what) {
  const int64_t deadline = now_ms() + int64_t{seconds} * 1000;
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = -1;
    while (waitpid(pids[i], &status, WNOHANG) == 0) {
      if (now_ms() > deadline) {
        for (pid_t p : pids) kill(p, SIGKILL);
        ADD_FAILURE() << what << " " << i << " still running after " << seconds << " s";
        waitpid(pids[i], &status, 0);
        break;
      }
      usleep(20 * 1000);
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << what << " " << i << " status " << status;
  }
}

// The value of environment variable `name`, or "" when unset.
inline std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

}  // namespace gw::testing
