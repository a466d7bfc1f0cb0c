// A second network namespace for tests whose peer process must be on another "host": joined to
// this process's namespace by a veth pair with private addresses, 10.78.<a>.<b>/30 (this end .1,
// the namespace's .2; 10.77/10.79 are the testbed's, 10.68/10.70/10.71 the DPDK tests'). Names
// carry this process's PID, so tests running at once (ctest -j) never meet: namespace gwcn<pid>,
// this end gwcn<pid>h, the other gwcn<pid>c, and the subnet starts at the PID's slot and moves to
// the next free one. A peer enters the namespace through ExecChild's `netns` (its path()).
//
// Everything is removed when the object is destroyed. A process killed before that (SIGKILL, a
// crash) leaves its namespace behind: create() first removes those of processes that are gone and
// whose namespace holds no process any more. Needs root and iproute2; create() says why not.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <regex>
#include <sstream>
#include <string>

#include "tests/support/shell_run.h"
#include "tests/support/test_env.h"

namespace gw::testing {

class NetnsLink {
 public:
  // Bytes through this end of the link so far (this process's namespace's /proc/net/dev).
  struct Bytes {
    uint64_t rx = 0;
    uint64_t tx = 0;
  };

  // A new namespace and link for this process, or nullptr with the reason in `why`.
  static std::unique_ptr<NetnsLink> create(std::string* why) {
    if (geteuid() != 0) {
      *why = "needs root (network namespaces)";
      return nullptr;
    }
    if (run_shell("command -v ip").rc != 0) {
      *why = "iproute2 (ip) is not installed";
      return nullptr;
    }
    if (ShellRun r = run_shell("ip netns list"); r.rc != 0) {
      *why = "ip netns does not work here: " + trimmed(r.out);
      return nullptr;
    }
    reap_stale();
    const std::string base = "gwcn" + std::to_string(getpid());
    std::unique_ptr<NetnsLink> l(new NetnsLink(base));
    if (!l->pick_subnet()) {
      *why = "no free /30 in 10.78.0.0/16";
      return nullptr;
    }
    if (ShellRun r = run_shell("ip netns add " + l->ns_); r.rc != 0) {
      *why = "ip netns add failed: " + trimmed(r.out);
      return nullptr;
    }
    l->made_ns_ = true;
    if (ShellRun r = run_shell("ip link add " + l->here_if_ + " type veth peer name " +
                               l->there_if_ + " netns " + l->ns_);
        r.rc != 0) {
      *why = "cannot create a veth pair: " + trimmed(r.out);
      return nullptr;
    }
    l->made_link_ = true;
    ShellRun r =
        run_shell("ip addr add " + l->here_ip_ + "/30 dev " + l->here_if_ + " && ip link set " +
                  l->here_if_ + " up && ip -n " + l->ns_ + " addr add " + l->there_ip_ +
                  "/30 dev " + l->there_if_ + " && ip -n " + l->ns_ + " link set " + l->there_if_ +
                  " up && ip -n " + l->ns_ + " link set lo up");
    if (r.rc != 0) {
      *why = "cannot configure the veth pair: " + trimmed(r.out);
      return nullptr;
    }
    // Transports take only running interfaces (IFF_RUNNING): wait for the carrier on both ends.
    int64_t deadline = now_ms() + 5000;
    while (!(running("ip -o link show dev " + l->here_if_) &&
             running("ip -n " + l->ns_ + " -o link show dev " + l->there_if_))) {
      if (now_ms() > deadline) {
        *why = "the veth pair did not come up within 5 s";
        return nullptr;
      }
      usleep(10000);
    }
    return l;
  }

  ~NetnsLink() {
    // Only in the process that made them (a forked copy that exits must not take them away).
    // Deleting one end deletes the pair; a namespace whose name is gone but which still holds a
    // process (a test's helpers are killed before this) goes when that process ends.
    if (getpid() != creator_) return;
    if (made_link_) run_shell("ip link del " + here_if_);
    if (made_ns_) run_shell("ip netns del " + ns_);
  }
  NetnsLink(const NetnsLink&) = delete;
  NetnsLink& operator=(const NetnsLink&) = delete;

  const std::string& name() const { return ns_; }
  std::string path() const { return "/run/netns/" + ns_; }
  const std::string& here_ifname() const { return here_if_; }
  const std::string& there_ifname() const { return there_if_; }
  const std::string& here_ip() const { return here_ip_; }
  const std::string& there_ip() const { return there_ip_; }

  Bytes here_bytes() const {
    // "  name: rx_bytes packets errs drop fifo frame compressed multicast tx_bytes ..."
    std::istringstream in(slurp("/proc/net/dev"));
    Bytes b;
    for (std::string line; std::getline(in, line);) {
      size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      size_t start = line.find_first_not_of(' ');
      if (line.compare(start, colon - start, here_if_) != 0 || colon - start != here_if_.size()) {
        continue;
      }
      std::istringstream f(line.substr(colon + 1));
      uint64_t v[9] = {};
      for (uint64_t& x : v) f >> x;
      b.rx = v[0];
      b.tx = v[8];
    }
    return b;
  }

 private:
  explicit NetnsLink(const std::string& base)
      : ns_(base), here_if_(base + "h"), there_if_(base + "c") {}

  static std::string trimmed(std::string s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
    return s;
  }

  static bool running(const std::string& cmd) {
    ShellRun r = run_shell(cmd);
    return r.rc == 0 && r.out.find("state UP") != std::string::npos;
  }

  // The first /30 from this PID's slot on whose .1 no interface of this namespace sits.
  bool pick_subnet() {
    const std::string used = run_shell("ip -4 -o addr show").out;
    constexpr int kSlots = 1 << 14;  // 10.78.0.0/16 in /30s
    for (int i = 0; i < kSlots; ++i) {
      int slot = (getpid() + i) % kSlots;
      std::string net = "10.78." + std::to_string(slot / 64) + ".";
      here_ip_ = net + std::to_string(slot % 64 * 4 + 1);
      there_ip_ = net + std::to_string(slot % 64 * 4 + 2);
      if (used.find(" " + net + std::to_string(slot % 64 * 4 + 1) + "/") == std::string::npos &&
          used.find(" " + net + std::to_string(slot % 64 * 4 + 2) + "/") == std::string::npos) {
        return true;
      }
    }
    return false;
  }

  // Namespaces gwcn<pid> (and their links) of processes that are gone, once nothing runs in them.
  static void reap_stale() {
    static const std::regex kName("^gwcn([0-9]+)( .*)?$");
    std::istringstream in(run_shell("ip netns list").out);
    for (std::string line; std::getline(in, line);) {
      std::smatch m;
      if (!std::regex_match(line, m, kName)) continue;
      long pid = std::stol(m[1].str());
      if (pid == getpid() || kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM) continue;
      const std::string ns = "gwcn" + m[1].str();
      if (!run_shell("ip netns pids " + ns).out.empty()) continue;
      run_shell("ip link del " + ns + "h; ip netns del " + ns);
      std::fprintf(stderr, "netns_link: removed %s, left by process %ld which is gone\n",
                   ns.c_str(), pid);
    }
  }

  std::string ns_, here_if_, there_if_, here_ip_, there_ip_;
  pid_t creator_ = getpid();
  bool made_ns_ = false;
  bool made_link_ = false;
};

}  // namespace gw::testing
