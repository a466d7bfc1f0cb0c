// Helper processes for tests that need a peer in another process: this test binary started
// afresh (fork, then exec at once) running one case that exists only in such a process.
//
// Why not fork and go on running: the child of a threaded process inherits every lock some other
// thread held at fork time. Under AddressSanitizer (GCC 12's runtime does not lock its allocator
// around fork) a thread of the parent inside malloc at that moment - the emulated NIC's, the verbs
// event thread, a thread just starting - left the allocator's lock held for good in the child,
// whose own threads then hung at start. After exec the child has a fresh runtime.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

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

// A helper process running case `suite_dot_name` (registered with register_child_case) with
// `env` ("NAME=value") added to this process's environment; descriptors without close-on-exec
// stay open in it. Killed and reaped on destruction, so a failing test leaves nothing behind.
class ExecChild {
 public:
  ExecChild(const std::string& suite_dot_name, const std::vector<std::string>& env = {}) {
    std::vector<std::string> all;
    for (char** e = environ; *e != nullptr; ++e) all.emplace_back(*e);
    all.push_back(std::string(kChildCaseEnv) + "=" + suite_dot_name);
    all.insert(all.end(), env.begin(), env.end());
    std::vector<char*> envp;
    for (std::string& e : all) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe", filter = "--gtest_filter=" + suite_dot_name;
    std::vector<char*> argv = {exe.data(), filter.data(), nullptr};
    pid_ = fork();  // everything above is built first: between fork and exec nothing allocates
    if (pid_ == 0) {
      execve(exe.c_str(), argv.data(), envp.data());
      _exit(127);
    }
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

// The value of environment variable `name`, or "" when unset.
inline std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

}  // namespace gw::testing
