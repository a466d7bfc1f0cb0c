// A process with DPDK in it must finish exiting, however its net_memif peer leaves (issues 28 and
// 32). Pairs of dpdk_exit_peer (one net_memif server, one client, each its own EAL) stop their
// ports and return from main at the same moment, many times; a process still alive 10 s after
// it was told to leave is a hang: its threads' stacks are captured (gdb, else /proc) and the
// test fails with them. Each peer also has EAL's interrupt thread log 0..2 ms after the order to
// leave (dpdk_exit_peer.cc says why). GW_DPDK_EXIT_ROUNDS (a positive count) replaces the 20
// rounds, e.g. to show the hang with an older build in fewer of them.
//
// What used to hang: when both ends stop at once, DPDK 22.11's memif interrupt thread may log
// ("EAL: Error: Invalid memory") while main() is already in exit(). Through EAL's default log
// stream that log took the stream's lock, then, inside syslog's first call, glibc's stream-list
// lock (fopen of /etc/localtime); exit() held the list lock while it flushed every stream, that
// one included, and flushing it called syslog again: each thread waited for the other. EAL now
// logs through a stream of gradwire's own that writes with write(2) (docs/dpdk.md "At exit").
//
// And what used to crash: that "Invalid memory" is the memif PMD freeing its regions twice, its
// interrupt thread (the peer left) and main() (stopping the port) in memif_disconnect at once;
// about one round in 200 it ended in a SIGSEGV in EAL's heap instead. The port is now stopped on
// EAL's interrupt thread (dpdk_port.cc, stop_port), so the two run one after the other: no exit
// may fail, and no peer may log "Invalid memory".
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/shell_run.h"

namespace {

using Clock = std::chrono::steady_clock;
using gw::testing::run_shell;
using gw::testing::slurp;

struct Peer {
  pid_t pid = -1;
  int stdin_fd = -1;  // closing it tells the peer to leave
  std::string out_path;
  int status = 0;
  bool reaped = false;
};

Peer spawn_peer(const std::string& role, const std::string& sock, const std::string& mac,
                int delay_us, const std::string& out_path) {
  const std::string delay = std::to_string(delay_us);
  Peer p;
  p.out_path = out_path;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return p;  // no other peer may hold this one's stdin open
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[0], 0);
    close(fds[0]);
    close(fds[1]);
    FILE* out = std::fopen(out_path.c_str(), "w");
    if (out == nullptr) _exit(120);
    dup2(fileno(out), 1);
    dup2(fileno(out), 2);
    execl(GW_EXIT_PEER, GW_EXIT_PEER, role.c_str(), sock.c_str(), mac.c_str(), delay.c_str(),
          static_cast<char*>(nullptr));
    _exit(121);
  }
  close(fds[0]);
  p.pid = pid;
  p.stdin_fd = fds[1];
  return p;
}

// Whether `p` has ended (reaps it if so).
bool exited(Peer& p) {
  if (!p.reaped && waitpid(p.pid, &p.status, WNOHANG) == p.pid) p.reaped = true;
  return p.reaped;
}

bool said(const Peer& p, const std::string& what) {
  return slurp(p.out_path).find(what) != std::string::npos;
}

// The stacks of every thread of `pid`: gdb's where it can attach, else the kernel's view.
std::string stacks(pid_t pid) {
  std::string out;
  if (run_shell("command -v gdb").rc == 0) {
    out = run_shell("timeout 30 gdb -p " + std::to_string(pid) +
                    " -batch -ex 'thread apply all bt' 2>/dev/null | grep -E '^(Thread|#)'")
              .out;
  }
  if (!out.empty()) return out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const std::string t = dir + "/" + e->d_name;
      out += "thread " + std::string(e->d_name) + " (" + slurp(t + "/comm") + ") wchan " +
             slurp(t + "/wchan") + "\n" + slurp(t + "/stack");
    }
    closedir(d);
  }
  return out;
}

