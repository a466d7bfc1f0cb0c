// A gradwired of the test's own, for the in-process tests that check daemon mode through the C
// ABI: started (--foreground) on a socket in a fresh temporary directory, waited for until its
// control socket is there (up to 10 s; ready() says whether it came), stopped with SIGTERM and its
// files removed (and GW_DAEMON unset, if use() set it) on destruction. Started from the main
// thread, the daemon dies with the test (PR_SET_PDEATHSIG: a test killed by ctest's timeout leaves
// no gradwired behind). Header only; the test passes the daemon's path (GW_GRADWIRED_PATH).
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

namespace gw::testing {

class LocalDaemon {
 public:
  // tmp_prefix: the directory is /tmp/<tmp_prefix>-XXXXXX.
  LocalDaemon(const char* gradwired, const std::string& tmp_prefix) {
    std::string tmpl = "/tmp/" + tmp_prefix + "-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) return;
    dir_ = tmpl;
    socket_ = dir_ + "/s.sock";
    const pid_t parent = ::getpid();
    // Only a child of the main thread: the signal comes when the forking thread ends.
    const bool main_thread = ::gettid() == parent;
    pid_ = ::fork();
    if (pid_ == 0) {
      if (main_thread && (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent)) {
        ::_exit(126);
      }
      ::execl(gradwired, gradwired, "--foreground", "--socket", socket_.c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    for (int i = 0; i < 200 && !ready(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  LocalDaemon(const LocalDaemon&) = delete;
  LocalDaemon& operator=(const LocalDaemon&) = delete;
  ~LocalDaemon() {
    if (used_) ::unsetenv("GW_DAEMON");
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
    if (!dir_.empty()) {
      ::unlink(socket_.c_str());
      ::unlink((socket_ + ".ctl").c_str());
      ::rmdir(dir_.c_str());
    }
  }
  // Whether it came up: its control socket (<socket>.ctl, made once it listens) is there.
  bool ready() const {
    struct stat st {};
    return !socket_.empty() && ::stat((socket_ + ".ctl").c_str(), &st) == 0;
  }
  // Its socket's path ("" when no directory could be made).
  const std::string& socket() const { return socket_; }
  // Its process id (-1 when it was not started).
  pid_t pid() const { return pid_; }
  // Sets GW_DAEMON to it, for this process's communicators, until destruction; false when it has
  // no socket.
  bool use() {
    if (socket_.empty()) return false;
    used_ = ::setenv("GW_DAEMON", ("unix:" + socket_).c_str(), 1) == 0;
    return used_;
  }

 private:
  std::string dir_, socket_;
  pid_t pid_ = -1;
  bool used_ = false;
};

}  // namespace gw::testing
