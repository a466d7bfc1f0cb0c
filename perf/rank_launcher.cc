#include "perf/rank_launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <vector>

#include "core/config.h"
#include "core/core_config.h"

namespace gw::perf {

namespace {

using SteadyClock = std::chrono::steady_clock;

int64_t ms_since(SteadyClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - t).count();
}

struct Child {
  pid_t pid = -1;
  int fd = -1;  // read end of the child's message pipe
  std::string partial;
  bool exited = false;
};

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
  }
  return "stopped";
}

void kill_and_reap(std::vector<Child>& children) {
  for (auto& c : children) {
    if (!c.exited && c.pid > 0) kill(c.pid, SIGKILL);
  }
  for (auto& c : children) {
    if (!c.exited && c.pid > 0) {
      int st = 0;
      while (waitpid(c.pid, &st, 0) < 0 && errno == EINTR) {
      }
      c.exited = true;
    }
  }
}

}  // namespace

std::string run_failure_text(const Status& status, const std::string& first_error) {
  if (first_error.empty()) return status.message();
  if (status.message().find("exited with status") != std::string::npos) return first_error;
  return fmt::format("{}; first error reported: {}", status.message(), first_error);
}

void send_message(int msg_fd, const std::string& line) {
  if (msg_fd < 0) return;
  std::string data = line + "\n";
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    ssize_t n = write(msg_fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // the parent is gone; PR_SET_PDEATHSIG ends us shortly
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

bool launched_by_launcher() {
  if (config::raw(core_config::kRank) || config::raw(core_config::kWorldSize)) return true;
  for (const char* v : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) {
    if (std::getenv(v) != nullptr) return true;
  }
  return false;
}

std::string launcher_rank_text() {
  for (const char* v : {"GW_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) {
    if (const char* r = std::getenv(v)) return fmt::format("rank {} ({})", r, v);
  }
  return "";
}

std::string no_launcher_advice() {
  return "no launcher environment names this process's rank: add --np N to run N ranks on this "
         "machine (e.g. --np 4), or start it under torchrun, mpirun or srun, or set GW_RANK, "
         "GW_WORLD_SIZE and GW_STORE=host:port (rank 0 hosts the store there) on every rank";
}

Result<int> reserve_loopback_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return system_error("socket() for a free port", errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) {
    int err = errno;
    close(fd);
    return system_error("bind(127.0.0.1:0) for a free port", err);
  }
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) < 0) {
    int err = errno;
    close(fd);
    return system_error("getsockname() for a free port", err);
  }
  close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

Status run_forked(const ForkOptions& options, const std::function<int(int rank, int msg_fd)>& body,
                  const std::function<void(int rank, const std::string& line)>& on_message) {
  if (options.nranks < 1) return invalid_arg("--np {}: need at least 1 rank", options.nranks);
  std::vector<Child> children(static_cast<size_t>(options.nranks));
  // Buffered output would be written once by each child as well.
  std::fflush(nullptr);
  std::cout.flush();
  std::cerr.flush();
  pid_t parent = getpid();
  // One CPU per rank when they fit, as mpirun binds ranks to cores by default: two spinning
  // ranks that the scheduler happens to put on one core take turns at timeslice speed (a 4 KiB
  // allreduce over shm then takes ~100 us instead of ~1 us, in some runs and not others).
  std::vector<int> cpus;
  cpu_set_t allowed;
  if (options.bind_cores && sched_getaffinity(0, sizeof(allowed), &allowed) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
    }
    if (static_cast<int>(cpus.size()) < options.nranks) cpus.clear();  // oversubscribed
  }
  for (int r = 0; r < options.nranks; ++r) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) < 0) {
      Status s = system_error("pipe() for a rank's messages", errno);
      kill_and_reap(children);
      return s;
    }
    pid_t pid = fork();
    if (pid < 0) {
      Status s = system_error(fmt::format("fork() of rank {}", r), errno);
      close(fds[0]);
      close(fds[1]);
      kill_and_reap(children);
      return s;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      if (!cpus.empty()) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpus[static_cast<size_t>(r)], &one);
        (void)sched_setaffinity(0, sizeof(one), &one);  // best effort: unbound still works
      }
      for (auto& c : children) {
        if (c.fd >= 0) close(c.fd);
      }
      close(fds[0]);
      int rc = body(r, fds[1]);
      std::fflush(nullptr);
      std::cout.flush();
      std::cerr.flush();
      close(fds[1]);
      _exit(rc);
    }
    close(fds[1]);
    children[static_cast<size_t>(r)].pid = pid;
    children[static_cast<size_t>(r)].fd = fds[0];
  }

  Status result = ok_status();
  bool failing = false;
  auto fail_since = SteadyClock::now();
  auto last_heard = SteadyClock::now();
  size_t running = children.size();
  while (running > 0) {
    std::vector<pollfd> pfds;
    std::vector<size_t> idx;
    for (size_t i = 0; i < children.size(); ++i) {
      if (children[i].fd >= 0) {
        pfds.push_back({children[i].fd, POLLIN, 0});
        idx.push_back(i);
      }
    }
    int n = poll(pfds.data(), pfds.size(), 50);
    if (n < 0 && errno != EINTR) {
      result = system_error("poll() on the ranks' pipes", errno);
      break;
    }
    for (size_t k = 0; n > 0 && k < pfds.size(); ++k) {
      if (!(pfds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Child& c = children[idx[k]];
      char buf[4096];
      ssize_t got = read(c.fd, buf, sizeof(buf));
      if (got > 0) {
        last_heard = SteadyClock::now();
        c.partial.append(buf, static_cast<size_t>(got));
        size_t pos;
        while ((pos = c.partial.find('\n')) != std::string::npos) {
          on_message(static_cast<int>(idx[k]), c.partial.substr(0, pos));
          c.partial.erase(0, pos + 1);
        }
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        close(c.fd);
        c.fd = -1;
      }
    }
    for (size_t i = 0; i < children.size(); ++i) {
      Child& c = children[i];
      if (c.exited) continue;
      int st = 0;
      pid_t w = waitpid(c.pid, &st, WNOHANG);
      if (w != c.pid) continue;
      c.exited = true;
      --running;
      bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
      if (!ok && result.ok()) {
        // Not kInternal: a rank that exits non-zero has printed its own error (a user's mistake
        // as often as not: a bad setting, no daemon), which the caller shows.
        result =
            Status(Code::kPeer, fmt::format("rank {} (pid {}) {}{}", i, c.pid, describe_exit(st),
                                            WIFEXITED(st) ? " (its error is above)" : ""));
        if (!failing) {
          failing = true;
          fail_since = SteadyClock::now();
        }
      }
    }
    if (failing && running > 0 && ms_since(fail_since) > kFailureGraceMs) {
      kill_and_reap(children);
      running = 0;
    }
    if (!failing && running > 0 && ms_since(last_heard) > options.idle_timeout_ms) {
      result = timeout_error("no rank reported progress for {} ms; killed all {} ranks",
                             options.idle_timeout_ms, options.nranks);
      kill_and_reap(children);
      running = 0;
    }
  }
  kill_and_reap(children);
  // Drain what the children wrote before they exited.
  for (size_t i = 0; i < children.size(); ++i) {
    Child& c = children[i];
    if (c.fd < 0) continue;
    char buf[4096];
    ssize_t got;
    while ((got = read(c.fd, buf, sizeof(buf))) > 0)
      c.partial.append(buf, static_cast<size_t>(got));
    size_t pos;
    while ((pos = c.partial.find('\n')) != std::string::npos) {
      on_message(static_cast<int>(i), c.partial.substr(0, pos));
      c.partial.erase(0, pos + 1);
    }
    close(c.fd);
    c.fd = -1;
  }
  return result;
}

}  // namespace gw::perf
