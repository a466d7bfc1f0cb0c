#include "core/sys/fd.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "core/log.h"

namespace gw::sys {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Status set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return system_error("fcntl(O_NONBLOCK)", errno);
  }
  return ok_status();
}

void raise_descriptor_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      GW_LOG_DEBUG("descriptor limit raised from {} to {}", rl.rlim_cur, rl.rlim_max);
    }
  }
}

AcceptShedder::AcceptShedder(int64_t backoff_ms)
    : spare_(::open("/dev/null", O_RDONLY | O_CLOEXEC)), backoff_ns_(backoff_ms * 1000000) {}

void AcceptShedder::take_spare() {
  if (!spare_.valid()) spare_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
}

void AcceptShedder::shed(int listen_fd, int64_t now_ns) {
  ++shed_count_;
  if (spare_.valid()) {
    spare_.reset();
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) ::close(fd);
  }
  take_spare();
  paused_until_ns_ = now_ns + backoff_ns_;
}

}  // namespace gw::sys
