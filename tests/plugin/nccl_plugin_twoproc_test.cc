// The plugin between two processes, as between two NCCL ranks: this process is rank 0, a forked
// and exec'd nccl_plugin_peer is rank 1; the 128-byte handles travel through pipes, the data
// through the plugin over loopback.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "tests/plugin/plugin_harness.h"

namespace gw::plugin_test {
namespace {

// Kills and reaps the child if the test ends early.
class Child {
 public:
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid_ = -1;
  // Exit status, or -1 when it crashed or did not finish in time (then it is killed).
  int wait(int deadline_s) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(deadline_s);
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) return -1;  // destructor kills it
      usleep(10000);
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
};

TEST(PluginTwoProcesses, ExchangeSizesAndBurstsBothWays) {
  plugin();  // load (and set the loopback environment) before forking
  int to_child[2], from_child[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(from_child), 0);
  std::string path = GW_PLUGIN_PEER_PATH;
  std::vector<char*> argv = {path.data(), const_cast<char*>("exchange"), const_cast<char*>("1"),
                             nullptr};
  Child child;
  child.pid_ = fork();
  ASSERT_GE(child.pid_, 0);
  if (child.pid_ == 0) {
    dup2(to_child[0], STDIN_FILENO);
    dup2(from_child[1], STDOUT_FILENO);
    close(to_child[1]);
    close(from_child[0]);
    execv(path.c_str(), argv.data());
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  signal(SIGPIPE, SIG_IGN);
  auto api = make_api("v11");
  Error e = exchange_with_peer(*api, from_child[0], to_child[1], 0);
  close(to_child[1]);
  close(from_child[0]);
  const int child_rc = child.wait(60);
  // Two hosts over dpdk (GW_PLUGIN_TEST_XHOST_TRANSPORT=dpdk): EAL refused here, or the daemons
  // really ran their DPDK engines.
  if (e != "" && !dpdk_cannot_start().empty()) {
    GTEST_SKIP() << "DPDK cannot start here: " << dpdk_cannot_start();
  }
  EXPECT_EQ(e, "");
  EXPECT_EQ(child_rc, 0) << "the peer process failed (its reason is on stderr)";
  EXPECT_EQ(xhost_went_over_dpdk(), "");
}

}  // namespace
}  // namespace gw::plugin_test
