// Stopping gradwired while its job meets the job's other daemons (issue 33 item 3): the peer
// daemon is SIGSTOPped right after it has published its transports, so this daemon's set-up waits
// on the store and on connections that will never come; SIGTERM must end those waits within about
// a second, whatever timeout the trainers asked for, and the trainer gets a clear error rather
// than its own timeout.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/daemon/daemon_pair.h"
#include "tests/integration/proc_harness.h"

namespace gw::test {
namespace {

using namespace ::gw::test::daemon_it;

// Whether process `pid` (a child of the harness) has exited: gone, or a zombie not reaped yet.
bool exited(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(f, stat)) return true;
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] == 'Z';
}

// The trainers' timeout: far longer than the stop may take, so waiting it out shows.
constexpr int kTrainerTimeoutMs = 20000;
constexpr const char* kOffered = "): offered ";  // daemon/job.cc's line once its offer is out
constexpr int kStopWithinMs = 3000;  // about 1 s asked; the rest is a loaded machine's slack

TEST(DaemonStop, SigtermEndsTheSetUpWithTheOtherDaemonsAtOnce) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);
  ASSERT_TRUE(d.start());
  // Daemon A is held (SIGSTOP) while daemon B's job starts, so B publishes its transports and then
  // waits for A's; B is stopped there, and A let go: A's set-up then meets a daemon that has
  // offered but never answers again.
  ASSERT_EQ(::kill(d.pid(0), SIGSTOP), 0);
  ProcGroup g;
  const int port = free_port();
  const std::vector<std::string> args = {"--timeout-ms", std::to_string(kTrainerTimeoutMs), "loop"};
  for (int r = 0; r < 2; ++r) d.start_trainer(g, r, 2, port, args);
  const bool b_offered = d.daemon_said(1, kOffered, 20000);
  ASSERT_EQ(::kill(d.pid(1), SIGSTOP), 0);
  ASSERT_EQ(::kill(d.pid(0), SIGCONT), 0);
  ASSERT_TRUE(b_offered) << d.daemon_output(1);
  ASSERT_TRUE(d.daemon_said(0, kOffered, 20000)) << d.daemon_output(0);
  // Rank 0's first allreduce waits in A, and A in its communicator's set-up with the stopped B.
  ASSERT_TRUE(g.wait_for_output(0, "LOOPING", 20000)) << g.output(0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_FALSE(exited(d.pid(0)));
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(d.pid(0), SIGTERM), 0);
  EXPECT_TRUE(eventually([&] { return exited(d.pid(0)); }, kTrainerTimeoutMs + kSlackMs));
  const auto stop_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  std::printf("SIGTERM to exit: %lld ms\n", static_cast<long long>(stop_ms));
  EXPECT_LT(stop_ms, kStopWithinMs) << "SIGTERM took " << stop_ms << " ms:\n" << d.daemon_output(0);
  // Rank 0 (on A) fails at once, saying that its daemon stopped; not at its timeout.
  ASSERT_TRUE(g.wait_for_output(0, "RESULT", kStopWithinMs + kSlackMs)) << g.output(0);
  const std::string out = g.output(0);
  EXPECT_NE(out.find("gradwired is stopping"), std::string::npos) << out;
  EXPECT_EQ(out.find("within"), std::string::npos) << out;
  auto fields = parse_tagged_line(out, "RESULT");
  ASSERT_TRUE(fields.has_value()) << out;
  EXPECT_EQ((*fields)["status"], std::to_string(kGwErrPeer)) << out;
  ::kill(d.pid(1), SIGKILL);  // the ProcGroups reap both daemons and rank 1
}

}  // namespace
}  // namespace gw::test
