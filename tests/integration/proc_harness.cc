#include "tests/integration/proc_harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace gw::test {

namespace {

using SteadyClock = std::chrono::steady_clock;

double ms_between(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

bool launcher_var(const std::string& name) {
  static const char* kExact[] = {"RANK",       "WORLD_SIZE", "LOCAL_RANK",  "LOCAL_WORLD_SIZE",
                                 "GROUP_RANK", "ROLE_RANK",  "MASTER_ADDR", "MASTER_PORT",
                                 "NCCL_HOSTID"};
  for (const char* e : kExact) {
    if (name == e) return true;
  }
  static const char* kPrefix[] = {"GW_", "OMPI_", "PMIX_", "SLURM_", "TORCHELASTIC_"};
  for (const char* p : kPrefix) {
    if (name.rfind(p, 0) == 0) return true;
  }
  return false;
}

}  // namespace

struct ProcGroup::Proc {
  pid_t pid = -1;
  int fd = -1;
  SteadyClock::time_point started;
  ProcResult result;
  bool done = false;
};

std::string ProcResult::describe() const {
  std::ostringstream os;
  os << "pid " << pid << ": ";
  if (timed_out) os << "killed at the deadline; ";
  if (exited) os << "exit code " << exit_code;
  if (signal) os << "killed by signal " << signal << " (" << strsignal(signal) << ")";
  os << ", " << static_cast<int64_t>(elapsed_ms) << " ms, output:\n" << output;
  return os.str();
}

Env clean_env() {
  Env env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    std::string name = kv.substr(0, eq);
    if (!launcher_var(name)) env[name] = kv.substr(eq + 1);
  }
  return env;
}

ProcGroup::~ProcGroup() {
  kill_all();
  for (Proc* p : procs_) {
    if (p->fd >= 0) close(p->fd);
    delete p;
  }
}

void ProcGroup::kill_all() {
  for (Proc* p : procs_) {
    if (p->done || p->pid <= 0) continue;
    kill(-p->pid, SIGKILL);  // its process group: mpirun's ranks too
    kill(p->pid, SIGKILL);
    int st = 0;
    while (waitpid(p->pid, &st, 0) < 0 && errno == EINTR) {
    }
    p->done = true;
    p->result.timed_out = true;
    p->result.signal = SIGKILL;
  }
}

size_t ProcGroup::start(const std::vector<std::string>& argv, const Env& env) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) < 0) throw std::runtime_error("pipe2 failed");
  std::vector<std::string> envs;
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (auto& e : envs) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  auto* p = new Proc;
  p->started = SteadyClock::now();
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    delete p;
    throw std::runtime_error("fork failed");
  }
  if (pid == 0) {
    setpgid(0, 0);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    execve(cargv[0], cargv.data(), cenv.data());
    dprintf(STDERR_FILENO, "execve(%s) failed: %s\n", cargv[0], strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);  // both sides, so kill(-pid) works whoever runs first
  close(fds[1]);
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  p->pid = pid;
  p->fd = fds[0];
  p->result.pid = pid;
  procs_.push_back(p);
  return procs_.size() - 1;
}

bool ProcGroup::wait_for_output(size_t index, const std::string& needle, int64_t deadline_ms) {
  Proc* p = procs_.at(index);
  auto start = SteadyClock::now();
  while (ms_between(start, SteadyClock::now()) < static_cast<double>(deadline_ms)) {
    char buf[4096];
    ssize_t n;
    while ((n = read(p->fd, buf, sizeof(buf))) > 0)
      p->result.output.append(buf, static_cast<size_t>(n));
    if (p->result.output.find(needle) != std::string::npos) return true;
    if (n == 0) return false;  // EOF: it exited without printing the needle
    pollfd pfd{p->fd, POLLIN, 0};
    poll(&pfd, 1, 20);
  }
  return false;
}

std::string ProcGroup::output(size_t index) const { return procs_.at(index)->result.output; }

std::vector<ProcResult> ProcGroup::wait_all(int64_t deadline_ms, bool kill_on_failure,
                                            int64_t grace_ms) {
  auto start = SteadyClock::now();
  bool failing = false;
  SteadyClock::time_point fail_at;
  auto drain = [](Proc* p) {
    char buf[4096];
    ssize_t n;
    while (p->fd >= 0 && (n = read(p->fd, buf, sizeof(buf))) > 0) {
      p->result.output.append(buf, static_cast<size_t>(n));
    }
  };
  while (true) {
    std::vector<pollfd> pfds;
    for (Proc* p : procs_) {
      if (p->fd >= 0 && !p->done) pfds.push_back({p->fd, POLLIN, 0});
    }
    if (!pfds.empty()) poll(pfds.data(), pfds.size(), 20);
    size_t running = 0;
    for (Proc* p : procs_) {
      drain(p);
      if (p->done) continue;
      int st = 0;
      if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
        p->done = true;
        p->result.elapsed_ms = ms_between(p->started, SteadyClock::now());
        if (WIFEXITED(st)) {
          p->result.exited = true;
          p->result.exit_code = WEXITSTATUS(st);
        } else if (WIFSIGNALED(st)) {
          p->result.signal = WTERMSIG(st);
        }
        if (!(p->result.exited && p->result.exit_code == 0) && !failing) {
          failing = true;
          fail_at = SteadyClock::now();
        }
        // Leftovers of its process group (mpirun's ranks) must not outlive it.
        kill(-p->pid, SIGKILL);
      } else {
        ++running;
      }
    }
    if (running == 0) break;
    auto now = SteadyClock::now();
    if (ms_between(start, now) > static_cast<double>(deadline_ms) ||
        (kill_on_failure && failing && ms_between(fail_at, now) > static_cast<double>(grace_ms))) {
      for (Proc* p : procs_) {
        if (!p->done) p->result.elapsed_ms = ms_between(p->started, now);
      }
      kill_all();
      break;
    }
  }
  std::vector<ProcResult> out;
  for (Proc* p : procs_) {
    drain(p);
    out.push_back(p->result);
  }
  return out;
}

std::optional<std::map<std::string, std::string>> parse_tagged_line(
    const std::string& output, const std::string& tag, const std::string& must_contain) {
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(tag + " ", 0) != 0) continue;
    if (!must_contain.empty() && line.find(must_contain) == std::string::npos) continue;
    std::map<std::string, std::string> fields;
    std::istringstream words(line.substr(tag.size() + 1));
    std::string w;
    while (words >> w) {
      auto eq = w.find('=');
      if (eq != std::string::npos) fields[w.substr(0, eq)] = w.substr(eq + 1);
    }
    return fields;
  }
  return std::nullopt;
}

}  // namespace gw::test