// Waits for `p` until `deadline`; false when it is still alive then.
bool reap(Peer& p, Clock::time_point deadline) {
  while (!exited(p)) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

void kill_and_reap(Peer& p) {
  if (p.stdin_fd >= 0) close(p.stdin_fd);
  p.stdin_fd = -1;
  if (p.pid <= 0 || p.reaped) return;
  kill(p.pid, SIGKILL);
  waitpid(p.pid, &p.status, 0);
  p.reaped = true;
}

// Rounds of kPairs pairs at once; each process has 10 s to exit once told to.
constexpr int kRounds = 20;
constexpr int kPairs = 4;
constexpr auto kExitDeadline = std::chrono::seconds(10);

TEST(DpdkExit, MemifPairsLeavingTogetherNeverHang) {
  char tmpl[] = "/tmp/gw-dpdk-exit-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  int hangs = 0, exits = 0, logged = 0, double_frees = 0;
  const char* env_rounds = std::getenv("GW_DPDK_EXIT_ROUNDS");
  const int rounds = env_rounds != nullptr ? std::atoi(env_rounds) : kRounds;
  ASSERT_GT(rounds, 0) << "GW_DPDK_EXIT_ROUNDS='" << env_rounds << "' is not a positive count";
  // Each process waits 0..2 ms after being told to leave: the two ends' stops then overlap in
  // every order.
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> delay(0, 1999);
  std::string report;
  for (int round = 0; round < rounds; ++round) {
    std::vector<Peer> peers;
    bool started = true;
    for (int k = 0; k < kPairs && started; ++k) {
      const std::string tag = std::to_string(round) + "-" + std::to_string(k);
      const std::string sock = dir + "/" + tag + ".sock";
      // The server first, listening before its client connects: a client that finds no server
      // logs the failed connect, and that first log would make this process's syslog ready
      // before exit (what happens at exit must be its first log, as in a quiet process).
      peers.push_back(
          spawn_peer("server", sock, "02:75:00:00:00:01", delay(rng), dir + "/s" + tag));
      const auto open_by = Clock::now() + std::chrono::seconds(15);
      while (peers.back().pid > 0 && !said(peers.back(), "open") && Clock::now() < open_by &&
             !exited(peers.back())) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      peers.push_back(
          spawn_peer("client", sock, "02:75:00:00:00:02", delay(rng), dir + "/c" + tag));
      started = peers[peers.size() - 2].pid > 0 && peers.back().pid > 0;
    }
    const auto ready_by = Clock::now() + std::chrono::seconds(20);
    for (Peer& p : peers) {
      while (started && !said(p, "ready") && Clock::now() < ready_by && !exited(p)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (!said(p, "ready")) started = false;
    }
    if (!started) {
      std::string out;
      for (Peer& p : peers) {
        kill_and_reap(p);
        out += p.out_path + ":\n" + slurp(p.out_path);
      }
      if (out.find("rte_eal_init") != std::string::npos) {
        GTEST_SKIP() << "DPDK cannot start here: " << out;
      }
      FAIL() << "round " << round << ": a pair did not come up (fork, EAL, link):\n" << out;
    }
    for (Peer& p : peers) {  // every process leaves now
      close(p.stdin_fd);
      p.stdin_fd = -1;
    }
    const auto deadline = Clock::now() + kExitDeadline;
    for (Peer& p : peers) {
      ++exits;
      if (!reap(p, deadline)) {
        ++hangs;
        report += "round " + std::to_string(round) + ": " + p.out_path + " (pid " +
                  std::to_string(p.pid) + ") still running 10 s after leaving:\n" +
                  slurp(p.out_path) + stacks(p.pid) + "\n";
        kill_and_reap(p);
        continue;
      }
      const std::string out = slurp(p.out_path);
      if (out.find("EAL: dpdk_exit_peer: the peer is leaving") != std::string::npos) ++logged;
      if (out.find("Invalid memory") != std::string::npos) {
        ++double_frees;
        ADD_FAILURE() << p.out_path << ": memif freed its regions twice (stop_port):\n" << out;
      }
      EXPECT_TRUE(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0)
          << p.out_path << " status " << p.status << ":\n"
          << out;
    }
  }
  run_shell("rm -rf " + dir);
  std::printf(
      "%d of %d exits hung; in %d, EAL's interrupt thread logged while the process left; %d "
      "logged memif's double free\n",
      hangs, exits, logged, double_frees);
  EXPECT_EQ(hangs, 0) << report;
}

}  // namespace
